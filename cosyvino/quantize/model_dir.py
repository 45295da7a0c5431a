"""``quantize_model_dir``: fp32 converted dir -> quantized converted dir (atomic), with an
accuracy report against fp32 and ``max_*`` guards checked before anything appears."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import nncf
import openvino as ov

from .. import __version__
from ..converted import (
    FORMAT,
    MANIFEST,
    file_record,
    find_converted_dir,
    sha256_file,
    validate_converted_dir,
    write_manifest,
)
from ..errors import InputError
from ..families import ROLES, GraphTable, ModelFamily, detect_family
from ..fileutil import replace_dir
from .accuracy import (
    F32_OPTIONS,
    STAGE_GROUP,
    audio_is_finite,
    audio_report,
    format_audio_table,
    format_table,
    llm_teacher_forced_report,
    report_is_finite,
)
from .capture import CaptureLimits, capture_calibration
from .floors import SNR_FLOORS_DB, describe_floor, floor_verdicts
from .graph_capture import capture_graph_calibration, runner_of
from . import graph_accuracy
from .machine import machine_record
from .static import StaticSettings, quantize_static
from .weights import WeightSettings, compress_ir

log = logging.getLogger("cosyvino.quantize")
Progress = Callable[[str], None]
#: Recipes, capture groups, fp16 storage and floors name graph ROLES
#: (:data:`cosyvino.families.ROLES`, declared by each family's graph table), never a family's
#: graph names; a family whose table has no graph of a role simply has nothing of it to treat
#: (CosyVoice2: no ``length_regulator``). The roles are named after the v1 graphs that play
#: them, so for v1 a role and its graph have one name.
#:
#: role -> the :class:`.capture.Capture` group holding its recorded inputs: the dataset of
#: its static INT8 (the inputs its table entry names: ``hift_f0`` takes the ``mel`` of a
#: vocoder item) or of its data-aware INT4 (``llm``: whole utterances of the stateful IR)
CAPTURE_GROUPS = {"estimator": "estimator", "flow_encoder": "flow_encoder",
                  "hift_decode": "vocoder", "hift_f0": "vocoder", "llm": "llm"}
#: capture group -> the :class:`.capture.CaptureLimits` field that bounds it
CAPTURE_LIMIT_FIELDS = {"estimator": "estimator", "flow_encoder": "flow_encoder",
                        "vocoder": "vocoder", "llm": "llm_sequences"}
#: roles on the LLM path (changing one of them calls for the LLM report)
LLM_ROLES = ("text_encoder", "speech_embedding", "llm_embedding", "llm")


#: float stages the ``int8`` preset stores with fp16 weights (compute stays f32, or bf16 where
#: asked: the CPU plugin widens the weights once at compile time, so resident memory and speed
#: are unchanged) when no recipe quantized them. Halves their files at an accuracy cost far below
#: the INT8 estimator's (docs/performance.md, "Measurements behind code constants").
#: ``hift_source`` is left out: its constants build
#: the harmonic sine phases, where fp16 rounding would be a pitch error, for ~150 bytes saved.
FP16_STORAGE_STAGES = ("length_regulator", "hift_f0", "hift_decode")


@dataclass(frozen=True)
class Recipe:
    """Graph roles (:data:`cosyvino.families.ROLES`) per treatment. weights: role ->
    weight-only mode; static: roles quantized with ``nncf.quantize``; fp16: roles stored with
    fp16 weights when neither of those quantized them. Each applies to every graph of the
    role in the source dir's table (none: nothing to do)."""

    weights: dict = field(default_factory=dict)
    static: tuple = ()
    description: str = ""
    fp16: tuple = ()


PRESETS = {
    "int8-llm-only": Recipe({"llm": "INT8_ASYM"}, (),
                            "LLM INT8 weight-only; every other IR copied"),
    "int8": Recipe({"llm": "INT8_ASYM", "text_encoder": "INT8_ASYM"},
                   ("flow_encoder", "estimator"),
                   "LLM + text encoder INT8 weight-only, flow encoder + estimator static INT8; "
                   "HiFT and length regulator fp32 compute from fp16-stored weights "
                   "(--hift int8 for static INT8)", FP16_STORAGE_STAGES),
    "int4-llm": Recipe({"llm": "INT4"}, (),
                       "LLM INT4 weight-only (AWQ + scale estimation on captured inputs); "
                       "rest fp32"),
}
#: ``llm_weights`` choices of :func:`quantize_model_dir` -> the recipe's weight mode
#: ("INT4" = the caller's INT4 settings)
LLM_WEIGHTS = {"int8": "INT8_ASYM", "int4": "INT4"}
#: ``int8_weights`` choices of :func:`quantize_model_dir` (the NNCF mode of the recipes'
#: INT8 weight-only stages)
INT8_WEIGHT_MODES = ("auto", "asym", "sym")


