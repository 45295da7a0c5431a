"""Plugin framework: entry-point discovery, pinning, and isolation of broken plugins."""

from __future__ import annotations

import importlib.metadata
import types

import pytest

import cosyvino
from cosyvino import plugins
from cosyvino.backends import Backend
from cosyvino.errors import BackendError


@pytest.fixture(autouse=True)
def fresh_manager():
    plugins._reset_for_tests()
    yield
    plugins._reset_for_tests()


def test_builtin_torch_backend_comes_from_entry_point():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="cosyvino")}
    assert eps.get("torch") == "cosyvino_torch"
    cls = plugins.get_backend("torch")
    assert issubclass(cls, Backend) and cls.name == "torch"


def test_unknown_backend_lists_installed():
    with pytest.raises(BackendError, match="installed backends: .*torch"):
        plugins.get_backend("no-such-backend")


def test_pinning_to_no_plugins(monkeypatch):
    monkeypatch.setenv("COSYVINO_PLUGINS", "")
    assert plugins.backend_classes() == {}


class _FakeEP:
    def __init__(self, name, loader):
        self.name, self.value, self._loader = name, f"fake:{name}", loader

    def load(self):
        return self._loader()


def _install_fake_eps(monkeypatch, eps):
    real = importlib.metadata.entry_points

    def fake(group=None, **kw):
        found = list(real(group=group, **kw)) if group else []
        return found + list(eps) if group == "cosyvino" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setenv("COSYVINO_PLUGINS", "torch," + ",".join(e.name for e in eps))


def test_broken_plugins_are_reported_and_skipped(monkeypatch):
    def boom():
        raise RuntimeError("plugin import exploded")

    bad_register = types.ModuleType("bad_register")

    @cosyvino.hookimpl
    def register_backends(register):
        register(object)  # not a Backend subclass

    bad_register.register_backends = register_backends

    class Good(Backend):
        name = "good"
        description = "test backend"

        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    good = types.ModuleType("good_plugin")

    @cosyvino.hookimpl
    def register_good(register):
        register(Good)

    good.register_backends = register_good
    _install_fake_eps(monkeypatch, [_FakeEP("exploding", boom),
                                    _FakeEP("malformed", lambda: bad_register),
                                    _FakeEP("good", lambda: good)])
    classes = plugins.backend_classes()
    assert classes["good"] is Good and "torch" in classes
    errors = plugins.plugin_errors()
    assert "plugin import exploded" in errors["exploding"]
    assert "not a Backend subclass" in errors["malformed"]
    with pytest.raises(BackendError, match="exploding"):
        plugins.get_backend("exploding")


def _plugin_module(name, *classes, raise_in_register=None):
    module = types.ModuleType(name)

    @cosyvino.hookimpl
    def register_backends(register):
        if raise_in_register:
            raise raise_in_register
        for cls in classes:
            register(cls)

    module.register_backends = register_backends
    return module


def test_register_hook_raising_and_nameless_backend_are_reported(monkeypatch):
    class Nameless(Backend):
        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    _install_fake_eps(monkeypatch, [
        _FakeEP("raising", lambda: _plugin_module("raising",
                                                  raise_in_register=KeyError("oops"))),
        _FakeEP("nameless", lambda: _plugin_module("nameless", Nameless))])
    assert set(plugins.backend_classes()) == {"torch"}
    errors = plugins.plugin_errors()
    assert "register_backends raised KeyError" in errors["raising"]
    assert "non-empty 'name'" in errors["nameless"]


# ---- the planner and third-party backends ------------------------------------------------------
def _backend(name, caps=None, *, raises=None):
    from cosyvino.backends import Capabilities

    class Fake(Backend):
        description = f"fake {name}"

        @classmethod
        def capabilities(cls, model_dir, probe=None):
            if raises:
                raise raises
            return caps if caps is not None else Capabilities(ready=True)

        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    Fake.name = name
    return Fake


