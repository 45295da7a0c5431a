"""``cosyvino voices add | list | remove``: registered voices (:mod:`cosyvino.voice_store`)
from the command line. Registered in :mod:`cosyvino.cli` with one ``add_command`` line.

``add`` runs only the prompt models (speaker embedding, speech tokenizer) and the prompt mel,
not the LLM, flow or vocoder: it reads the model's config, not its weights. The store is the
Synthesizer's (``<model-dir>/voices`` unless ``--voices-dir``), so a voice added here is used
by ``cosyvino synth -v NAME``, ``cosyvino serve`` and ``Synthesizer(...).synthesize(text,
NAME)`` alike.
"""

from __future__ import annotations

import json
import os

import click

from cosyvino.cli.errors import friendly_errors
from cosyvino.errors import InputError, ModelDirError

_model_dir_opt = click.option("--model-dir", type=click.Path(file_okay=False), default=None,
                              help="Model directory (default: the embedded default model).")
_voices_dir_opt = click.option("--voices-dir", type=click.Path(file_okay=False), default=None,
                               help="Where the voices are kept (default: "
                                    "<model-dir>/voices, where the Synthesizer and `serve` "
                                    "look).")


def _model_dir(model_dir: str | None) -> str:
    """``model_dir``, or the embedded default (which must exist: nothing to register voices
    for otherwise). Raises ModelDirError."""
    if model_dir is None:
        from cosyvino.defaults import default_model_dir

        model_dir = default_model_dir()
        if not os.path.isfile(os.path.join(model_dir, "cosyvoice.yaml")):
            raise ModelDirError(f"no model at the default location {model_dir}; pass "
                                "--model-dir", model_dir)
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    return model_dir


class _ConfigOnly:
    """What the family's ``prompt_encoder`` hook reads from loaded stages (the config), without
    loading the model's weights."""

    def __init__(self, config):
        self.config = config


def _store(model_dir: str, voices_dir: str | None, *, prompt_backend: str | None = None,
           threads: int | None = None):
    """(voice store, prompt encoder or None) of ``model_dir``, as a Synthesizer of it builds
    them (same directory rule, same checks, built-in speaker names reserved)."""
    from cosyvino.families import detect_family
    from cosyvino.voice_store import VoiceStore

    family = detect_family(model_dir)
    config = family.read_config(model_dir)
    options = {} if threads is None else {"num_threads": threads}
    encoder = family.prompt_encoder(model_dir, _ConfigOnly(config), backend=prompt_backend,
                                    **options)
    speakers = _speaker_names(model_dir, family)
    store = VoiceStore(voices_dir or os.path.join(model_dir, "voices"), family=family.name,
                       check=getattr(encoder, "check_voice", None), reserved=speakers)
    return store, encoder


def _speaker_names(model_dir: str, family) -> list[str]:
    """Built-in speaker names without loading the model (converted dir: speakers.json; an
    official dir: the family's reading of its checkpoint, which may need torch: none without
    it, and the Synthesizer then refuses a clashing name when it loads)."""
    from cosyvino.converted import is_converted_dir, read_speaker_names

    if is_converted_dir(model_dir):
        return list(read_speaker_names(model_dir))
    try:
        return list(family.speakers(model_dir))
    except (ImportError, OSError):
        return []


@click.group("voices")
def voices():
    """Registered voices: a recording processed once (speaker embedding, prompt speech tokens,
    prompt mel, transcript) and stored next to the model; then used by name everywhere
    (`cosyvino synth -v NAME`, `vc -v NAME`, the server's `voice`)."""


@voices.command("add")
@click.argument("name")
@click.option("--prompt-wav", type=click.Path(dir_okay=False), required=True,
              help="The recording (1-30 s; wav, flac, mp3, ogg, ...).")
@click.option("--prompt-text", default=None,
              help="Its transcript (zero-shot by default); without it the voice runs "
                   "cross-lingual.")