def int8_weight_mode(choice: str, flags) -> str:
    """The NNCF mode (``INT8_ASYM`` / ``INT8_SYM``) for ``choice`` on a CPU with cpuinfo
    ``flags``. ``auto``: ``INT8_SYM`` where the CPU has no int8 dot products
    (:func:`cosyvino.planner.rules.int8_dot_products`): there the plugin widens every weight to
    f32 per use, and without a zero point to subtract the LLM decode step measured 0.94x the
    ASYM one (AVX2 Zen 3, f32 KV cache; docs/performance.md "LLM positional keys"); ``INT8_ASYM`` elsewhere
    (what the served INT8 dirs were measured with on AVX-512/AMX). Raises InputError for
    another choice."""
    from ..planner.rules import int8_dot_products

    if choice not in INT8_WEIGHT_MODES:
        raise InputError(f"int8_weights must be one of {', '.join(INT8_WEIGHT_MODES)}, "
                         f"got {choice!r}")
    if choice == "auto":
        choice = "asym" if int8_dot_products(flags) else "sym"
    return f"INT8_{choice.upper()}"


DEFAULT_SUBDIR = {"int8-llm-only": "openvino-int8-llm", "int8": "openvino-int8",
                  "int4-llm": "openvino-int4-llm"}
#: the vocoder graphs ``hift="int8"`` quantizes statically (``hift_source`` has no weights
#: worth it: its constants build the harmonic phases)
HIFT_STAGES = ("hift_f0", "hift_decode")


def source_family(src_dir: str) -> tuple[type[ModelFamily], GraphTable]:
    """The family of the converted dir ``src_dir`` and its graph table (for its config).

    Raises InputError: the family does not take quantization
    (:attr:`cosyvino.families.ModelFamily.quantizable`); ModelDirError / ConfigError:
    unreadable config."""
    family = detect_family(src_dir)
    if not family.quantizable:
        from ..families import family_classes

        ok = [name for name, f in family_classes().items() if f.quantizable]
        raise InputError(f"{src_dir} holds a {family.name!r} model; cosyvino quantize "
                         f"supports {', '.join(map(repr, ok))} conversions only")
    return family, family.graphs(family.read_config(src_dir))


def _refuse_family(model_dir: str) -> None:
    """InputError (:func:`source_family`'s) when ``model_dir`` (official or converted) is of a
    family quantize does not take: said before a missing conversion is. A dir whose family
    cannot be told is left to :func:`cosyvino.converted.find_converted_dir`'s error."""
    from ..errors import ModelDirError

    try:
        family = detect_family(model_dir)
    except ModelDirError:
        return
    if not family.quantizable:
        source_family(model_dir)


def source_graphs(src_dir: str) -> GraphTable:
    """The graph table of the converted dir ``src_dir`` (:func:`source_family`)."""
    return source_family(src_dir)[1]


def _check_roles(what: str, names) -> None:
    unknown = sorted(set(names) - set(ROLES))
    if unknown:
        raise InputError(f"{what}: unknown stages {unknown}; known: {', '.join(ROLES)}")