def _plan_with(monkeypatch, tmp_path, backends, model=None, **kw):
    import planner_trees as trees

    from cosyvino.planner import installed_backends, make_plan
    from cosyvino.planner.topology import probe_topology

    _install_fake_eps(monkeypatch, [_FakeEP(b.name, lambda b=b: _plugin_module(b.name, b))
                                    for b in backends])
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends = installed_backends()
    p.model = model if model is not None else trees.model_without_irs()
    return make_plan(p, **kw)


def test_planner_picks_fastest_ready_plugin_and_keys_on_its_capabilities(monkeypatch, tmp_path):
    from cosyvino.backends import Capabilities

    fast = _backend("fast", Capabilities(ready=True, reason="fast files here", relative_speed=3.0,
                                         streams=True, pinning=True, resident_bytes=2**30,
                                         resident_basis="fast's own estimate",
                                         options={"arena": False}))
    slow = _backend("slow", Capabilities(ready=True, reason="slow files", relative_speed=2.0))
    lazy = _backend("lazy", Capabilities(ready=False, reason="run `lazy-convert` first",
                                         relative_speed=9.0))
    plan = _plan_with(monkeypatch, tmp_path, [fast, slow, lazy], goal="throughput")
    assert plan.backend == "fast"
    reason = plan.decision("backend")["reason"]
    assert reason.startswith("fast files here (fastest ready backend, ~3x torch)")
    assert "lazy: not ready: run `lazy-convert` first" in reason
    assert plan.decision("candidate:slow")["value"] == "ready"
    assert plan.decision("candidate:torch")["value"] == "ready"
    # streams, pinning and sessions follow the capabilities, not the backend's name
    assert (plan.streams, plan.threads_per_stream) == (2, 1) and plan.max_sessions == 2
    assert plan.pinning is True
    assert plan.backend_options == {"arena": False, "num_threads": 2, "num_streams": 2,
                                    "cpu_pinning": True, "overlap_stages": False,
                                    "first_chunk_hold": False}  # goal throughput
    assert "fast's own estimate" in plan.decision("memory")["reason"]
    assert plan.memory["weights_bytes"] == 2**30


def test_planner_ties_prefer_plugin_over_torch_and_override_works(monkeypatch, tmp_path):
    from cosyvino.backends import Capabilities

    same = _backend("same", Capabilities(ready=True, reason="same speed", relative_speed=1.0))
    lazy = _backend("lazy", Capabilities(ready=False, reason="not converted"))
    plan = _plan_with(monkeypatch, tmp_path, [same, lazy])
    assert plan.backend == "same"                 # ties: torch last
    assert plan.streams == 1 and plan.pinning is False
    # not thread-safe (the default Capabilities): the lanes run one after the other
    assert plan.backend_options == {"num_threads": 2, "overlap_stages": False,
                                    "first_chunk_hold": True}
    plugins._reset_for_tests()
    plan = _plan_with(monkeypatch, tmp_path, [same, lazy], backend="lazy")
    assert plan.backend == "lazy" and "override" in plan.decision("backend")["reason"]
    assert any("--backend lazy: not ready" in w and "not converted" in w for w in plan.warnings)


def test_planner_skips_plugins_that_cannot_describe_themselves(monkeypatch, tmp_path):
    raising = _backend("raising", raises=RuntimeError("no idea"))
    wrong = _backend("wrong", caps={"ready": True, "relative_speed": 99})
    plan = _plan_with(monkeypatch, tmp_path, [raising, wrong])
    assert plan.backend == "torch"
    assert any("'raising' skipped" in w and "RuntimeError: no idea" in w for w in plan.warnings)
    assert any("'wrong' skipped" in w and "returned dict" in w for w in plan.warnings)
    assert plan.decision("candidate:raising")["value"] == "skipped"


