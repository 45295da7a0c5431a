"""The ``cosyvino`` command line (click). Human tables by default, ``--json`` for machines.

Typed cosyvino errors exit with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys

import click

from cosyvino.cli.errors import friendly_errors
from cosyvino.errors import BackendError, InputError, ModelDirError

DEMO_SENTENCES = (
    ("zh", "中文女", "你好，欢迎使用 cosyvino，这是在普通服务器处理器上运行的语音合成服务。"),
    ("en", "英文女", "Hello! This is cosyvino, fast CosyVoice speech synthesis on an ordinary "
                    "server CPU."),
)


_friendly_errors = friendly_errors


def _stage_table(stats: dict) -> str:
    rows = [("stage", "seconds", "calls")]
    for name, v in stats["stages"].items():
        rows.append((name, f"{v['seconds']:.3f}", str(v["calls"])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _summary(stats: dict) -> str:
    parts = [f"audio {stats['audio_seconds']:.2f} s", f"wall {stats['wall_seconds']:.2f} s",
             f"RTF {stats['rtf']:.3f}" if stats.get("rtf") else "RTF n/a",
             f"{stats['speech_tokens']} speech tokens"]
    if stats.get("first_segment_latency") is not None:
        parts.append(f"first segment {stats['first_segment_latency']:.2f} s")
    return ", ".join(parts)


def _synthesizer(model_dir, backend, threads):
    from cosyvino.defaults import ensure_default_model
    from cosyvino.synthesizer import Synthesizer

    # the CLI's default path: creates the synthetic default model once, and says so loudly
    return Synthesizer(model_dir or ensure_default_model(), backend=backend,
                       num_threads=threads)


_model_dir_opt = click.option("--model-dir", type=click.Path(file_okay=False), default=None,
                              help="Model directory (default: the embedded default model).")
_backend_opt = click.option("--backend", default="torch", show_default=True,
                            help="Backend plugin (see `cosyvino backends`).")
_threads_opt = click.option("--threads", type=click.IntRange(min=1), default=None,
                            help="CPU threads for inference.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cosyvino")
def main():
    """cosyvino: CosyVoice text-to-speech, fast on CPU servers."""


@main.command()
@click.argument("text", required=False)
@_model_dir_opt
@click.option("--speaker", "-s", default=None,
              help="Speaker id (see `cosyvino speakers`; default: the model's first speaker).")
@click.option("--text-file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the text from a file ('-' = stdin).")
@click.option("-o", "--output", default="out.wav", show_default=True, help="Output file.")
@click.option("--format", "fmt", type=click.Choice(["wav", "flac", "mp3", "ogg"]), default=None,
              help="Audio format (default: from the output extension).")
@click.option("--speed", type=float, default=1.0, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=None)
@click.option("--num-speech-tokens", type=click.IntRange(min=1), default=None,
              help="Force this many speech tokens per segment (50 = 1 s; benchmarking).")
@_backend_opt
@_threads_opt
@click.option("--json", "as_json", is_flag=True, help="Print stats as JSON.")
@_friendly_errors
def synth(text, model_dir, speaker, text_file, output, fmt, speed, seed, num_speech_tokens,
          backend, threads, as_json):
    """Synthesize TEXT (or --text-file) to an audio file."""
    if text_file is not None:
        if text is not None:
            raise InputError("give either TEXT or --text-file, not both")
        text = text_file.read()
    if text is None:
        raise InputError("no text: pass TEXT or --text-file")
    synth_ = _synthesizer(model_dir, backend, threads)
    speaker = speaker or synth_.speakers[0]
    audio = _synthesize_with_progress(synth_, text, speaker, speed, seed, num_speech_tokens)
    audio.write(output, fmt)
    stats = dict(audio.stats, output=os.path.abspath(output), sample_rate=audio.sample_rate,
                 speaker=speaker, backend=backend)
    if as_json:
        click.echo(json.dumps(stats, ensure_ascii=False, indent=2))
    else:
        click.echo(_stage_table(stats))
        click.echo(f"wrote {output} (speaker {speaker}, backend {backend}): {_summary(stats)}")


def _synthesize_with_progress(synth_, text, speaker, speed, seed, num_speech_tokens):
    from tqdm import tqdm

    with tqdm(desc="segments", unit="seg", file=sys.stderr, leave=False,
              disable=not sys.stderr.isatty()) as bar:
        def advance(done, total):
            bar.total = total
            bar.update(1)
        return synth_.synthesize(text, speaker, speed=speed, seed=seed,
                                 num_speech_tokens=num_speech_tokens, on_segment=advance)


@main.command()
@_model_dir_opt
@_backend_opt
@_threads_opt
@click.option("--out-dir", default=".", show_default=True, help="Where to write demo-*.wav.")
@click.option("--seed", type=int, default=0, show_default=True)
@_friendly_errors
def demo(model_dir, backend, threads, out_dir, seed):
    """Synthesize a Chinese and an English sentence; print per-stage times and RTF.

    Without --model-dir this uses the embedded default model, created once as a SYNTHETIC
    CosyVoice-300M checkpoint (random weights: real cost, noise audio).
    """
    from cosyvino.families.cosyvoice1.synthetic import is_synthetic

    synth_ = _synthesizer(model_dir, backend, threads)
    click.echo(f"model: {synth_.model_dir} (backend {backend}, load {synth_.load_seconds:.1f} s)"
               + (" [SYNTHETIC random weights: expect noise]"
                  if is_synthetic(synth_.model_dir) else ""))
    for lang, speaker, text in DEMO_SENTENCES:
        if speaker not in synth_.speakers:
            speaker = synth_.speakers[0]
        audio = synth_.synthesize(text, speaker, seed=seed)
        path = os.path.join(out_dir, f"demo-{lang}.wav")
        audio.write(path)
        click.echo(f"\n[{lang}] {speaker}: {text}")
        click.echo(_stage_table(audio.stats))
        click.echo(f"wrote {path}: {_summary(audio.stats)}")


@main.command()
@_model_dir_opt
@click.option("--json", "as_json", is_flag=True)
@_friendly_errors
def speakers(model_dir, as_json):
    """List the speaker ids of a model (official dir: spk2info.pt; converted dir such as
    D/openvino or D/onnx: speakers.json)."""
    from cosyvino.converted import is_converted_dir, read_speaker_names
    from cosyvino.defaults import ensure_default_model

    model_dir = model_dir or ensure_default_model()
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    if is_converted_dir(model_dir):  # no torch needed: names are in speakers.json
        names = read_speaker_names(model_dir)
    else:
        from cosyvino.families.cosyvoice1.checkpoint import load_spk2info

        names = list(load_spk2info(os.path.join(model_dir, "spk2info.pt")))
    click.echo(json.dumps(names, ensure_ascii=False) if as_json else "\n".join(names))


@main.command("make-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--preset", type=click.Choice(["tiny", "300m"]), default="tiny", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--hift-weight-norm", type=click.Choice(["parametrizations", "weight_g"]),
              default="parametrizations", show_default=True,
              help="Key spelling of the weight-normed convolutions in hift.pt.")
@click.option("--overwrite", is_flag=True, help="Replace OUT_DIR if it exists.")
@_friendly_errors
def make_model_cmd(out_dir, preset, seed, hift_weight_norm, overwrite):
    """Write a SYNTHETIC checkpoint (random weights, official layout) to OUT_DIR."""
    from tqdm import tqdm

    from cosyvino.families.cosyvoice1.synthetic import make_model

    try:  # the generator builds our torch model to get the official keys and shapes
        import torch  # noqa: F401
    except ImportError as e:
        raise BackendError(f"cosyvino make-model needs torch ({e}); "
                           "pip install 'cosyvino[torch]'") from e

    if os.path.exists(out_dir) and not overwrite:
        raise InputError(f"{out_dir} already exists; pick a new directory or use --overwrite")
    with tqdm(total=4, desc=f"make-model {preset}", file=sys.stderr,
              disable=not sys.stderr.isatty()) as bar:
        def step(msg):
            bar.set_postfix_str(msg)
            bar.update(1)
        make_model(preset, out_dir, seed=seed, hift_weight_norm=hift_weight_norm,
                   overwrite=overwrite, progress=step)
    click.echo(f"wrote synthetic {preset} model to {out_dir}")


@main.command()
@_model_dir_opt
@click.option("--json", "as_json", is_flag=True)
@_friendly_errors
def info(model_dir, as_json):
    """Summarize a model directory (config, files, parameter counts, speakers).

    For a converted dir (D/openvino, D/onnx) the files and their precision come from its
    manifest and the speakers from speakers.json; parameter counts are not shown there."""
    from cosyvino.defaults import default_model_dir
    from cosyvino.families.cosyvoice1.info import model_info

    data = model_info(model_dir or default_model_dir())
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, indent=2))
        return
    for key, value in data.items():
        if isinstance(value, dict):
            click.echo(f"{key}:")
            for k, v in value.items():
                click.echo(f"  {k}: {v}")
        else:
            click.echo(f"{key}: {value}")


@main.command()
@_friendly_errors
def backends():
    """List installed backend plugins."""
    from cosyvino.plugins import backend_classes, plugin_errors

    for name, cls in sorted(backend_classes().items()):
        ok, why = cls.is_available()
        click.echo(f"{name}: {cls.description}" + ("" if ok else f" (unavailable: {why})"))
    for name, err in plugin_errors().items():
        click.echo(f"{name}: FAILED TO LOAD: {err}")


from cosyvino.cli.bench import bench  # noqa: E402  (command modules register on the group)
from cosyvino.cli.convert import convert  # noqa: E402
from cosyvino.cli.plan import plan  # noqa: E402
from cosyvino.cli.quantize import quantize  # noqa: E402
from cosyvino.cli.serve import serve  # noqa: E402

for _command in (convert, bench, quantize, serve, plan):
    main.add_command(_command)


if __name__ == "__main__":
    main()
