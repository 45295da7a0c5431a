"""The plugin surface of a backend: :class:`Backend` (entry class: availability, capabilities,
preparation, loading) and the generic :class:`Stages` base a loaded model derives from. Must not
import torch.

What a loaded model must answer is the family's business: each model family defines its stage
calls as a :class:`Stages` subclass (CosyVoice v1:
:class:`cosyvino.families.cosyvoice1.stages.CosyVoice1Stages`, with its input contract), and a
backend either implements them directly or runs the family's graph table through a
:class:`cosyvino.backends.graphs.GraphRunner` and lets the family build the stages over it.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import BackendError, ModelDirError


class Stages(abc.ABC):
    """A model loaded on one backend: the generic part. Each model family subclasses it with the
    calls its orchestration makes (CosyVoice v1:
    :class:`cosyvino.families.cosyvoice1.stages.CosyVoice1Stages`)."""

    #: the family's typed config (v1: :class:`cosyvino.families.cosyvoice1.config.ModelConfig`)
    config: object
    #: built-in speaker name -> embedding float32 [1, S]
    speakers: dict[str, np.ndarray]
    #: name of the model family these stages belong to (:mod:`cosyvino.families`)
    family: ClassVar[str] = ""
    #: True when stage calls (and sessions) may run concurrently from several threads on this
    #: one object (``Synthesizer(max_parallel=N)``, the server's shared-model scheduler). False:
    #: the server loads one model per worker instead.
    thread_safe: ClassVar[bool] = False

    def close(self) -> None:
        """Release backend resources."""


@dataclass(frozen=True)
class Capabilities:
    """A backend's self-description for one model dir: what the planner weighs when it picks a
    backend (:meth:`Backend.capabilities`). Cost hints are estimates, not promises; the planner
    records them in the plan's reasons.

    Attributes:
        ready: ``model_dir`` can be loaded as it is now (e.g. converted files present).
        reason: one line: what would be loaded, or what is missing and the command that fixes it.
        load_dir: directory to pass to :meth:`Backend.load` (None = ``model_dir``).
        relative_speed: expected end-to-end synthesis speed relative to the torch backend in
            fp32 on the same CPU and threads (> 1 = faster). Measured numbers belong here
            (docs/performance.md); 1.0 when unknown.
        resident_bytes: expected resident memory of one loaded model in bytes (None = unknown).
        resident_basis: what ``resident_bytes`` is computed from (for the plan's reason).
        thread_safe: one loaded model serves concurrent requests (see :attr:`Stages.thread_safe`).
        streams: the backend can run several inference streams in one process (NUM_STREAMS);
            the planner then sizes streams and :meth:`Backend.plan_options` passes them on
            (``num_streams=N`` by default).
        pinning: the backend can pin its threads to cores; the planner then decides pinning and
            :meth:`Backend.plan_options` passes it on (``cpu_pinning=bool`` by default).
        precisions: compute precisions the backend can run here (``fp32``, ``bf16``, ``int8``...).
        options: backend options (``load(**options)``) it recommends for this machine.
        weight_precisions: component (``llm``, ``flow``, ``estimator``, ``vocoder``) -> weight
            precision of the files that would be loaded (``fp32``, ``fp16``, ``int8``,
            ``int4``); empty = fp32 / unknown. The planner reports INT8/INT4 weights and runs
            int8 components in int8 (only looked at when ``precisions`` has more than fp32).
        max_llm_batch: decode rows of concurrent requests one backend call advances
            (the loaded stages' ``max_llm_batch``, ``new_llm_batch``); 1 = the backend cannot
            batch them (each row is its own call: the weights are read once per row).
        max_estimator_batch: requests (CFG pairs: batch 2 each) one estimator call can hold
            (the loaded stages' ``max_estimator_batch``); 1 = one request per call.
        kept_buffer_bytes: resident bytes the loaded model would add (per stream) if it kept
            every stage's intermediate buffers instead of freeing them between stage calls;
            None = the backend does not free them. When given, the planner decides
            ``keep_buffers`` (memory for speed) and :meth:`Backend.plan_options` passes it on.
    """

    ready: bool
    reason: str = ""
    load_dir: str | None = None
    relative_speed: float = 1.0
    resident_bytes: int | None = None
    resident_basis: str = ""
    thread_safe: bool = False
    streams: bool = False
    pinning: bool = False
    precisions: tuple[str, ...] = ("fp32",)
    options: dict = field(default_factory=dict)
    weight_precisions: dict = field(default_factory=dict)
    max_llm_batch: int = 1
    max_estimator_batch: int = 1
    kept_buffer_bytes: int | None = None


class Backend(abc.ABC):
    """A backend plugin's entry class, registered through the ``register_backends`` hook.

    Subclasses set ``name`` (used in ``--backend NAME``) and ``description``, and implement
    :meth:`load`. Everything else has a default fit for a backend that loads the official
    checkpoint as it is; a backend that serves converted files overrides
    :meth:`conversion_status` and :meth:`convert` (and sets :attr:`convert_format`), and one
    with its own option names overrides :meth:`plan_options`. The defaults import nothing
    heavy (no torch, no runtime): the planner and the CLI call them on every installed backend.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: the command that installs what this backend needs (e.g. ``pip install
    #: 'cosyvino[openvino]'``); the plan names it for a backend its probe lacks ("" = none)
    install_hint: ClassVar[str] = ""
    #: this backend is the speed reference (``Capabilities.relative_speed`` 1.0) and loads the
    #: official checkpoint as it is: the planner falls back to it when no backend is ready (the
    #: default model's checkpoint is created on first use), puts it last among equally fast
    #: ones and takes its resident-memory estimate for a backend that gives none
    reference: ClassVar[bool] = False
    #: ``cosyvino convert --format VALUE`` that writes what this backend serves ("" = it
    #: converts nothing); one backend per value
    convert_format: ClassVar[str] = ""
    #: weight precisions :meth:`convert` can store (``cosyvino convert --weights``)
    convert_weights: ClassVar[tuple[str, ...]] = ("fp32",)
    #: named sets of :meth:`load` options, for ``cosyvino bench --backends NAME:PRESET``; the
    #: key ``""`` is used for a bare ``NAME``. Empty: the backend takes no ``:PRESET``.
    #: Read only; callers copy.
    option_presets: ClassVar[dict[str, dict]] = {}

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(usable, reason) — e.g. False when its runtime package is not installed."""
        return True, ""

    @classmethod
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Describe what this backend would do with ``model_dir`` on the probed machine
        (``probe``: :class:`cosyvino.planner.topology.Probe` or None). The planner calls this on
        every installed backend and picks among the ready ones. Must be cheap: no model
        loading, no heavy imports.

        ``probe.model`` (when it describes ``model_dir``) is the planner's inventory of the dir,
        holding this backend's :meth:`inventory` under its name; :meth:`inventory_of` returns
        that section, or takes it from the disk when the probe has none. An exception raised
        here, or a return value that is not a :class:`Capabilities`, makes the planner skip
        this backend with a warning naming it. Default: not ready when ``model_dir`` names no
        directory, else ready at the torch backend's speed (fp32, not thread-safe, no streams
        or pinning).
        """
        if model_dir is not None and not os.path.isdir(model_dir):
            return Capabilities(ready=False, reason=f"model directory not found: {model_dir}")
        return Capabilities(ready=True, reason="no capability description")

    @classmethod
    def inventory(cls, model_dir: str | None) -> dict:
        """What this backend finds in ``model_dir`` without loading anything: its converted
        dirs, their bytes and weight precisions, the checkpoint files it would load... The
        planner's model inventory (``probe.model``, recorded in plan files) holds the returned
        dict under this backend's name, next to the generic part (``dir``, ``exists``,
        ``family``); :meth:`capabilities` reads it back through :meth:`inventory_of`.

        Returns a JSON-able dict (str keys; str, int, float, bool, list, dict values). The key
        ``summary``, when present, is one line ``cosyvino plan`` prints about the model (e.g.
        ``"IRs in openvino: llm=fp32"``). ``model_dir`` None or missing: a dict saying nothing
        was found (never raises for that). Must be cheap: directory listings and small files
        only, no heavy imports. An exception raised here is recorded in the section as
        ``{"error": "..."}`` and planning goes on. Default: ``{}`` (nothing of its own).
        """
        return {}

    #: True when :meth:`onnx_runner` works (the backend runs plain ONNX files)
    runs_onnx: ClassVar[bool] = False

    @classmethod
    def check_onnx_runner_options(cls, options: dict, known) -> None:
        """What every :meth:`onnx_runner` checks first: the runtime is installed and
        ``options`` are among ``known``. Raises BackendError naming the problem."""
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise BackendError(f"{cls.name}: unknown ONNX runner options {unknown}; known: "
                               f"{list(known)}")

    @classmethod
    def onnx_runner(cls, path: str, **options):
        """A runner of a plain ONNX file a checkpoint ships (CosyVoice: ``campplus.onnx``,
        ``speech_tokenizer_v1.onnx``): an object with ``run(inputs: list[np.ndarray]) ->
        list[np.ndarray]`` (inputs and outputs by position) and ``close()``. Default: this
        backend cannot.

        Raises:
            BackendError: always here; backends that can run ONNX (OpenVINO, ONNX Runtime)
                override it (and raise ModelDirError for a missing or unreadable file).
        """
        raise BackendError(f"backend {cls.name!r} cannot run plain ONNX files")

    @classmethod
    def inventory_of(cls, model_dir: str | None, probe=None) -> dict:
        """This backend's inventory section for ``model_dir``: the one in ``probe.model`` when
        the probe describes that dir (the planner's, or a test's stand-in; ``{}`` when the
        section is absent), else :meth:`inventory` of the dir. The whole ``probe.model`` is
        there for the generic keys (``exists``...). Never raises."""
        model = getattr(probe, "model", None) or {}
        if model and model.get("dir", "") == (model_dir or ""):
            section = model.get(cls.name)
            return section if isinstance(section, dict) else {}
        return cls.inventory(model_dir)

    @classmethod
    def device_info(cls) -> dict:
        """This backend's runtime's own view of the CPU (version, device name, capabilities it
        reports), recorded in the probe under ``devices[name]``. Keys ``label`` and
        ``summary``, when present, are the row ``cosyvino plan`` prints (e.g. ``OpenVINO``,
        ``"2026.4.1: Intel Xeon ..."``); the rest is data. May import the runtime (the planner
        asks once per probe, never at serving); must not raise (report a failure as
        ``{"error": "..."}``). Default: ``{}`` (nothing to record)."""
        return {}

    @classmethod
    def plan_options(cls, decisions: dict) -> dict:
        """Translate the planner's machine decisions into :meth:`load` keyword arguments (the
        plan's ``backend_options``: ``Synthesizer(..., backend=name, **options)``).

        ``decisions`` keys (all present):
            goal: ``"latency"`` or ``"throughput"``.
            threads: int, total CPU threads (``streams * threads_per_stream``).
            streams: int >= 1, parallel inference streams (1 unless ``capabilities.streams``).
            threads_per_stream: int >= 1.
            pinning: bool, pin threads to cores (False unless ``capabilities.pinning``).
            precision: dict, component -> precision the plan runs it in: ``llm``, ``flow``,
                ``estimator``, ``vocoder`` (``fp32``, ``bf16``, ``fp16``, ``int8``); when
                decided also ``llm_weights`` (``int8``/``int4``: weights on disk),
                ``kv_cache`` (``u8``: LLM KV-cache precision) and ``estimator_activations``
                (``bf16``: the non-quantized ops of an INT8 estimator).
            capabilities: the :class:`Capabilities` this backend gave for the served dir.
            smt: bool, the CPUs have SMT siblings (the thread count leaves them out).
            hybrid: bool, hybrid CPU (the thread count covers the P-cores only).

        Returns a new dict (the caller may change it). Default: ``capabilities.options``
        plus ``num_threads``, ``num_streams`` (with streams), ``cpu_pinning`` (with pinning)
        and ``precision`` = the LLM's (when ``capabilities.precisions`` has more than fp32).
        """
        caps = decisions["capabilities"]
        opts = dict(caps.options)
        opts["num_threads"] = decisions["threads"]
        if caps.streams:
            opts["num_streams"] = decisions["streams"]
        if caps.pinning:
            opts["cpu_pinning"] = decisions["pinning"]
        if not set(caps.precisions) <= {"fp32"}:
            opts["precision"] = decisions["precision"]["llm"]
        return opts

    @classmethod
    def tuning_candidates(cls, plan, probe) -> list[dict]:
        """Variants of ``plan`` (a :class:`cosyvino.planner.Plan` made for this backend) worth
        measuring on ``probe``'s machine (``cosyvino plan --tune``), besides the thread counts
        the planner tries for every backend.

        Each candidate is ``{"label": str, "backend": str, "options": dict (load options),
        "streams": int}``, optionally with ``"pinning": False`` (the winner's plan gets
        ``--no-pinning``) or ``"bf16": True`` (it gets ``--precision bf16``). Must be cheap;
        the planner keeps at most 6 candidates in all. Default: ``[]``.
        """
        return []

    @classmethod
    def prepared_dir(cls, model_dir: str) -> str | None:
        """The directory :meth:`load` of ``model_dir`` would serve when it is there now, else
        None (:meth:`prepare` has to run first). Cheap: checks presence only (a manifest of
        this backend's runtime), not whether it is current (:meth:`conversion_status`).
        Default: ``model_dir`` when it is a directory."""
        return model_dir if os.path.isdir(model_dir) else None

    @classmethod
    def conversion_status(cls, model_dir: str, out_dir: str | None = None, *,
                          weights: str = "fp32") -> tuple[bool, str | None, str]:
        """Whether ``model_dir`` has a prepared dir :meth:`load` would serve that is current:
        the one rule :meth:`prepare` and ``cosyvino convert`` keep a conversion by.

        ``out_dir``: where a conversion would be written (None: the backend's default, usually
        a subdirectory of ``model_dir``); ``weights``: the stored weight precision asked for.
        Returns a :class:`cosyvino.converted.ConversionStatus` ``(current, dir, reason)``:
        ``dir`` the prepared dir looked at (None when there is none), ``reason`` one line.
        Converting backends apply :func:`cosyvino.converted.conversion_status` (manifest valid,
        sources unchanged, same weights, versions and export layout as a fresh conversion).
        May import the backend's exporter packages when they are installed (to compare their
        versions); never converts. Default: current, served from ``model_dir`` as it is.

        Raises:
            cosyvino.errors.ConvertedModelError: ``model_dir`` is a converted dir this backend
                cannot serve (another runtime's, or an unreadable manifest).
        """
        from ..converted import ConversionStatus

        if not os.path.isdir(model_dir):
            return ConversionStatus(False, None, f"model directory not found: {model_dir}")
        return ConversionStatus(True, model_dir, "served as it is (no conversion)")

    @classmethod
    def convert(cls, model_dir: str, out_dir: str | None = None, progress=None, *,
                weights: str = "fp32") -> str:
        """Write what :meth:`load` serves from the official checkpoint in ``model_dir`` into
        ``out_dir`` (None: the backend's default), unconditionally, and return that dir.
        Called by :meth:`prepare` when :meth:`conversion_status` says the existing one is not
        current (or with ``force``). Write atomically: on failure nothing half-written is left
        at ``out_dir`` and a previous conversion there stays. ``progress``: None or a callable
        taking one str. Default (nothing to convert): returns ``model_dir``.

        Raises:
            cosyvino.errors.ModelDirError (ConfigError / CheckpointError): bad source dir.
            cosyvino.errors.BackendError: the export dependencies (often torch) are missing.
            ValueError: ``weights`` not in :attr:`convert_weights`.
        """
        return model_dir

    @classmethod
    def prepare(cls, model_dir: str, out_dir: str | None = None, progress=None,
                force: bool = False, *, weights: str = "fp32") -> str:
        """Turn an official checkpoint dir (``cosyvoice.yaml``, ``llm.pt``, ``flow.pt``,
        ``hift.pt``, ``spk2info.pt``) into what :meth:`load` serves, and return that dir.

        Returns the dir of :meth:`conversion_status` when it is current and ``force`` is
        False; otherwise :meth:`convert` writes ``out_dir`` and its dir is returned. Backends
        override those two, not this. With the defaults (a backend loading the checkpoint as
        it is) ``model_dir`` comes back unchanged. ``progress`` is None or a callable taking
        one str (a step description). Preparing may need torch (to read the ``.pt`` files) even
        when serving does not.

        Raises:
            cosyvino.errors.ModelDirError (and its ConfigError / CheckpointError subclasses):
                ``model_dir`` is missing or not a readable model dir.
            cosyvino.errors.ConvertedModelError: ``model_dir`` is a converted dir this backend
                cannot serve.
            cosyvino.errors.BackendError: the backend cannot prepare here (e.g. its export
                dependencies, or torch, are not installed).
        """
        if not os.path.isdir(model_dir):
            raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
        if not force:
            current, prepared, _ = cls.conversion_status(model_dir, out_dir, weights=weights)
            if current and prepared:
                return prepared
        return cls.convert(model_dir, out_dir, progress, weights=weights)

    @classmethod
    def conversion_summary(cls, manifest: dict) -> tuple[str, dict]:
        """What ``cosyvino convert`` reports about a dir :meth:`convert` wrote, from its
        manifest: (runtime label for the one-line summary, e.g. ``"OpenVINO 2026.4.1"``; extra
        fields of ``--json``, e.g. ``{"openvino": "2026.4.1"}``). Default: (``name``, {})."""
        return cls.name, {}

    @classmethod
    @abc.abstractmethod
    def load(cls, model_dir: str, **options) -> Stages:
        """Load the model in ``model_dir`` and return its :class:`Stages`.

        Raises:
            cosyvino.errors.ModelDirError / CheckpointError / ConfigError: bad model dir.
            cosyvino.errors.BackendError: the backend cannot run here.
        """