def test_planner_names_plugins_that_failed_to_load(monkeypatch, tmp_path):
    def boom():
        raise ImportError("missing dependency xyz")

    import planner_trees as trees

    from cosyvino.planner import installed_backends, make_plan
    from cosyvino.planner.topology import probe_topology

    _install_fake_eps(monkeypatch, [_FakeEP("exploding", boom)])
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends, p.model = installed_backends(), trees.model_without_irs()
    plan = make_plan(p)
    assert plan.backend == "torch"
    assert any("'exploding' failed to load" in w and "xyz" in w for w in plan.warnings)


def test_builtin_capabilities_on_real_dirs(tmp_path):
    """torch: ready with the .pt files; openvino: ready only once converted IRs exist."""
    import shutil

    from conftest import TINY_A

    from cosyvino.planner.topology import probe_topology

    probe = probe_topology()
    torch_cls, ov_cls = plugins.get_backend("torch"), plugins.get_backend("openvino")
    t = torch_cls.capabilities(str(TINY_A), probe)
    assert t.ready and t.relative_speed == 1.0 and t.thread_safe and not t.streams
    assert t.resident_bytes == sum((TINY_A / f).stat().st_size
                                   for f in ("llm.pt", "flow.pt", "hift.pt"))
    o = ov_cls.capabilities(str(TINY_A), probe)
    assert not o.ready and "cosyvino convert" in o.reason
    assert o.streams and o.pinning and o.thread_safe
    model = tmp_path / "m"
    shutil.copytree(TINY_A, model, ignore=shutil.ignore_patterns("golden*", "llm.pt"))
    t = torch_cls.capabilities(str(model), probe)
    assert not t.ready and "llm.pt" in t.reason
    (model / "openvino").mkdir()
    (model / "openvino" / "manifest.json").write_text('{"weights": "fp32"}')
    (model / "openvino" / "llm.bin").write_bytes(b"\0" * 1000)
    o = ov_cls.capabilities(str(model), probe)
    assert o.ready and o.load_dir == str(model) and o.resident_bytes == 1800
    assert o.relative_speed == (1.8 if probe.bf16 else 1.3)
    assert ("bf16" in o.precisions) == probe.bf16
    # a dir of an older LLM layout (no llm.positional) is one the backend would refuse: the
    # planner sees it as not ready, with the command that fixes it
    (model / "openvino" / "manifest.json").write_text(
        '{"weights": "fp32", "llm": {"pos_bucket": 64, "attention_mask": "batch"}}')
    o = ov_cls.capabilities(str(model), probe)
    assert not o.ready and "positional tables" in o.reason and "cosyvino convert" in o.reason


def test_plan_reasons_name_the_backend_once(monkeypatch, tmp_path):
    """A plugin whose reason starts with its own name ("mine: ...", as the base class's default
    does) is shown once in the candidate decision and in the not-chosen list."""
    from cosyvino.backends import Capabilities
    from cosyvino.planner.report import format_plan

    prefixed = _backend("prefixed", Capabilities(ready=True, reason="prefixed: graphs in /m",
                                                 relative_speed=3.0))
    later = _backend("later", Capabilities(ready=False, reason="later: run `later-convert`"))
    plan = _plan_with(monkeypatch, tmp_path, [prefixed, later])
    assert plan.backend == "prefixed"
    assert plan.decision("candidate:prefixed")["reason"] == "graphs in /m, ~3x torch"
    assert plan.decision("candidate:later")["reason"] == "run `later-convert`"
    reason = plan.decision("backend")["reason"]
    assert reason.startswith("graphs in /m (fastest ready backend, ~3x torch)")
    assert "later: not ready: run `later-convert`" in reason
    text = format_plan(plan)
    assert "prefixed: graphs" not in text and "later: later:" not in text
    assert text.count("run `later-convert`") == 2   # its candidate line + the not-chosen list


