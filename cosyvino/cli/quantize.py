"""``cosyvino quantize``: fp32 converted dir -> NNCF-quantized converted dir (export side;
imports openvino and nncf only when run). Registered in :mod:`cosyvino.cli` with one
``add_command`` line."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import click

from cosyvino.cli.errors import friendly_errors as _friendly_errors
from cosyvino.errors import ModelDirError

PRESET_NAMES = ("int8-llm-only", "int8", "int4-llm")


def _finite(ctx, param, value):
    if value is not None and not math.isfinite(value):  # NaN would silently disable a guard
        raise click.BadParameter("must be a finite number")
    return value


#: key of a bare ``--snr-floor DB``: every floored stage the preset quantizes statically
ALL_FLOORS = "*"


def _parse_floors(ctx, param, values):
    """``("estimator=40", "30")`` -> {"estimator": 40.0, "*": 30.0}; later values win (a bare
    number, key :data:`ALL_FLOORS`, replaces the ones before it)."""
    from cosyvino.quantize.floors import FLOOR_STAGES

    out: dict[str, float] = {}
    for v in values:
        stage, sep, num = v.rpartition("=")
        stages = [stage.strip()] if sep else [ALL_FLOORS]
        if sep and stage.strip() not in FLOOR_STAGES:
            raise click.BadParameter(f"{v!r}: unknown stage {stage.strip()!r}; known: "
                                     f"{', '.join(FLOOR_STAGES)}")
        try:
            db = float(num)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected [STAGE=]DB, e.g. estimator=40") from None
        if not math.isfinite(db):
            raise click.BadParameter(f"{v!r}: must be a finite number")
        if not sep:
            out.clear()
        out.update({st: db for st in stages})
    return out


def _use_it(out: str) -> str:
    """How to use the written dir. A dir the planner finds by itself (a preset's sub-dir of
    the model dir) is best served through a new plan: naming the backend on `synth` would
    drop the plan's KV-cache and stage precisions (found by a fresh-user trial)."""
    from cosyvino.quantize.model_dir import DEFAULT_SUBDIR

    out = os.path.abspath(out)
    if os.path.basename(out) in DEFAULT_SUBDIR.values():
        return (f"use it: cosyvino plan --model-dir {os.path.dirname(out)} (the plan serves "
                "the fastest dir for this CPU with its KV cache and stage precisions), then "
                "cosyvino serve, or cosyvino synth TEXT")
    return f"use it: cosyvino synth --backend openvino --model-dir {out} TEXT"


def _resolve_floors(floors: dict, preset: str, hift: str) -> dict:
    """A bare floor (:data:`ALL_FLOORS`) -> each floored stage ``preset`` / ``hift``
    quantize statically (a floor for a stage left unquantized is an error of the API)."""
    from cosyvino.quantize.accuracy import STAGE_GROUP
    from cosyvino.quantize.floors import FLOOR_STAGES
    from cosyvino.quantize.model_dir import HIFT_STAGES, PRESETS

    floors = dict(floors)
    bare = floors.pop(ALL_FLOORS, None)
    if bare is not None:
        static = list(PRESETS[preset].static) + (list(HIFT_STAGES) if hift == "int8" else [])
        for group in FLOOR_STAGES:
            if group not in floors and any(STAGE_GROUP.get(s) == group for s in static):
                floors[group] = bare
    return floors


@click.command("quantize")
@click.option("--model-dir", type=click.Path(file_okay=False), default=None,
              help="Model dir with openvino/ IRs, or a converted dir (default: the embedded "
                   "default model).")
@click.option("--calib", type=click.Path(exists=True), default=None,
              help="Calibration texts file or dir (default: the shipped calib/ set); its "
                   "calibration split feeds the capture, its evaluation split the report.")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default="int8-llm-only",
              show_default=True,
              help="int8-llm-only: LLM INT8 weight-only, rest copied. int8: LLM + text "
                   "encoder INT8 weight-only, flow encoder + estimator static INT8 (captured "
                   "inputs). int4-llm: LLM INT4 weight-only (AWQ + scale estimation on "
                   "captured LLM inputs), rest fp32.")
@click.option("--hift", type=click.Choice(["fp32", "int8"]), default="fp32", show_default=True,
              help="HiFT vocoder: float (fp32 compute; the int8 preset stores its weights in "
                   "fp16, docs/quantization.md), or static INT8 (vocoders are sensitive; check "
                   "SNR).")
@click.option("--int8-weights", type=click.Choice(["auto", "asym", "sym"]), default="auto",
              show_default=True,
              help="INT8 weight-only stages (LLM, text encoder): per-channel scale + zero point "
                   "(asym) or scale only (sym). auto: sym on a CPU without int8 dot products "
                   "(AVX2 without VNNI: the weights are widened per use, and sym decodes "
                   "faster there), asym elsewhere.")