@click.option("--overwrite", is_flag=True, help="Replace a registered voice of this name.")
@_model_dir_opt
@_voices_dir_opt
@click.option("--prompt-backend", default=None,
              help="Backend running the prompt models (default: OpenVINO, else ONNX Runtime).")
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the voice as JSON.")
@friendly_errors
def add(name, prompt_wav, prompt_text, overwrite, model_dir, voices_dir, prompt_backend,
        threads, as_json):
    """Register voice NAME from --prompt-wav (and its --prompt-text).

    The name and the recording are checked before the prompt models load (1-64 letters,
    digits, '_', '-', '.'; not a built-in speaker; the recording readable, 1-30 s, not
    silent)."""
    from cosyvino.prompt_audio import MEL_RATE, PromptAudioError, load_prompt_audio

    if prompt_text is not None and not prompt_text.strip():
        raise InputError("--prompt-text is empty (leave it out for a voice without a "
                         "transcript)")
    from cosyvino.voice_store import VoiceExistsError

    store, encoder = _store(_model_dir(model_dir), voices_dir, prompt_backend=prompt_backend,
                            threads=threads)
    try:
        store.check_new(name, overwrite=overwrite)
    except VoiceExistsError as e:
        if name in store.reserved or name.casefold() in {r.casefold() for r in store.reserved}:
            raise
        raise VoiceExistsError(f"a voice named {name!r} is already registered in "
                               f"{store.directory}; pass --overwrite to replace it, or pick "
                               "another name", name) from None
    try:  # at the family's prompt-mel rate (v1 22.05 kHz, CosyVoice2 24 kHz)
        audio = load_prompt_audio(prompt_wav, mel_rate=getattr(encoder, "mel_rate", MEL_RATE))
    except PromptAudioError as e:
        e.args = (f"--prompt-wav: {e}",) + e.args[1:]
        raise
    if encoder is None:
        raise InputError("this model has no prompt models (voice cloning needs campplus.onnx "
                         "and speech_tokenizer_v1.onnx in the model dir)")
    try:
        voice = store.add(encoder.voice(audio, name=name, prompt_text=prompt_text),
                          overwrite=overwrite)
    finally:
        encoder.close()
    info = store.info(voice.name)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
    else:
        click.echo(f"registered voice {name!r} ({info['prompt_seconds']:.2f} s prompt, "
                   f"{info['prompt_tokens']} prompt tokens, "
                   + ("with transcript" if prompt_text else "no transcript: cross-lingual")
                   + f") in {store.directory}")


@voices.command("list")
@_model_dir_opt
@_voices_dir_opt
@click.option("--json", "as_json", is_flag=True,
              help="A JSON list of voice objects (name, prompt_text, prompt_seconds, "
                   "prompt_tokens, created, sha256, ...).")
@friendly_errors
def list_(model_dir, voices_dir, as_json):
    """List the registered voices (built-in speakers: `cosyvino speakers`). Files that fail
    their checks are reported on stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reported below, once
        store, _ = _store(_model_dir(model_dir), voices_dir)
        infos = [store.info(n) for n in store.snapshot()]
    for name, why in sorted(store.skipped.items()):
        click.echo(f"warning: skipped voice {name!r}: {why}", err=True)
    if as_json:
        click.echo(json.dumps(infos, ensure_ascii=False, indent=2))
        return
    if not infos:
        click.echo(f"no registered voices in {store.directory}", err=True)
        return
    for v in infos:
        text = v["prompt_text"] if v["prompt_text"] is not None else "(no transcript)"
        click.echo(f"{v['name']}\t{v['prompt_seconds']:.2f} s\t{text}")


@voices.command("remove")
@click.argument("name")
@_model_dir_opt
@_voices_dir_opt
@friendly_errors
def remove(name, model_dir, voices_dir):
    """Unregister voice NAME (its file is deleted)."""
    store, _ = _store(_model_dir(model_dir), voices_dir)
    if name in store.reserved:
        raise InputError(f"{name!r} is a built-in speaker of the model; only registered voices "
                         "can be removed")
    store.remove(name)
    click.echo(f"removed voice {name!r} from {store.directory}")