_BAD_PLUGIN = '''
import os

import cosyvino
from cosyvino.backends import Backend
from cosyvino.errors import ModelDirError


class PrepareIsEllipsis(Backend):
    """prepare() copied from a skeleton whose body is `...`: returns None."""
    name = "prep-none"

    @classmethod
    def prepare(cls, model_dir, out_dir=None, progress=None):
        ...

    @classmethod
    def load(cls, model_dir, **options):
        raise TypeError("load() must not be reached with a bad prepared dir")


class LoadReturnsNone(Backend):
    name = "load-none"

    @classmethod
    def load(cls, model_dir, **options):
        if not os.path.isdir(model_dir):
            raise ModelDirError(f"model directory not found: {model_dir}", model_dir)


@cosyvino.hookimpl
def register_backends(register):
    register(PrepareIsEllipsis)
    register(LoadReturnsNone)
'''

_BAD_PLUGIN_TESTS = '''
from cosyvino.testing import BackendConformance


class TestPrepNone(BackendConformance):
    backend = "prep-none"


class TestLoadNone(BackendConformance):
    backend = "load-none"
'''


def test_conformance_names_a_bad_prepare_or_load_once(tmp_path):
    """A plugin whose prepare() returns None (or whose load() returns None) gets one failure
    that says so; the tests needing a loaded model are skipped, not errors from deep inside."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    dist = site / "bad_conformance_plugin-0.0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-conformance-plugin\n"
                                   "Version: 0.0.1\n")
    (dist / "entry_points.txt").write_text("[cosyvino]\nbadconf = bad_conformance_plugin\n")
    (site / "bad_conformance_plugin.py").write_text(_BAD_PLUGIN)
    (tmp_path / "test_bad_conformance.py").write_text(_BAD_PLUGIN_TESTS)
    env = dict(os.environ, COSYVINO_PLUGINS="badconf", COLUMNS="400",
               PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH"))
                                          if p))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_bad_conformance.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    failed = [ln for ln in out.splitlines() if ln.startswith("FAILED ")]
    assert len(failed) == 2, out
    assert "TestPrepNone::test_prepare_returns_loadable_dir" in failed[0]
    assert "returned None (NoneType), not the path (str or os.PathLike)" in failed[0]
    assert "TestLoadNone::test_load_returns_stages" in failed[1]
    assert "returned NoneType, not a cosyvino.backends.Stages" in failed[1]
    assert "must not be reached" not in out and " error" not in out.splitlines()[-1]
    assert "skipped" in out.splitlines()[-1]


# ---- the backend answers for itself: inventory, option names, tuning, conversion -------------
class _OwnNames(Backend):
    """A backend with its own inventory section and option names, like the OpenVINO plugin,
    but under a name the core has never heard of."""

    name = "zeta"
    description = "fake zeta"
    install_hint = "pip install zeta-backend"

    @classmethod
    def inventory(cls, model_dir):
        return {"graphs": 3, "summary": "3 zeta graphs"}

    @classmethod
    def capabilities(cls, model_dir, probe=None):
        from cosyvino.backends import Capabilities

        found = cls.inventory_of(model_dir, probe)
        return Capabilities(ready=bool(found.get("graphs")), reason="zeta graphs",
                            relative_speed=5.0, streams=True, pinning=True,
                            precisions=("fp32", "bf16"), resident_bytes=2**28,
                            weight_precisions={"llm": "int8"})

    @classmethod
    def plan_options(cls, decisions):
        return {"zeta_threads": decisions["threads"], "zeta_streams": decisions["streams"],
                "zeta_pin": decisions["pinning"], "zeta_llm": decisions["precision"]["llm"],
                "zeta_goal": decisions["goal"]}

    @classmethod
    def tuning_candidates(cls, plan, probe):
        return [{"label": "zeta turbo", "backend": cls.name,
                 "options": dict(plan.backend_options, zeta_turbo=True), "streams": 1}]

    @classmethod
    def load(cls, model_dir, **options):
        raise NotImplementedError


def test_planner_uses_a_backends_inventory_and_option_names(monkeypatch, tmp_path):
    """The planner records the backend's inventory section, reads its capabilities off it and
    takes the load options from its plan_options: no name of the backend in the core."""
    from cosyvino.planner import model_inventory
    from cosyvino.planner.report import format_plan
    from cosyvino.planner.tune import candidates
    from cosyvino.planner.topology import probe_topology

    _install_fake_eps(monkeypatch, [_FakeEP("zeta", lambda: _plugin_module("zeta", _OwnNames))])
    inv = model_inventory(str(tmp_path))
    assert inv["zeta"] == {"graphs": 3, "summary": "3 zeta graphs"}
    assert inv["dir"] == str(tmp_path) and inv["exists"] is False
    assert list(inv)[-2:] == ["torch", "zeta"]  # the reference backend's section first
    plan = _plan_with(monkeypatch, tmp_path, [_OwnNames], model=inv, goal="throughput")
    assert plan.backend == "zeta"
    assert plan.backend_options == {"zeta_threads": 2, "zeta_streams": 2, "zeta_pin": True,
                                    "zeta_llm": "fp32", "zeta_goal": "throughput",
                                    "overlap_stages": False, "first_chunk_hold": False}
    assert plan.precision["llm_weights"] == "int8"  # its weight_precisions
    assert "3 zeta graphs" in format_plan(plan)
    p = probe_topology(str(tmp_path / "root"))
    p.backends = {"zeta": {"available": True}, "torch": {"available": True}}
    labels = [c["label"] for c in candidates(plan, p)]
    assert "zeta turbo" in labels and labels[0] == "plan"
    # a section the probe lacks is an empty one, not a look at the disk
    p.model = {"dir": str(tmp_path), "exists": False}
    assert _OwnNames.inventory_of(str(tmp_path), p) == {}


def test_planner_names_install_hint_of_backends_the_probe_lacks(monkeypatch, tmp_path):
    import planner_trees as trees

    from cosyvino.planner import make_plan
    from cosyvino.planner.topology import probe_topology

    _install_fake_eps(monkeypatch, [_FakeEP("zeta", lambda: _plugin_module("zeta", _OwnNames))])
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends, p.model = dict(trees.TORCH_ONLY), trees.model_without_irs()
    plan = make_plan(p)
    assert plan.backend == "torch"
    assert plan.decision("candidate:zeta") == {
        "name": "candidate:zeta", "value": "not installed",
        "reason": "plugin not installed (pip install zeta-backend)"}


def test_reference_backend_is_a_property_not_a_name(monkeypatch, tmp_path):
    """With nothing ready the planner falls back to the backend that says it is the reference,
    whatever it is called, and takes its memory estimate for a backend that gives none."""
    from cosyvino.backends import Capabilities

    class Ref(Backend):
        name = "aaa-ref"
        reference = True

        @classmethod
        def capabilities(cls, model_dir, probe=None):
            return Capabilities(ready=False, reason="no checkpoint yet", resident_bytes=2**29,
                                resident_basis="aaa's checkpoint")

        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    lazy = _backend("lazy", Capabilities(ready=False, reason="not converted"))
    empty = {"dir": str(tmp_path / "m"), "exists": False}  # torch is not ready either
    plan = _plan_with(monkeypatch, tmp_path, [Ref, lazy], model=empty)
    assert plan.backend == "aaa-ref"
    assert "using the aaa-ref reference backend" in plan.decision("backend")["reason"]
    assert plan.memory["weights_bytes"] == 2**29
    plugins._reset_for_tests()
    # a third-party backend without a memory estimate gets the reference backend's
    plan = _plan_with(monkeypatch, tmp_path, [Ref, lazy], model=empty, backend="lazy")
    assert plan.memory["weights_bytes"] == 2**29
    assert "aaa's checkpoint" in plan.decision("memory")["reason"]


class _Converting(Backend):
    """A converting backend of its own format: writes a manifest with the sources' records and
    one graph file; ``layout`` is what a fresh conversion would record."""

    name = "conv"
    convert_format = "convfmt"
    layout = 2
    calls: list = []
    option_presets = {"": {"fast": False}, "fast": {"fast": True}}

    @classmethod
    def conversion_status(cls, model_dir, out_dir=None, *, weights="fp32"):
        from cosyvino.converted import conversion_status

        return conversion_status(model_dir, out_dir, cls.name,
                                 {"weights": weights, "layout": cls.layout})

    @classmethod
    def convert(cls, model_dir, out_dir=None, progress=None, *, weights="fp32"):
        import os

        from cosyvino.converted import file_record, source_record, write_manifest

        out = os.path.abspath(out_dir or os.path.join(model_dir, cls.name))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "g.bin"), "wb") as f:
            f.write(b"\0" * 10)
        write_manifest(out, {
            "format": 1, "runtime": cls.name, "weights": weights, "layout": cls.layout,
            "source": {"cosyvoice.yaml": source_record(os.path.join(model_dir,
                                                                    "cosyvoice.yaml"))},
            "files": {"g.bin": file_record(os.path.join(out, "g.bin"), stage="llm")}})
        cls.calls.append(out)
        return out

    @classmethod
    def load(cls, model_dir, **options):
        raise NotImplementedError


@pytest.fixture
def converting(monkeypatch, tmp_path):
    _Converting.calls, _Converting.layout = [], 2
    _install_fake_eps(monkeypatch, [_FakeEP("conv", lambda: _plugin_module("conv",
                                                                           _Converting))])
    src = tmp_path / "model"
    src.mkdir()
    (src / "cosyvoice.yaml").write_text("llm: {}\n")
    return src


def test_prepare_keeps_a_current_conversion_and_redoes_a_stale_one(converting):
    out = _Converting.prepare(str(converting))
    assert out == str(converting / "conv") and len(_Converting.calls) == 1
    assert _Converting.prepare(str(converting)) == out and len(_Converting.calls) == 1
    _Converting.layout = 3  # a newer exporter: the dir on disk is stale
    assert not _Converting.conversion_status(str(converting)).current
    assert _Converting.prepare(str(converting)) == out and len(_Converting.calls) == 2
    assert _Converting.prepare(str(converting), force=True) == out
    assert len(_Converting.calls) == 3
    with pytest.raises(Exception, match="model directory not found"):
        _Converting.prepare(str(converting / "missing"))


def test_convert_cli_asks_the_backend_that_owns_the_format(converting):
    from click.testing import CliRunner

    from cosyvino.cli.main import main

    args = ["convert", "--format", "convfmt", "--model-dir", str(converting)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert f"wrote {converting / 'conv'}" in first.output
    assert "use it: cosyvino synth --backend conv" in first.output
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "kept" in again.output and "up to date" in again.output
    assert len(_Converting.calls) == 1
    _Converting.layout = 3
    stale = CliRunner().invoke(main, args)
    assert stale.exit_code == 0 and "wrote" in stale.output and len(_Converting.calls) == 2
    refused = CliRunner().invoke(main, args + ["--weights", "fp16"])
    assert refused.exit_code == 2 and "fp32 weights only" in refused.output
    unknown = CliRunner().invoke(main, ["convert", "--format", "onnx", "--model-dir",
                                        str(converting)])
    assert unknown.exit_code == 2 and "'convfmt'" in unknown.output  # onnx is not registered


def test_bench_specs_come_from_the_backend(converting):
    import click

    from cosyvino.cli.bench import _parse_spec, _split_subdir, default_backends

    assert _parse_spec("conv") == ("conv", {"fast": False})
    assert _parse_spec("conv:fast") == ("conv", {"fast": True})
    with pytest.raises(click.BadParameter, match="unknown conv preset"):
        _parse_spec("conv:slow")
    assert _split_subdir("conv@copy:fast") == ("conv:fast", "copy")
    with pytest.raises(click.BadParameter, match="only conv take"):
        _split_subdir("torch@x")
    assert default_backends() == "torch,conv"
    assert _Converting.prepared_dir(str(converting)) == str(converting)  # the default


def test_plugins_and_planner_import_each_other_in_one_direction_only():
    """The built-in plugins answer the planner's questions without importing it (nor torch or
    their runtime), and the planner never imports the Synthesizer (which imports the planner)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from conftest import TINY_A\n"
            "from cosyvino.plugins import backend_classes\n"
            "for cls in backend_classes().values():\n"
            "    cls.inventory(str(TINY_A)); cls.capabilities(str(TINY_A))\n"
            "    cls.prepared_dir(str(TINY_A))\n"
            "assert not [m for m in sys.modules if m.startswith('cosyvino.planner')], 'planner'\n"
            "import cosyvino.planner, cosyvino.planner.auto, cosyvino.planner.tune\n"
            "from cosyvino.planner import make_plan, model_inventory, probe\n"
            "make_plan(probe(model_dir=str(TINY_A)))\n"
            "heavy = {'torch', 'openvino', 'onnxruntime', 'onnx', 'cosyvino.synthesizer'}\n"
            "print(sorted(heavy & set(sys.modules)))\n")
    import pathlib

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=pathlib.Path(__file__).parent)
    assert out.returncode == 0, out.stderr
    # OpenVINO's device view is the one import of a runtime a probe makes
    assert out.stdout.strip() in ("[]", "['openvino']"), out.stdout