@click.option("--llm-weights", type=click.Choice(["int8", "int4"]), default=None,
              help="The LLM's weights whatever the preset says [default: the preset's: "
                   "int4 for int4-llm, int8 otherwise]. `--preset int8 --llm-weights int4`: "
                   "the fastest decode (half the weight bytes per token), at the accuracy the "
                   "report's LLM row shows; --data-free and the INT4 options apply.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output dir [default: next to the fp32 IRs: openvino-int8-llm, "
                   "openvino-int8, openvino-int4-llm].")
@click.option("--subset", type=click.IntRange(min=1), default=4, show_default=True,
              help="Calibration texts per language for the capture (5 languages).")
@click.option("--estimator-samples", type=click.IntRange(min=1), default=120,
              show_default=True,
              help="Estimator calls kept for calibration, spread evenly over the Euler steps.")
@click.option("--llm-sequences", type=click.IntRange(min=1), default=8, show_default=True,
              help="Utterances of captured LLM inputs for INT4 AWQ / scale estimation.")
@click.option("--speech-tokens", type=click.IntRange(min=1), default=None,
              help="Force this many speech tokens per segment in the capture and the audio "
                   "report (bounds their time) [default: until EOS].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the capture (synthesis and subsets) and of the audio report.")
@click.option("--smooth-quant-alpha", type=float, default=-1.0, show_default=True,
              callback=_finite, help="SmoothQuant alpha for MatMuls (static INT8), e.g. 0.5 "
                                     "or 0.95; < 0 disables SmoothQuant (the measured best "
                                     "on the synthetic 300M).")
@click.option("--ignore-sensitive/--quantize-all", default=True, show_default=True,
              help="Keep the sensitive layers (estimator time MLP, first/last convs ...) fp32.")
@click.option("--int4-mode", type=click.Choice(["asym", "sym"]), default="asym",
              show_default=True, help="INT4 weights with or without a zero point.")
@click.option("--group-size", type=click.Choice(["64", "128"]), default="128",
              show_default=True, help="INT4 group size (input channels per scale).")
@click.option("--ratio", type=click.FloatRange(min=0, min_open=True, max=1), default=1.0,
              show_default=True, help="Share of LLM layers in INT4 (the rest INT8).")
@click.option("--data-free", is_flag=True,
              help="INT4 LLM without AWQ / scale estimation (int4-llm: no capture at all; "
                   "int8 still captures for its static stages).")
@click.option("--eval-per-language", type=click.IntRange(min=0), default=2, show_default=True,
              help="Held-out texts per language for the accuracy report (0 = skip it).")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=20, show_default=True,
              help="Forced speech tokens per text in the LLM teacher-forced report.")
@click.option("--max-kl", type=click.FloatRange(min=0), default=None, callback=_finite,
              help="Fail (exit 1, nothing written) when the LLM mean KL vs fp32 exceeds this.")
@click.option("--max-mel-l1", type=click.FloatRange(min=0), default=None, callback=_finite,
              help="Fail when the mean mel L1 (natural-log units) vs fp32 exceeds this.")
@click.option("--max-lsd", type=click.FloatRange(min=0), default=None, callback=_finite,
              help="Fail when the mean mel log-spectral distance (dB) exceeds this.")
@click.option("--min-snr", type=float, default=None, callback=_finite,
              help="Fail when the mean waveform SNR (dB) vs fp32 is below this.")
@click.option("--snr-floor", "snr_floors", multiple=True, callback=_parse_floors,
              metavar="[STAGE=]DB",
              help="Accuracy floor of a static INT8 stage (estimator, flow_encoder, vocoder; "
                   "a bare DB: every one the preset quantizes statically): below it, measured "
                   "on this machine (mean waveform SNR vs fp32, the stage alone), the stage "
                   "is written fp32 instead [defaults: estimator 45, flow_encoder 45, "
                   "vocoder 25 dB]. Repeatable.")
