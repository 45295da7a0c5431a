"""The plan: a versioned, human-editable TOML file with the decisions, their reasons and the
probe snapshot they were made on.

Readers: ``cosyvino serve --plan`` and :meth:`cosyvino.Synthesizer.auto`. Reading uses
``tomllib`` (3.11+) or the ``tomli`` backport; writing uses the tiny writer below (the plan holds
only strings, numbers, booleans, lists and tables). No torch, no openvino.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from ..errors import CosyvinoError
from ..fileutil import publish
from .topology import Probe

#: bump when a field changes meaning; readers refuse newer major versions
PLAN_VERSION = 1

PLAN_ENV = "COSYVINO_PLAN"
PLAN_FILENAME = "plan.toml"


class PlanError(CosyvinoError):
    """No workable plan (no usable backend, not enough memory) or an unreadable plan file."""


@dataclass
class Plan:
    """Decisions for one machine + model. Consumers need only:

    * ``backend`` and ``backend_options`` -> ``Synthesizer(model_dir, backend=plan.backend,
      **plan.backend_options)`` (``backend_options["num_threads"]`` is the total CPU threads);
    * ``max_sessions`` (concurrent syntheses) and ``queue_size`` (requests waiting beyond that
      before the server answers 503);
    * ``llm_batch`` (decode rows of concurrent requests one batched LLM step advances per
      stream; 1 = no batching) -> ``Synthesizer(llm_batch=)``, ``cosyvino serve --llm-batch``;
    * ``estimator_batch`` (concurrent requests whose equal-length estimator calls run as one
      call; 1 = none) -> ``Synthesizer(estimator_batch=)``, ``cosyvino serve
      --estimator-batch``;
    * :meth:`check_machine` -> warnings when the machine no longer matches the probe.

    ``decisions`` is a list of {name, value, reason}; ``probe`` the :class:`Probe` snapshot as a
    dict; ``tuning`` the measured candidates when planned with ``--tune``.
    """

    backend: str
    backend_options: dict
    streams: int
    threads_per_stream: int
    pinning: bool
    max_sessions: int
    queue_size: int
    llm_batch: int = 1
    estimator_batch: int = 1
    goal: str = "latency"
    model_dir: str = ""
    precision: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    decisions: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    probe: dict = field(default_factory=dict)
    tuning: dict = field(default_factory=dict)
    version: int = PLAN_VERSION
    created: str = ""
    cosyvino_version: str = ""
    path: str = ""   # where it was loaded from / saved to (not written to the file)

    @property
    def total_threads(self) -> int:
        """CPU threads the plan keeps busy: streams x threads per stream."""
        return self.streams * self.threads_per_stream

    def decision(self, name: str) -> dict | None:
        return next((d for d in self.decisions if d.get("name") == name), None)

    # ---- machine drift -----------------------------------------------------------------------
    def check_machine(self, probe: Probe | None = None) -> list[str]:
        """Differences between the machine now (``probe``; None = probe this machine) and the
        probe the plan was made on, as human-readable warnings (empty = still matches)."""
        if probe is None:
            from .topology import probe_topology
            probe = probe_topology()
        old = Probe.from_dict(self.probe) if self.probe else None
        if old is None:
            return ["plan has no probe snapshot; cannot check the machine"]
        out = []
        for attr, label in (("usable_cpus", "usable CPUs"), ("physical_cores", "physical cores"),
                            ("cpu_quota", "CPU quota"), ("threads_per_core", "SMT threads/core"),
                            ("cpu_model", "CPU model")):
            a, b = getattr(old, attr), getattr(probe, attr)
            if a != b:
                out.append(f"{label} changed: plan made with {a}, now {b}")
        lost = sorted(set(old.flags) - set(probe.flags))
        gained = sorted(set(probe.flags) - set(old.flags))
        if lost or gained:
            out.append("CPU flags changed:" + (f" lost {', '.join(lost)}" if lost else "")
                       + (f" gained {', '.join(gained)}" if gained else ""))
        if self.total_threads > max(1, probe.usable_cpus) or (
                probe.cpu_quota is not None and self.total_threads > math.ceil(probe.cpu_quota)):
            out.append(f"plan uses {self.total_threads} threads but only {probe.usable_cpus} "
                       f"CPUs are usable now (quota {probe.cpu_quota})")
        ob, nb = old.memory_budget, probe.memory_budget
        if ob and nb and abs(ob - nb) > 0.1 * ob:
            out.append(f"memory budget changed: {ob / 2**30:.1f} GiB -> {nb / 2**30:.1f} GiB")
        req = self.memory.get("required_bytes")
        if req and nb and req > nb:
            out.append(f"plan needs ~{req / 2**30:.1f} GiB but only {nb / 2**30:.1f} GiB is "
                       "available now")
        if out:
            out.append("re-run `cosyvino plan` to adapt")
        return out

    # ---- (de)serialization -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("path", None)
        return d

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> "Plan":
        version = data.get("version", PLAN_VERSION)
        if not isinstance(version, int) or version > PLAN_VERSION:
            raise PlanError(f"plan {path or ''} has version {version!r}; this cosyvino reads "
                            f"up to {PLAN_VERSION} — upgrade cosyvino or re-run `cosyvino plan`")
        missing = [k for k in ("backend", "backend_options", "streams", "threads_per_stream",
                               "pinning", "max_sessions", "queue_size") if k not in data]
        if missing:
            raise PlanError(f"plan {path} lacks {', '.join(missing)}; re-run `cosyvino plan`")
        known = set(cls.__dataclass_fields__) - {"path"}
        return cls(**{k: v for k, v in data.items() if k in known}, path=path)

    def save(self, path: str) -> str:
        """Write the plan atomically as TOML; returns the absolute path."""
        path = os.path.abspath(path)
        text = dumps_toml(self.to_dict(), header=(
            "cosyvino deployment plan: written by `cosyvino plan`, read by `cosyvino serve` and "
            "Synthesizer.auto().\nEdit values to override a decision (see docs/planner.md); "
            "re-run `cosyvino plan` after hardware changes."))
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".toml", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            publish(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.path = path
        return path

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2)


def load_plan(path: str) -> Plan:
    """Read a plan file (TOML, or JSON when it ends in ``.json``).

    Raises:
        PlanError: missing, malformed, or newer than this cosyvino understands.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PlanError(f"cannot read plan {path}: {e.strerror or e}; create one with "
                        "`cosyvino plan --out PATH`") from None
    try:
        if path.endswith(".json"):
            data = json.loads(raw.decode("utf-8"))
        else:
            data = _toml_loads(raw.decode("utf-8"))
    except Exception as e:  # tomllib.TOMLDecodeError / ValueError / UnicodeDecodeError
        raise PlanError(f"plan {path} is not valid {'JSON' if path.endswith('.json') else 'TOML'}:"
                        f" {e}") from None
    return Plan.from_dict(data, path=os.path.abspath(path))