def test_builtin_inventories_and_prepared_dirs(tmp_path):
    """Each built-in backend reports only its own files: an ONNX dir given as the model dir is
    no OpenVINO conversion (its manifest names another runtime), and the reverse."""
    from cosyvino.converted import write_manifest

    ov_cls, ort_cls = plugins.get_backend("openvino"), plugins.get_backend("onnxruntime")
    torch_cls = plugins.get_backend("torch")
    onnx = tmp_path / "onnx-dir"
    onnx.mkdir()
    write_manifest(str(onnx), {"format": 1, "runtime": "onnxruntime",
                               "files": {"llm.onnx": {"size": 5, "stage": "llm"}}})
    assert ov_cls.inventory(str(onnx)) == {"present": False, "dirs": [], "bytes": 0,
                                           "precisions": {}, "summary": "no OpenVINO IRs"}
    assert ov_cls.prepared_dir(str(onnx)) is None
    assert ort_cls.inventory(str(onnx))["present"] is True
    assert ort_cls.inventory(str(onnx))["bytes"] == 5
    assert ort_cls.prepared_dir(str(onnx)) == str(onnx)
    ov = tmp_path / "model" / "openvino"
    ov.mkdir(parents=True)
    write_manifest(str(ov), {"format": 1, "files": {}})  # no runtime field: an OpenVINO one
    assert ov_cls.inventory(str(ov.parent))["dirs"] == ["openvino"]
    assert ov_cls.prepared_dir(str(ov.parent)) == str(ov)
    assert ort_cls.inventory(str(ov.parent)) == {"present": False}
    assert ort_cls.prepared_dir(str(ov.parent)) is None
    assert torch_cls.inventory(str(ov.parent)) == {"files": [], "bytes": 0}
    assert torch_cls.inventory(None) == {"files": [], "bytes": 0}


def test_a_failing_plan_options_gets_the_generic_names(monkeypatch, tmp_path):
    from cosyvino.backends import Capabilities

    class Broken(Backend):
        name = "broken"

        @classmethod
        def capabilities(cls, model_dir, probe=None):
            return Capabilities(ready=True, reason="here", relative_speed=4.0)

        @classmethod
        def plan_options(cls, decisions):
            raise KeyError("no_such_decision")

        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    plan = _plan_with(monkeypatch, tmp_path, [Broken])
    assert plan.backend == "broken"
    assert plan.backend_options == {"num_threads": 2, "overlap_stages": False,
                                    "first_chunk_hold": True}
    assert any("plan_options() failed (KeyError" in w for w in plan.warnings)
