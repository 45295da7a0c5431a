"""Issue 16 item 3: the planner's INT8 choices per machine kind (faked probes of an AVX2-only
Zen 3, an AVX-512/VNNI/BF16 Zen 4 and an AMX Xeon) on model dirs laid out as `cosyvino convert`
and `cosyvino quantize` write them (manifests only), and the machine record of a quantized dir.
"""

from __future__ import annotations

import json

import pytest

import planner_trees as trees
from cosyvino.planner import make_plan
from cosyvino.planner.inventory import conversion_variants, model_inventory
from cosyvino.planner.rules import int8_dot_products, machine_kind
from cosyvino.planner.topology import probe_topology

pytest.importorskip("cosyvino_openvino")  # the in-tree OpenVINO plugin reads the dirs (no runtime)

FP32 = {s: "fp32" for s in ("llm", "text_encoder", "flow_encoder", "length_regulator",
                            "estimator", "hift_f0", "hift_decode")}
INT8 = dict(FP32, llm="int8-weights", text_encoder="int8-weights", flow_encoder="int8-static",
            estimator="int8-static", length_regulator="fp16", hift_f0="fp16", hift_decode="fp16")
INT8_LLM = dict(FP32, llm="int8-weights")
SHA = "ab" * 32
ZEN4_FLAGS = ["avx2", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx512vl", "fma"]
SCOPES = {"estimator": {"mean_snr_db": 51.7, "min_snr_db": 50.1},
          "flow_encoder": {"mean_snr_db": 72.7, "min_snr_db": 71.0}}


def _quant(model, preset, machine=None, floors=None, source=None, report=True):
    q = {"preset": preset, "source_converted_dir": source or str(model / "openvino"),
         "source_manifest_sha256": SHA}
    if report:
        q["accuracy"] = {"audio": {"overall": "end_to_end", "scopes": SCOPES}}
    if machine is not None:
        q["machine"] = machine
    if floors is not None:
        q["floors"] = floors
    return q


def _model(tmp_path, *, int8=True, int8_llm=False, fp32=True, machine=None, floors=None,
           source=None, report=True):
    """tmp_path/model with openvino/ (fp32), openvino-int8/, openvino-int8-llm/ as asked."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "cosyvoice.yaml").write_text("")
    if fp32:
        trees.write_ov_dir(model / "openvino", FP32)
    if int8:
        trees.write_ov_dir(model / "openvino-int8", INT8,
                           _quant(model, "int8", machine, floors, source, report))
    if int8_llm:
        trees.write_ov_dir(model / "openvino-int8-llm", INT8_LLM,
                           _quant(model, "int8-llm-only", machine, source=source))
    return model


def _plan(builder, tmp_path, model_dir, **kw):
    p = probe_topology(str(builder(tmp_path / "root")))
    p.backends = dict(trees.BOTH)
    p.model = model_inventory(str(model_dir))
    return make_plan(p, backend="openvino", **kw)


def _reason(plan, name):
    d = plan.decision(name)
    assert d is not None, f"no decision {name!r}: {[x['name'] for x in plan.decisions]}"
    return d["reason"]


# ---- machine kinds ---------------------------------------------------------------------------
@pytest.mark.parametrize("builder, kind, dots", [
    (trees.zen3_2c, "avx2", False), (trees.zen4_2c, "avx512-bf16", True),
    (trees.spr_2c, "amx", True), (trees.this_machine, "avx512-bf16", True),
    (trees.laptop_hybrid, "avx2-vnni", True), (trees.v1_host, "avx512-vnni", True)])
def test_machine_kind_of_the_fixture_machines(tmp_path, builder, kind, dots):
    p = probe_topology(str(builder(tmp_path)))
    assert machine_kind(p.flags) == kind
    assert int8_dot_products(p.flags) is dots


def test_machine_kind_edges():
    assert machine_kind(["avx2", "avx512f", "avx512bw", "avx512vl"]) == "avx512"  # Skylake-SP
    assert machine_kind(["avx2", "avx512f", "avx512_vnni"]) == "avx512-vnni"
    assert machine_kind(["amx_tile", "amx_bf16", "avx512f"]) == "amx"
    assert machine_kind(["amx_int8"]) == "baseline"  # no tiles: AMX unusable
    assert machine_kind([]) == "baseline"
    assert not int8_dot_products(["avx2", "avx512f", "avx512bw"])


# ---- the dirs of one conversion --------------------------------------------------------------
def test_conversion_variants(tmp_path):
    model = _model(tmp_path, int8_llm=True)
    # quantized from another fp32 dir (not here, other manifest): not a variant of this one
    trees.write_ov_dir(model / "other-int8", INT8, {"source_converted_dir": "/x/openvino-b",
                                                    "source_manifest_sha256": "cd" * 32})
    assert conversion_variants(str(model / "openvino-int8")) == [
        str(model / "openvino"), str(model / "openvino-int8-llm")]
    assert conversion_variants(str(model / "openvino")) == []  # not quantized
    assert conversion_variants(None) == []


def test_conversion_variants_after_the_model_dir_moved(tmp_path):
    """The recorded fp32 path is stale (quantized elsewhere): its sibling of that name."""
    model = _model(tmp_path, source="/build/models/m/openvino")
    assert conversion_variants(str(model / "openvino-int8")) == [str(model / "openvino")]


# ---- AVX2-only Zen 3: static INT8 not served when an alternative exists ---------------------
def test_zen3_serves_the_fp32_dir_instead_of_static_int8(tmp_path):
    model = _model(tmp_path)
    plan = _plan(trees.zen3_2c, tmp_path, model)
    assert plan.model_dir == str(model / "openvino")
    d = plan.decision("int8_compute")
    assert d["value"] == "not served: openvino"
    assert "no int8 dot products" in d["reason"] and "kind avx2" in d["reason"]
    assert "38.5 vs 51.7 dB" in d["reason"] and "flow and estimator" in d["reason"]
    assert "--preset int8-llm-only" in d["reason"]  # how to get an INT8 LLM back here
    assert {plan.precision[s] for s in ("llm", "flow", "estimator", "vocoder")} == {"fp32"}
    assert plan.decision("estimator_precision") is None
    assert plan.backend_options["precision"] == "f32"
    assert "stage_precision" not in plan.backend_options
    assert not any("INT8" in w for w in plan.warnings)


def test_zen3_keeps_the_int8_llm_when_a_dir_has_it(tmp_path):
    model = _model(tmp_path, int8_llm=True)
    plan = _plan(trees.zen3_2c, tmp_path, model)
    assert plan.model_dir == str(model / "openvino-int8-llm")
    assert plan.decision("int8_compute")["value"] == "not served: openvino-int8-llm"
    assert "LLM keeps INT8 weights" in _reason(plan, "int8_compute")
    assert plan.precision["llm_weights"] == "int8"
    assert "without int8 dot products the weights are widened" in _reason(plan, "llm_weights")
    assert plan.precision["estimator"] == plan.precision["flow"] == "fp32"
    # the u8 KV cache was measured on AVX-512 machines only: f32 here, and the plan says so
    assert plan.backend_options["kv_cache_precision"] == "f32"
    assert "measured faster only on" in _reason(plan, "kv_cache_precision")


def test_zen3_without_an_alternative_serves_int8_and_says_why(tmp_path):
    model = _model(tmp_path, fp32=False)
    plan = _plan(trees.zen3_2c, tmp_path, model)
    assert plan.model_dir == str(model / "openvino-int8")
    assert plan.decision("int8_compute")["value"] == "int8"
    assert "served anyway: no conversion" in _reason(plan, "int8_compute")
    assert plan.precision["estimator"] == "int8"  # the plan says what is served
    assert plan.precision["llm_weights"] == "int8"
    assert any("INT8 estimator IR on disk but no VNNI/AMX" in w for w in plan.warnings)


def test_zen3_keeps_a_quantized_dir_given_as_the_model_dir(tmp_path):
    model = _model(tmp_path)
    plan = _plan(trees.zen3_2c, tmp_path, model / "openvino-int8")
    assert plan.precision["estimator"] == "int8"
    assert plan.decision("int8_compute")["value"] == "int8 (as given)"
    assert "model dir is the quantized dir itself" in _reason(plan, "int8_compute")


def test_zen3_precision_override_cannot_force_bf16(tmp_path):
    plan = _plan(trees.zen3_2c, tmp_path, _model(tmp_path, int8_llm=True), precision="bf16")
    assert plan.precision["llm"] == "fp32" and plan.backend_options["precision"] == "f32"
    assert any("--precision bf16 ignored" in w for w in plan.warnings)


# ---- AVX-512 VNNI/BF16 (Zen 4) and AMX (Sapphire Rapids): today's choices -------------------
@pytest.mark.parametrize("builder, unit", [(trees.zen4_2c, "VNNI"), (trees.spr_2c, "AMX-INT8")])
def test_int8_is_served_where_the_cpu_has_dot_products(tmp_path, builder, unit):
    model = _model(tmp_path, int8_llm=True, machine={"cpu_model": "X", "flags": ZEN4_FLAGS,
                                                     "kind": "avx512-bf16"})
    plan = _plan(builder, tmp_path, model)
    assert plan.model_dir == str(model / "openvino-int8")
    assert plan.decision("int8_compute") is None
    assert plan.precision == {"llm_weights": "int8", "llm": "fp32", "flow": "int8",
                              "estimator": "int8", "vocoder": "bf16", "kv_cache": "u8",
                              "estimator_activations": "bf16"}
    assert f"the CPU has {unit} dot products" in _reason(plan, "estimator_precision")
    assert "quantizes the activations per group of 128" in _reason(plan, "llm_weights")
    assert plan.backend_options["kv_cache_precision"] == "u8"


# ---- the machine a quantized dir was measured on ---------------------------------------------
def test_same_kind_of_machine_no_warning(tmp_path):
    model = _model(tmp_path, machine={"cpu_model": "AMD EPYC 9B14", "flags": ZEN4_FLAGS,
                                      "kind": "avx512-bf16"})
    plan = _plan(trees.zen4_2c, tmp_path, model)
    d = plan.decision("int8_accuracy")
    assert d["value"] == "same kind"
    assert "estimator 51.7 dB" in d["reason"] and "flow 72.7 dB" in d["reason"]
    assert "AMD EPYC 9B14 (kind avx512-bf16)" in d["reason"]
    assert not any("another kind" in w for w in plan.warnings)


def test_quantized_on_another_kind_of_machine_warns(tmp_path):
    model = _model(tmp_path, machine={"cpu_model": "AMD EPYC 9B14", "flags": ZEN4_FLAGS,
                                      "kind": "avx512-bf16"})
    plan = _plan(trees.spr_2c, tmp_path, model)
    assert plan.decision("int8_accuracy")["value"] == "measured on avx512-bf16"
    warning = next(w for w in plan.warnings if "another kind" in w)
    assert "AMD EPYC 9B14" in warning and "(amx)" in warning
    assert "re-run `cosyvino quantize` here" in warning


def test_quantized_without_an_audio_report(tmp_path):
    """`cosyvino quantize --eval-per-language 0`: the machine is recorded, no SNR is; the
    reason says nothing was measured (it read "no accuracy report recorded, measured by ...")."""
    model = _model(tmp_path, report=False, machine={"cpu_model": "AMD EPYC 9B14",
                                                    "flags": ZEN4_FLAGS, "kind": "avx512-bf16"})
    plan = _plan(trees.zen4_2c, tmp_path, model)
    d = plan.decision("int8_accuracy")
    assert d["value"] == "not checked"
    assert d["reason"].startswith("no accuracy report recorded, quantized on AMD EPYC 9B14 "
                                  "(kind avx512-bf16) without an audio report")
    assert "measured by" not in d["reason"]
    warning = next(w for w in plan.warnings if "never checked against the accuracy floors" in w)
    # the command that fixes it names the dir's preset (plain `quantize` writes another dir)
    assert "re-run `cosyvino quantize --preset int8` without that option" in warning


def test_accuracy_warnings_are_logged_where_the_plan_is_served(tmp_path, caplog):
    """`serve` / `synth` read the plan through settings_from_plan: its accuracy warnings are
    logged there too (a trial user saw them only in `cosyvino plan`'s output); the others
    (e.g. a busy host while planning) are not repeated."""
    import logging

    from cosyvino.server.config import settings_from_plan

    model = _model(tmp_path, report=False, machine={"cpu_model": "X", "flags": ZEN4_FLAGS,
                                                    "kind": "avx512-bf16"})
    plan = _plan(trees.zen4_2c, tmp_path, model)
    plan.warnings.append("load average 9 on 2 online CPUs: other processes are busy here")
    path = plan.save(str(tmp_path / "plan.toml"))
    with caplog.at_level(logging.WARNING, logger="cosyvino.server.config"):
        settings_from_plan(path)
    logged = [r.getMessage() for r in caplog.records]
    assert any("never checked against the accuracy floors" in m for m in logged)
    assert not any("load average" in m for m in logged)


def test_kind_comes_from_the_recorded_flags(tmp_path):
    """A record whose ``kind`` label disagrees with its flags (older labels): the flags win."""
    model = _model(tmp_path, machine={"cpu_model": "X", "flags": ZEN4_FLAGS, "kind": "zen4"})
    plan = _plan(trees.zen4_2c, tmp_path, model)
    assert plan.decision("int8_accuracy")["value"] == "same kind"


def test_no_machine_record(tmp_path):
    plan = _plan(trees.spr_2c, tmp_path, _model(tmp_path))
    d = plan.decision("int8_accuracy")
    assert d["value"] == "unknown machine" and "estimator 51.7 dB" in d["reason"]
    assert "re-run `cosyvino quantize`" in d["reason"]


def test_stage_kept_below_its_floor_warns(tmp_path):
    floors = {"estimator": {"stages": ["estimator"], "floor_db": 45.0, "snr_db": 40.0,
                            "verdict": "kept"},
              "flow_encoder": {"stages": ["flow_encoder"], "floor_db": 45.0, "snr_db": 70.0,
                               "verdict": "pass"}}
    model = _model(tmp_path, floors=floors,
                   machine={"cpu_model": "X", "flags": ZEN4_FLAGS, "kind": "avx512-bf16"})
    plan = _plan(trees.zen4_2c, tmp_path, model)
    assert any("INT8 estimator kept below the accuracy floor" in w for w in plan.warnings)


def test_plan_file_round_trip_keeps_the_new_decisions(tmp_path):
    from cosyvino.planner import load_plan

    plan = _plan(trees.zen3_2c, tmp_path, _model(tmp_path))
    path = tmp_path / "plan.toml"
    plan.save(str(path))
    again = load_plan(str(path))
    assert again.decision("int8_compute") == plan.decision("int8_compute")
    assert again.model_dir == plan.model_dir
    json.dumps(again.to_dict())  # plain data


@pytest.mark.filterwarnings("ignore:.*does not match this machine")
def test_loading_an_amx_plan_on_an_avx2_cpu_warns(tmp_path, monkeypatch):
    """A plan made where INT8 is served, loaded (``Synthesizer.auto`` / ``serve``) on a CPU
    without dot products: one warning says what to do."""
    import cosyvino.planner as planner
    from cosyvino.planner.auto import PlanMismatchWarning, _lost_int8_dot_products, resolve_plan

    model = _model(tmp_path)
    plan = _plan(trees.spr_2c, tmp_path, model)
    zen3 = probe_topology(str(trees.zen3_2c(tmp_path / "zen3")))
    assert _lost_int8_dot_products(plan, zen3) == "flow, estimator"
    assert _lost_int8_dot_products(plan, probe_topology(str(trees.spr_2c(tmp_path / "s")))) == ""
    path = plan.save(str(tmp_path / "plan.toml"))
    monkeypatch.setattr(planner, "probe", lambda **kw: zen3)
    with pytest.warns(PlanMismatchWarning, match="serves static INT8 flow, estimator.*no VNNI"):
        resolve_plan(plan=path)