def find_plan_file(model_dir: str | None = None) -> str | None:
    """Where a plan is looked for, first hit wins: ``$COSYVINO_PLAN``, ``./plan.toml``,
    ``<model_dir>/plan.toml`` (model_dir None = the default model dir)."""
    env = os.environ.get(PLAN_ENV)
    if env:
        return env
    if os.path.isfile(PLAN_FILENAME):
        return os.path.abspath(PLAN_FILENAME)
    if model_dir is None:
        from ..defaults import default_model_dir
        model_dir = default_model_dir()
    candidate = os.path.join(model_dir, PLAN_FILENAME)
    return candidate if os.path.isfile(candidate) else None


# ---- TOML ------------------------------------------------------------------------------------
def _toml_loads(text: str) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    return tomllib.loads(text)


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k) -> str:
    k = str(k)
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        items = [f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(lines: list[str], prefix: str, d: dict) -> None:
    scalars = {k: v for k, v in d.items()
               if v is not None and not isinstance(v, dict) and not _is_table_list(v)}
    for k, v in scalars.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in d.items():
        name = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if isinstance(v, dict):
            lines.append("")
            lines.append(f"[{name}]")
            _table(lines, name, v)
        elif _is_table_list(v):
            for item in v:
                lines.append("")
                lines.append(f"[[{name}]]")
                for ik, iv in item.items():
                    if iv is not None:
                        lines.append(f"{_key(ik)} = {_value(iv)}")


def dumps_toml(data: dict, header: str = "") -> str:
    """Serialize nested dicts of str/int/float/bool/lists to TOML (None values are omitted;
    lists of dicts become arrays of tables, dicts inside them inline tables)."""
    lines = [f"# {h}" for h in header.splitlines()]
    if lines:
        lines.append("")
    _table(lines, "", data)
    return "\n".join(lines).rstrip() + "\n"