@dataclass(frozen=True)
class Guards:
    """Accuracy thresholds; None = not checked. max_kl: LLM mean KL (nats). max_mel_l1 /
    max_lsd (dB) / min_snr (dB): means over the evaluation texts of the report's overall audio
    variant (end to end when several audio stages changed)."""

    max_kl: float | None = None
    max_mel_l1: float | None = None
    max_lsd: float | None = None
    min_snr: float | None = None

    def __post_init__(self):
        for name in ("max_kl", "max_mel_l1", "max_lsd", "min_snr"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise InputError(f"{name} must be a finite number, got {v!r}")

    @property
    def audio(self) -> bool:
        return any(v is not None for v in (self.max_mel_l1, self.max_lsd, self.min_snr))


class QuantizeGuardError(RuntimeError):
    """An accuracy guard was exceeded (or a metric was not finite); nothing was written.
    ``report`` holds the accuracy report."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def _check_guards(guards: Guards, llm: dict | None, audio: dict | None) -> list[str]:
    failures = []
    if guards.max_kl is not None and llm is not None and (
            not report_is_finite(llm) or llm["mean_kl"] > guards.max_kl):
        failures.append(f"LLM mean KL {llm['mean_kl']:.3g} exceeds --max-kl {guards.max_kl:g}")
    if guards.audio and audio is not None:
        sc = audio["scopes"][audio["overall"]]
        finite = audio_is_finite(audio)
        where = f"({audio['overall']})"
        if guards.max_mel_l1 is not None and (not finite or sc["mean_mel_l1"]
                                              > guards.max_mel_l1):
            failures.append(f"mel L1 {sc['mean_mel_l1']:.4g} {where} exceeds --max-mel-l1 "
                            f"{guards.max_mel_l1:g}")
        if guards.max_lsd is not None and (not finite or sc["mean_lsd_db"] > guards.max_lsd):
            failures.append(f"LSD {sc['mean_lsd_db']:.4g} dB {where} exceeds --max-lsd "
                            f"{guards.max_lsd:g}")
        if guards.min_snr is not None and (not finite or sc["mean_snr_db"] < guards.min_snr):
            failures.append(f"SNR {sc['mean_snr_db']:.4g} dB {where} is below --min-snr "
                            f"{guards.min_snr:g}")
    return failures


def quantize_model_dir(model_dir: str, out_dir: str | None = None, *,
                       preset: str = "int8-llm-only", hift: str = "fp32",
                       calib_texts: Sequence | None = None,
                       eval_texts: Sequence | None = None, eval_tokens: int = 20,
                       guards: Guards | None = None, limits: CaptureLimits | None = None,
                       static: StaticSettings | None = None, int4: WeightSettings | None = None,
                       seed: int = 0, speech_tokens: int | None = None,
                       num_threads: int | None = None,
                       fp16_storage: Sequence[str] | None = None,
                       snr_floors: dict | None = None, keep_below_floor: bool = False,
                       int8_weights: str = "auto", llm_weights: str | None = None,
                       progress: Progress | None = None, show_progress: bool = True,
                       overwrite: bool = True) -> tuple[str, dict]:
    """Quantize the converted dir found at ``model_dir`` (a converted dir, or a model dir with
    ``openvino/``) into ``out_dir`` (default: next to the fp32 IRs, ``DEFAULT_SUBDIR[preset]``).

    Args:
        preset: a key of :data:`PRESETS`. hift: ``fp32`` or ``int8`` (static INT8 of HiFT's
            f0 predictor and decoder, needs captured vocoder inputs).
        calib_texts: calibration-split texts for the capture (needed by static stages and
            INT4 data-aware compression; INT4 without them is data-free).
        eval_texts: held-out texts for the accuracy report (LLM teacher-forced top-1 / KL with
            ``eval_tokens`` forced tokens per text when the LLM path changed; mel L1 / LSD /
            SNR when an audio stage changed). None skips the report.
        guards: thresholds; exceeded -> :class:`QuantizeGuardError`, nothing written.
        limits / static / int4: capture bounds, static INT8 settings, INT4 settings (None:
            the defaults of :class:`CaptureLimits`, :class:`StaticSettings`, INT4_ASYM).
        seed: capture and report seed.
        speech_tokens: force this many speech tokens per segment in the capture and the audio
            report (bounds their time; None = until EOS).
        fp16_storage: roles (:data:`cosyvino.families.ROLES`; for v1 the graph names) left
            unquantized by the recipe whose graphs' IRs are written with fp16
            weights (manifest precision ``fp16``; computed in f32 at load; scored by the audio
            report like a quantized stage). None = the preset's ``Recipe.fp16`` (``int8``:
            :data:`FP16_STORAGE_STAGES`); ``()`` copies every unquantized IR as fp32.
        snr_floors: report variant -> floor in dB, over :data:`.floors.SNR_FLOORS_DB`. A
            static INT8 stage whose variant (the stage alone quantized) scores a mean
            waveform SNR vs fp32 below its floor on this machine is written fp32 instead
            (files copied, manifest precision ``fp32``, the verdict under
            ``quantization.floors``) and the audio report is re-run on what was written;
            ``keep_below_floor`` keeps it INT8 (verdict ``kept``). Needs ``eval_texts``
            (without them: verdict ``unmeasured``). A floor for a stage the preset does not
            quantize statically: :class:`InputError`.
        int8_weights: the mode of the recipe's INT8 weight-only stages (LLM, text encoder):
            ``asym`` (per-channel scale + zero point), ``sym`` (scale only) or ``auto`` (by
            this machine, :func:`int8_weight_mode`). Recorded per stage in the manifest.
        llm_weights: the LLM's weight precision whatever the preset says: ``int8`` (the
            ``int8_weights`` mode) or ``int4`` (the ``int4`` settings); None = the preset's.
            ``int8`` with ``int4``: the fastest decode (the LLM step reads half the bytes;
            docs/performance.md "INT4 LLM in the int8 preset"), at the accuracy the report's
            LLM rows show.

    The manifest's ``quantization.machine`` (and the summary's ``machine``) records the CPU
    the report was measured on (:func:`.machine.machine_record`).

    The recipes apply by graph role (:class:`Recipe`), so any family with
    :attr:`~cosyvino.families.ModelFamily.quantizable` gets them: v1 through its own OpenVINO
    stages (:mod:`.capture`, :mod:`.accuracy`), a family whose stages run on a graph runner
    (CosyVoice2) through the runner (:mod:`.graph_capture`, :mod:`.graph_accuracy`).

    Returns ``(out_dir, summary)``. Raises :class:`InputError` for bad arguments, a family
    that does not take quantization (CosyVoice3 for now) or a source that is not an fp32
    conversion, :class:`ConvertedModelError` for a bad source dir.
    """
    from ..plugins import get_backend

    guards = guards or Guards()
    limits = limits or CaptureLimits()
    static = static or StaticSettings()
    int4 = int4 or WeightSettings("INT4_ASYM")
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    if hift not in ("fp32", "int8"):
        raise InputError(f"hift must be 'fp32' or 'int8', got {hift!r}")
    say = progress or (lambda msg: None)
    recipe = PRESETS[preset]
    if not int4.is_int4:
        raise InputError(f"int4 settings need an INT4 mode, got {int4.mode!r}")
    # "INT4" in a recipe = the caller's INT4 settings (mode, group size, ratio)
    int8_mode = int8_weight_mode(int8_weights, machine_record()["flags"])
    weights = dict(recipe.weights)
    if llm_weights is not None:
        if llm_weights not in LLM_WEIGHTS:
            raise InputError(f"llm_weights must be one of {', '.join(LLM_WEIGHTS)}, "
                             f"got {llm_weights!r}")
        weights["llm"] = LLM_WEIGHTS[llm_weights]
    weight_plan = {s: (int4 if m == "INT4" else
                       WeightSettings(int8_mode if m == "INT8_ASYM" else m))
                   for s, m in weights.items()}
    static_stages = list(recipe.static) + (list(HIFT_STAGES) if hift == "int8" else [])
    fp16_storage = recipe.fp16 if fp16_storage is None else tuple(fp16_storage)
    # the arguments are checked before the dir is touched, against the role names; the
    # source dir's own table says which graphs play them (and gives the stems)
    _check_roles("fp16_storage", fp16_storage)
    _check_roles(f"preset {preset!r}", [*weight_plan, *static_stages])
    floors = dict(SNR_FLOORS_DB)
    for group, value in (snr_floors or {}).items():
        if group not in SNR_FLOORS_DB:
            raise InputError(f"snr floor for {group!r}: no such stage; known: "
                             f"{', '.join(SNR_FLOORS_DB)}")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"snr floor for {group} must be a finite number, got {value!r}")
        if not any(STAGE_GROUP.get(st) == group for st in static_stages):
            raise InputError(f"preset {preset!r} (hift {hift}) quantizes no {group} stage "
                             "statically: drop its floor")
        floors[group] = float(value)
    fp16_stages = [s for s in fp16_storage if s not in weight_plan and s not in static_stages]
    audio_changed = [s for s in static_stages + fp16_stages if s in STAGE_GROUP]
    llm_changed = any(r in weight_plan for r in LLM_ROLES)
    if (guards.max_kl is not None and not llm_changed) or (guards.audio and not audio_changed):
        raise InputError(f"preset {preset!r} (hift {hift}) leaves the guarded stages "
                         "unchanged: drop the guard")
    if (guards.max_kl is not None or guards.audio) and not eval_texts:
        raise InputError("accuracy guards need evaluation texts")
    if static_stages and not calib_texts:
        raise InputError(f"preset {preset!r} needs calibration texts (static INT8 of "
                         f"{', '.join(static_stages)})")
    _refuse_family(os.fspath(model_dir))
    src_dir, source_dir = find_converted_dir(os.fspath(model_dir))
    src_dir = os.path.abspath(src_dir)
    say(f"validating {src_dir}")
    src = validate_converted_dir(src_dir, source_dir)
    family, table = source_family(src_dir)
    role_of = table.roles
    # roles -> this family's graphs (table order); a role it has no graph of drops out
    by_role = {r: table.with_role(r) for r in ROLES}
    weight_plan = {g: ws for r, ws in weight_plan.items() for g in by_role[r]}
    static_stages = [g for r in static_stages for g in by_role[r]]
    fp16_stages = [g for r in fp16_stages for g in by_role[r]]
    audio_changed = [g for g in static_stages + fp16_stages if role_of[g] in STAGE_GROUP]
    llm_changed = any(role_of[g] in LLM_ROLES for g in weight_plan)
    if src.get("weights") != "fp32":
        raise InputError(f"{src_dir} holds {src.get('weights')!r} IRs; quantize an fp32 "
                         "conversion (`cosyvino convert --weights fp32`)")
    if src.get("quantization"):
        raise InputError(f"{src_dir} is already quantized")
    out_dir = os.path.abspath(out_dir or os.path.join(os.path.dirname(src_dir),
                                                      DEFAULT_SUBDIR[preset]))
    if out_dir == src_dir:
        raise InputError("the output dir must differ from the fp32 converted dir")
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    start = time.perf_counter()
    backend = get_backend("openvino")
    ref_stages = None
    try:
        data_aware = [g for g, ws in weight_plan.items() if bool(calib_texts)
                      and ws.is_int4 and (ws.awq or ws.scale_estimation)
                      and role_of[g] in CAPTURE_GROUPS]
        # the capture groups some stage reads: static INT8 stages and data-aware INT4 weights
        read = {CAPTURE_GROUPS[role_of[g]] for g in [*static_stages, *data_aware]}
        need_capture = bool(read)
        capture = None
        if need_capture:
            ref_stages = backend.load(src_dir, num_threads=num_threads, **F32_OPTIONS)
            say(f"capturing stage inputs: {len(calib_texts)} calibration texts, seed {seed}")
            # keep nothing that no stage reads (e.g. vocoder inputs with --hift fp32, LLM
            # inputs with INT8 or data-free INT4 weights)
            limits = replace(limits, **{field: 0 for group, field in CAPTURE_LIMIT_FIELDS.items()
                                        if group not in read})
            if runner_of(ref_stages) is not None:  # stages over a graph runner: by role
                capture = capture_graph_calibration(
                    src_dir, calib_texts, ref_stages, family, seed=seed, limits=limits,
                    show_progress=show_progress, speech_tokens=speech_tokens)
            else:  # v1's own OpenVINO stages
                capture = capture_calibration(src_dir, calib_texts, seed=seed, limits=limits,
                                              stages=ref_stages, show_progress=show_progress,
                                              speech_tokens=speech_tokens)
            cs = capture.summary()
            parts = {"estimator": f"{cs['estimator']} estimator calls (Euler steps "
                                  f"{cs['estimator_steps']})",
                     "flow_encoder": f"{cs['flow_encoder']} flow-encoder calls",
                     "llm": f"{cs['llm_sequences']} LLM utterances ({cs['llm_items']} items)",
                     "vocoder": f"{cs['vocoder']} vocoder segments"}
            # name what was not kept as such, so that a 0 does not read as a failed capture
            unread = [g.replace("_", " ") for g in parts if g not in read]
            say("captured " + ", ".join(v for g, v in parts.items() if g in read)
                + (f" (not needed here: {', '.join(unread)})" if unread else "")
                + f"; {cs['bytes'] / 1e6:.0f} MB")
        files, stage_stats = {}, {}

        def xml(stage: str) -> str:
            return os.path.join(src_dir, table[stage].stem + ".xml")

        def record(stage: str, model: ov.Model, precision: str, info: dict, t0: float):
            stem = table[stage].stem
            model.set_rt_info(precision, ["cosyvino", "weights"])
            # quantized IRs keep their uncompressed constants (norms, biases) fp32 like the
            # source IR; only fp16 storage compresses every float constant
            ov.save_model(model, os.path.join(tmp, stem + ".xml"),
                          compress_to_fp16=precision == "fp16")
            for ext in (".xml", ".bin"):
                files[stem + ext] = file_record(os.path.join(tmp, stem + ext), stage=stage,
                                                precision=precision)
            fp32 = src["files"][stem + ".bin"]["size"]
            size = files[stem + ".bin"]["size"]
            stage_stats[stage] = info | {"role": role_of[stage], "precision": precision,
                                         "seconds": time.perf_counter() - t0,
                                         "fp32_bin_bytes": fp32, "bin_bytes": size,
                                         "size_ratio": size / fp32}
            say(f"{stage}: {fp32 / 1e6:.1f} MB -> {size / 1e6:.1f} MB "
                f"({stage_stats[stage]['seconds']:.1f} s)")

        for stage, ws in weight_plan.items():
            say(f"compressing {stage} weights ({ws.mode})")
            t0 = time.perf_counter()
            data = (getattr(capture, CAPTURE_GROUPS[role_of[stage]])
                    if capture and role_of[stage] in CAPTURE_GROUPS else None)
            model, info = compress_ir(xml(stage), ws, data)
            if ws.is_int4 and not info["data_aware"]:
                say(f"{stage}: data-free INT4 ({info['data_free_reason']})")
            record(stage, model, ws.precision, info, t0)
            del model
        for stage in static_stages:
            say(f"static INT8 of {stage} ({static.describe()})")
            t0 = time.perf_counter()
            names = table[stage].input_names
            samples = [{n: d[n] for n in names}
                       for d in getattr(capture, CAPTURE_GROUPS[role_of[stage]])]
            # the recipe (ignored scope) is the role's
            model = quantize_static(xml(stage), role_of[stage], samples, static)
            record(stage, model, "int8-static", dict(static.describe(),
                                                     samples=len(samples)), t0)
            del model
        del capture
        for stage in fp16_stages:
            t0 = time.perf_counter()
            model = ov.Core().read_model(xml(stage))
            record(stage, model, "fp16", {"storage": "fp16 weights, f32 compute"}, t0)
            del model
        for name, rec in src["files"].items():
            if name not in files:
                # files may sit in sub-dirs (CosyVoice2: the tokenizer's CosyVoice-BlankEN/)
                os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
                shutil.copyfile(os.path.join(src_dir, name), os.path.join(tmp, name))
                files[name] = dict(rec)
        quant = {"preset": preset, "hift": hift, "nncf_version": nncf.__version__,
                 "source_converted_dir": src_dir,
                 "source_manifest_sha256": sha256_file(os.path.join(src_dir, MANIFEST)),
                 "seed": seed, "speech_tokens": speech_tokens, "stages": stage_stats,
                 "machine": machine_record()}
        if need_capture:
            quant["capture"] = {"texts": len(calib_texts), "limits": limits.__dict__}
        manifest = {k: v for k, v in src.items() if k != "checksum"} | {
            "format": FORMAT, "cosyvino_version": __version__,
            "openvino_version": ov.get_version(), "files": files, "quantization": quant}
        write_manifest(tmp, manifest)
        validate_converted_dir(tmp)
        accuracy = None

        def llm_report(ref, test, texts, tokens):
            if runner_of(ref) is None:  # v1's own stages
                return llm_teacher_forced_report(ref, test, texts, tokens)
            return graph_accuracy.llm_teacher_forced_report(ref, test, texts, family,
                                                            (src_dir, tmp), tokens)

        def audio(ref, test, changed):
            if runner_of(ref) is None:
                return audio_report(ref, test, eval_texts, changed, seed, speech_tokens)
            return graph_accuracy.audio_report(ref, test, eval_texts,
                                               [role_of[g] for g in changed], family,
                                               src_dir, seed, speech_tokens)

        if eval_texts:
            accuracy = {}
            if ref_stages is None:
                ref_stages = backend.load(src_dir, num_threads=num_threads, **F32_OPTIONS)
            test_stages = backend.load(tmp, num_threads=num_threads, **F32_OPTIONS)
            if llm_changed:
                say(f"accuracy (LLM): {len(eval_texts)} texts x {eval_tokens} forced tokens")
                accuracy["llm"] = llm_report(ref_stages, test_stages, eval_texts, eval_tokens)
                say("LLM, quantized vs fp32:\n" + format_table(accuracy["llm"]))
            if audio_changed:
                say(f"accuracy (audio): {len(eval_texts)} texts")
                accuracy["audio"] = audio(ref_stages, test_stages, audio_changed)
                say("audio, quantized vs fp32:\n" + format_audio_table(accuracy["audio"]))
            del test_stages
            verdicts = floor_verdicts(static_stages, accuracy.get("audio"), floors,
                                      keep_below_floor, roles=role_of)
            refused = [st for v in verdicts.values() if v["verdict"] == "refused"
                       for st in v["stages"]]
            for group, v in verdicts.items():
                say(describe_floor(group, v))
            if refused:
                for stage in refused:
                    stem = table[stage].stem
                    for ext in (".xml", ".bin"):
                        shutil.copyfile(os.path.join(src_dir, stem + ext),
                                        os.path.join(tmp, stem + ext))
                        files[stem + ext] = dict(src["files"][stem + ext], stage=stage,
                                                 precision="fp32")
                    group = STAGE_GROUP[role_of[stage]]
                    v = verdicts[group]
                    size = files[stem + ".bin"]["size"]
                    stage_stats[stage] = stage_stats[stage] | {
                        "precision": "fp32", "bin_bytes": size, "size_ratio": 1.0,
                        "int8_refused": f"{group} SNR {v['snr_db']:.2f} dB < "
                                        f"floor {v['floor_db']:g} dB"}
                write_manifest(tmp, manifest)
                validate_converted_dir(tmp)
                audio_changed = [st for st in audio_changed if st not in refused]
                if audio_changed:
                    say(f"accuracy (audio) of what is written: {len(eval_texts)} texts")
                    test_stages = backend.load(tmp, num_threads=num_threads, **F32_OPTIONS)
                    accuracy["audio"] = audio(ref_stages, test_stages, audio_changed)
                    del test_stages
                    say("audio, as written vs fp32:\n" + format_audio_table(accuracy["audio"]))
                else:
                    accuracy.pop("audio", None)
            failures = _check_guards(guards, accuracy.get("llm"), accuracy.get("audio"))
            if failures:
                raise QuantizeGuardError("; ".join(failures) + "; nothing written", accuracy)
            quant["floors"] = verdicts
            quant["accuracy"] = {k: {kk: vv for kk, vv in v.items() if kk != "per_text"}
                                 for k, v in accuracy.items()}
            write_manifest(tmp, manifest)  # now with the accuracy summary
            validate_converted_dir(tmp)
        else:
            quant["floors"] = verdicts = floor_verdicts(static_stages, None, floors, True,
                                                        roles=role_of)
            for group, v in verdicts.items():
                say("warning: " + describe_floor(group, v))
            if verdicts:
                write_manifest(tmp, manifest)
                validate_converted_dir(tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        del ref_stages
    total = time.perf_counter() - start
    say(f"done in {total:.1f} s: {out_dir}")
    fp32_total = sum(r["size"] for r in src["files"].values())
    out_total = sum(r["size"] for r in files.values())
    return out_dir, {"out": out_dir, "preset": preset, "hift": hift, "seconds": total,
                     "stages": stage_stats, "fp32_bytes": fp32_total, "bytes": out_total,
                     "size_ratio": out_total / fp32_total, "accuracy": accuracy,
                     "machine": quant["machine"], "floors": quant["floors"]}