@click.option("--keep-below-floor", is_flag=True,
              help="Keep an INT8 stage below its --snr-floor (with a warning) instead of "
                   "writing it fp32.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the full accuracy report (per text) as JSON here.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for capture and report.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_friendly_errors
def quantize(model_dir, calib, preset, hift, int8_weights, llm_weights, out_dir, subset,
             estimator_samples, llm_sequences, speech_tokens, seed, smooth_quant_alpha,
             ignore_sensitive, int4_mode, group_size, ratio,
             data_free, eval_per_language, eval_tokens, max_kl, max_mel_l1, max_lsd, min_snr,
             snr_floors, keep_below_floor, report_path, threads, as_json):
    """Quantize converted OpenVINO IRs with NNCF (needs openvino + nncf; no torch).

    The output is a converted dir with its own manifest (use it with
    `--backend openvino --model-dir OUT`); it appears atomically, and only when every
    --max-*/--min-* guard passes. The accuracy report compares with fp32 on held-out texts:
    LLM teacher-forced top-1 agreement and KL; mel L1, log-spectral distance and waveform SNR
    per quantized audio stage and end to end. It is measured on this machine (INT8 kernels
    differ by CPU: the manifest records the CPU model and ISA flags); a static INT8 stage
    below its --snr-floor here is written fp32 instead.
    """
    from cosyvino.defaults import ensure_default_model
    from cosyvino.errors import BackendError

    try:
        from cosyvino.quantize import (
            CaptureLimits,
            Guards,
            QuantizeGuardError,
            StaticSettings,
            WeightSettings,
            quantize_model_dir,
        )
    except ImportError as e:
        raise BackendError(f"cosyvino quantize needs openvino and nncf ({e}); "
                           "pip install 'cosyvino[openvino,nncf]'") from None
    from cosyvino.quantize.calibration import load_calibration_set

    model_dir = model_dir or ensure_default_model()
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    guards = Guards(max_kl=max_kl, max_mel_l1=max_mel_l1, max_lsd=max_lsd, min_snr=min_snr)
    if (max_kl is not None or guards.audio) and eval_per_language == 0:
        raise click.BadParameter("the --max-*/--min-* guards need the accuracy report "
                                 "(--eval-per-language > 0)")
    eval_texts = (load_calibration_set(calib, split="evaluation",
                                       limit_per_language=eval_per_language)
                  if eval_per_language else None)
    llm_int4 = llm_weights == "int4" or (preset == "int4-llm" and llm_weights is None)
    if not llm_int4:
        ctx = click.get_current_context()
        given = [f"--{n.replace('_', '-')}" for n in ("data_free", "int4_mode", "group_size",
                                                      "ratio")
                 if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)} "
                                   f"{'applies' if len(given) == 1 else 'apply'} to an INT4 "
                                   "LLM only (--preset int4-llm or --llm-weights int4); "
                                   "this command writes the LLM in int8")
    needs_capture = preset == "int8" or hift == "int8" or (llm_int4 and not data_free)
    calib_texts = (load_calibration_set(calib, split="calibration", limit_per_language=subset,
                                        seed=seed) if needs_capture else None)
    start = time.perf_counter()

    def say(msg):
        click.echo(f"[{time.perf_counter() - start:6.1f} s] {msg}", err=True)

    try:
        out, summary = quantize_model_dir(
            model_dir, out_dir, preset=preset, hift=hift, calib_texts=calib_texts,
            eval_texts=eval_texts, eval_tokens=eval_tokens, guards=guards,
            limits=CaptureLimits(estimator=estimator_samples, llm_sequences=llm_sequences),
            static=StaticSettings(smooth_quant_alpha=smooth_quant_alpha,
                                  ignore_sensitive=ignore_sensitive),
            int4=WeightSettings(f"INT4_{int4_mode.upper()}", group_size=int(group_size),
                                ratio=ratio, awq=not data_free,
                                scale_estimation=not data_free),
            seed=seed, speech_tokens=speech_tokens, num_threads=threads,
            snr_floors=_resolve_floors(snr_floors, preset, hift),
            keep_below_floor=keep_below_floor, int8_weights=int8_weights,
            llm_weights=llm_weights, progress=say)
    except QuantizeGuardError as e:
        if as_json:
            click.echo(json.dumps({"error": str(e), "accuracy": e.report}, indent=2,
                                  ensure_ascii=False))
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if report_path:
        with open(report_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
    if as_json:
        click.echo(json.dumps(summary, indent=2, ensure_ascii=False))
        return out
    for stage, s in summary["stages"].items():
        mode = f" ({s['mode']})" if s.get("mode") else ""
        click.echo(f"{stage}: {s['precision']}{mode} {s['fp32_bin_bytes'] / 1e6:.1f} MB -> "
                   f"{s['bin_bytes'] / 1e6:.1f} MB ({s['size_ratio']:.0%})")
    click.echo(f"all files: {summary['fp32_bytes'] / 1e6:.1f} MB -> "
               f"{summary['bytes'] / 1e6:.1f} MB ({summary['size_ratio']:.0%})")
    acc = summary["accuracy"] or {}
    if "llm" in acc:
        a = acc["llm"]
        click.echo(f"LLM vs fp32: top-1 agreement {a['top1_agreement']:.3f}, mean KL "
                   f"{a['mean_kl']:.2e}, max KL {a['max_kl']:.2e} ({a['positions']} positions)")
    if "audio" in acc:
        from cosyvino.quantize.accuracy import format_audio_table
        click.echo("audio vs fp32:\n" + format_audio_table(acc["audio"]))
    from cosyvino.quantize.floors import describe_floor
    from cosyvino.quantize.machine import describe

    if summary.get("accuracy"):
        click.echo(f"accuracy measured on: {describe(summary['machine'])}")
    else:  # `--eval-per-language 0`: the machine is still recorded, nothing was measured
        click.echo(f"quantized on: {describe(summary['machine'])} (no accuracy measured)")
    for group, verdict in summary["floors"].items():
        warn = verdict["verdict"] in ("refused", "kept", "unmeasured")
        click.echo(("warning: " if warn else "") + describe_floor(group, verdict))
    click.echo(f"wrote {out} in {summary['seconds']:.1f} s")
    click.echo(_use_it(out))
    return out
