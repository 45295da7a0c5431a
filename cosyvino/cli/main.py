"""The ``cosyvino`` command line (click). Human tables by default, ``--json`` for machines.

Typed cosyvino errors exit with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys

import click

from cosyvino.version import __version__
from cosyvino.cli.errors import friendly_errors
from cosyvino.errors import BackendError, InputError, ModelDirError, UnknownSpeakerError
from cosyvino.request import HOP_SCHEDULES, MAX_SPEED, MAX_TIMESTEPS, MIN_SPEED, MIN_TIMESTEPS

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
    if stats.get("first_audio_seconds") is not None:
        parts.append(f"first audio {stats['first_audio_seconds']:.2f} s")
    elif stats.get("first_segment_latency") is not None:
        parts.append(f"first segment {stats['first_segment_latency']:.2f} s")
    return ", ".join(parts)


#: what ``synth`` writes: the audio file formats of :data:`cosyvino.audio.FORMATS` and ``raw``
#: (int16 little-endian mono PCM at the model rate, no header; the only format for ``-o -``)
OUTPUT_FORMATS = ("wav", "flac", "mp3", "ogg", "raw")
#: file extensions that mean ``raw``
_RAW_EXTENSIONS = ("raw", "pcm")


def _read_text(text: str | None, text_file: str | None) -> str:
    """The text to speak, from TEXT or ``--text-file`` (``-`` = stdin), decoded as UTF-8.

    Raises InputError: both or neither given, an unreadable file, bytes that are not UTF-8
    (with the offset of the first bad byte), or TEXT with undecodable bytes from the command
    line (Python keeps them as lone surrogates)."""
    if text_file is not None:
        if text is not None:
            raise InputError("give either TEXT or --text-file, not both")
        name = "stdin" if text_file == "-" else text_file
        try:
            if text_file == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(text_file, "rb") as f:
                    data = f.read()
        except OSError as e:
            raise InputError(f"cannot read --text-file {name}: {e.strerror or e}") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"--text-file {name} is not valid UTF-8: byte 0x{data[e.start]:02x} "
                             f"at offset {e.start}; convert it (e.g. iconv -t UTF-8)") from None
    if text is None:
        raise InputError("no text: pass TEXT or --text-file")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"TEXT is not valid UTF-8 (undecodable bytes at character {e.start}); "
                         "check the terminal's encoding or use --text-file") from None
    return text


def _output_format(output: str, fmt: str | None) -> str:
    """The format ``output`` is written in: ``--format``, else the extension (none = wav; .raw
    or .pcm = raw); ``-`` (stdout) is raw only. Checked before any model loads.

    Raises InputError: unknown format, stdout with a container format, a missing output
    directory, an output path that is a directory."""
    if output == "-":
        if fmt not in (None, "raw"):
            raise InputError(f"-o - writes raw int16 PCM to stdout; {fmt} needs a file "
                             "(give -o NAME.{fmt}) or use --format raw")
        return "raw"
    ext = os.path.splitext(output)[1].lstrip(".").lower()
    fmt = fmt or ("raw" if ext in _RAW_EXTENSIONS else ext or "wav")
    if fmt not in OUTPUT_FORMATS:
        raise InputError(f"unknown audio format {fmt!r} (from -o {output}); choose one of "
                         f"{', '.join(OUTPUT_FORMATS)} (by extension or --format)")
    if os.path.isdir(output):
        raise InputError(f"output {output} is a directory; give a file name")
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):  # a typo must not waste the synthesis
        raise InputError(f"output directory does not exist: {directory}")
    return fmt


def _run_settings(ctx, plan_path, model_dir, backend, threads) -> dict:
    """Model dir, backend, threads and backend options for ``demo`` / ``synth``: those of the
    plan ``serve`` would use (:func:`cosyvino.server.config.find_plan` /
    :func:`~cosyvino.server.config.settings_from_plan`: ``--plan``, ``$COSYVINO_PLAN``,
    ``./plan.toml``, ``<model-dir>/plan.toml``), with flags given explicitly winning (the plan's
    backend options, e.g. its precision, go with its backend: dropped when ``--backend``
    overrides it). A plan made for another model than ``--model-dir`` is not used.

    Returns {"model_dir", "backend", "threads", "backend_options", "source", "notes"}:
    ``source`` says where the values came from, ``notes`` what was not used and why.

    Raises InputError / PlanError: an unreadable plan file."""
    from cosyvino.cli.plan_settings import merge_plan

    settings, source, notes = merge_plan(
        ctx, {"model_dir": model_dir, "backend": backend, "threads": threads}, plan_path)
    return dict(settings, source=source, notes=notes)


def _describe(run: dict) -> str:
    """One line saying what will run and where that came from."""
    opts = run["backend_options"]
    parts = [f"backend {run['backend']}", f"threads {run['threads'] or 'default'}"]
    precision = {k: v for k, v in opts.items() if "precision" in k}
    if precision:
        parts.append(", ".join(f"{k} {v}" for k, v in sorted(precision.items())))
    return ", ".join(parts) + f" ({run['source']})"


def _check_before_load(model_dir: str | None, text: str | None, speaker: str | None,
                       voices_dir: str | None = None) -> None:
    """What can be checked without loading the model: the text has something to speak (the
    model family's frontend on the model's config; the embedded default's v1 frontend while
    that model does not exist yet; None: no text, voice conversion) and the speaker is one of
    the model's built-in speakers or registered voices (``voices_dir``, default
    ``<model_dir>/voices``).

    Raises EmptyTextError / UnknownSpeakerError / ModelDirError / ConfigError."""
    if model_dir is None:
        from cosyvino.defaults import default_model_dir

        default = default_model_dir()
        model_dir = default if os.path.isfile(os.path.join(default, "cosyvoice.yaml")) else None
    elif not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    if model_dir is None:
        from cosyvino.frontend import TextFrontend  # the embedded default is a v1 model

        if text is not None:
            TextFrontend().segments(text)
        return
    from cosyvino.families import detect_family

    family = detect_family(model_dir)
    if text is not None:
        family.make_frontend(family.read_config(model_dir)).segments(text)
    if speaker is not None:
        names = _speaker_names(model_dir, required=False)
        if names is not None and speaker not in names:
            registered, skipped = _registered_voices(model_dir, voices_dir, family.name)
            if speaker in skipped:  # stored, but its file failed the checks: say so
                from cosyvino.voice_store import CorruptVoiceError

                raise CorruptVoiceError(
                    f"voice {speaker!r} is registered but its file is unusable "
                    f"({skipped[speaker]}); register it again: cosyvino voices add "
                    f"{speaker} --prompt-wav FILE --overwrite", model_dir)
            if speaker not in registered:
                raise UnknownSpeakerError(speaker, names, registered)


def _registered_voices(model_dir: str, voices_dir: str | None, family: str
                       ) -> tuple[list[str], dict[str, str]]:
    """Names of the voices registered for ``model_dir`` (``voices_dir``, default
    ``<model_dir>/voices``; the Synthesizer's rule) and the stored ones whose files failed
    their checks (name -> why), read without loading the model."""
    import warnings

    from cosyvino.voice_store import VoiceStore

    directory = voices_dir or os.path.join(model_dir, "voices")
    with warnings.catch_warnings():  # a skipped file is reported by the Synthesizer later
        warnings.simplefilter("ignore")
        store = VoiceStore(directory, family=family)
        return list(store.snapshot()), dict(store.skipped)


def _speaker_names(model_dir: str, *, required: bool = True) -> list[str] | None:
    """Speaker ids of a model dir without loading the model (converted dir: speakers.json;
    official dir: the names in spk2info.pt, read without torch; a legacy non-zip file needs
    torch: None when torch is missing and not ``required``)."""
    from cosyvino.converted import is_converted_dir, read_speaker_names

    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    if is_converted_dir(model_dir):  # no torch needed: names are in speakers.json
        from cosyvino.families import detect_family

        family = detect_family(model_dir)
        if family.name != "cosyvoice1":  # its own serving files (v2: voices.json)
            return family.speakers(model_dir)
        return read_speaker_names(model_dir)
    from cosyvino.families.cosyvoice1.checkpoint import read_speaker_names

    path = os.path.join(model_dir, "spk2info.pt")
    if not required and not os.path.isfile(path):
        return None  # not a v1 dir: the loaded model's family knows its speakers
    try:
        return read_speaker_names(path)  # reads names without torch (zip checkpoints)
    except ImportError:  # a legacy checkpoint needs torch to be read
        if required:
            raise
        return None


def _synthesizer(run: dict, voices_dir: str | None = None):
    """Load the model of ``run`` (:func:`_run_settings`); without a model dir the embedded
    default, created once (the CLI's default path, and it says so loudly). ``voices_dir``:
    where registered voices are (None: ``<model_dir>/voices``)."""
    from cosyvino.defaults import ensure_default_model
    from cosyvino.synthesizer import Synthesizer

    extra = {} if voices_dir is None else {"voices_dir": voices_dir}
    return Synthesizer(run["model_dir"] or ensure_default_model(), backend=run["backend"],
                       num_threads=run["threads"], **extra, **run["backend_options"])


class _AudioSink:
    """Writes float32 chunks [S] as they arrive: to a file (one header, then the samples of
    each chunk; written into a temp file next to ``output`` and renamed into place when
    complete, so a failed or interrupted run leaves no truncated file) or, for ``-``, to stdout
    as raw int16 (flushed per chunk, for a player on the other end of a pipe). Samples are
    converted by the same rule as :meth:`cosyvino.audio.Audio.write`, so the file equals the
    one written from the whole audio."""

    def __init__(self, output: str, fmt: str, sample_rate: int):
        self.output, self.fmt, self.sample_rate = output, fmt, sample_rate
        self.samples_written = 0
        self._tmp = self._file = None
        if output == "-":
            self._stdout = sys.stdout.buffer
            return
        import tempfile

        import soundfile as sf

        from cosyvino.audio import FORMATS

        container, self._subtype = FORMATS[fmt] if fmt != "raw" else ("RAW", "PCM_16")
        fd, self._tmp = tempfile.mkstemp(prefix=".cosyvino-", suffix=f".{fmt}",
                                         dir=os.path.dirname(os.path.abspath(output)))
        os.close(fd)
        try:
            self._file = sf.SoundFile(self._tmp, "w", samplerate=sample_rate, channels=1,
                                      format=container, subtype=self._subtype)
        except BaseException:
            os.unlink(self._tmp)
            raise

    def write(self, samples) -> None:
        import numpy as np

        from cosyvino.audio import float_to_int16

        if self._file is None:
            self._stdout.write(float_to_int16(samples).astype("<i2").tobytes())
            self._stdout.flush()
        elif self._subtype == "PCM_16":
            self._file.write(float_to_int16(samples))
        else:
            self._file.write(np.clip(samples, -1.0, 1.0))
        self.samples_written += len(samples)

    def close(self) -> None:
        """Finish the file (header sizes) and put it in place. Raises InputError when nothing
        was written (no empty audio files)."""
        if self._file is None:
            return
        from cosyvino.fileutil import publish

        try:
            self._file.close()
            if not self.samples_written:
                raise InputError("refusing to write an empty audio file")
            publish(self._tmp, self.output)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the temp file (the output is not touched)."""
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._tmp is not None and os.path.exists(self._tmp):
            os.unlink(self._tmp)


_plan_opt = click.option("--plan", "plan_path", type=click.Path(dir_okay=False), default=None,
                         help="Plan file from `cosyvino plan` (default: as `serve`: "
                              "$COSYVINO_PLAN, ./plan.toml, <model-dir>/plan.toml). Its "
                              "backend, threads and precision are used; explicit flags win.")
_model_dir_opt = click.option("--model-dir", type=click.Path(file_okay=False), default=None,
                              help="Model directory (default: the embedded default model).")
_run_model_dir_opt = click.option("--model-dir", type=click.Path(file_okay=False), default=None,
                                  help="Model directory (default: the plan's, else the "
                                       "embedded default model).")
_backend_opt = click.option("--backend", default="torch", show_default="torch, or the plan's",
                            help="Backend plugin (see `cosyvino backends`).")
_threads_opt = click.option("--threads", type=click.IntRange(min=1), default=None,
                            help="CPU threads for inference (default: the plan's, else the "
                                 "backend's).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="cosyvino")
def main():
    """cosyvino: CosyVoice text-to-speech, fast on CPU servers."""


def _output_options(fn):
    """The output, streaming and run options ``synth`` and ``vc`` share."""
    for option in reversed((
            click.option("-o", "--output", default="out.wav", show_default=True,
                         help="Output file ('-' = raw int16 PCM on stdout, e.g. for a "
                              "player)."),
            click.option("--format", "fmt", type=click.Choice(OUTPUT_FORMATS), default=None,
                         help="Audio format (default: from the output extension; raw = int16 "
                              "LE mono PCM at the model rate, no header)."),
            click.option("--stream", is_flag=True,
                         help="Write audio as it is synthesized (the file grows chunk by "
                              "chunk and is put in place when complete; with -o - a player "
                              "gets each chunk at once) and print the time to first audio."),
            click.option("--hop-schedule", type=click.Choice(HOP_SCHEDULES), default=None,
                         help="How audio is cut into chunks (default: the library's: token "
                              "hops for --stream, whole segments otherwise). The same "
                              "schedule and seed give the same audio with and without "
                              "--stream."),
            click.option("--speed", type=click.FloatRange(MIN_SPEED, MAX_SPEED), default=1.0,
                         show_default=True),
            click.option("--seed", type=click.IntRange(min=0), default=None),
            click.option("--n-timesteps", type=click.IntRange(MIN_TIMESTEPS, MAX_TIMESTEPS),
                         default=None,
                         help="Flow-matching ODE steps (one estimator call each; default: the "
                              "model's, 10 for v1). Fewer is faster and further from the "
                              "official audio: docs/performance.md, \"ODE steps\"."),
            click.option("--num-speech-tokens", type=click.IntRange(min=1), default=None,
                         help="Force this many speech tokens per segment (50 = 1 s; "
                              "benchmarking)."),
            click.option("--voices-dir", type=click.Path(file_okay=False), default=None,
                         help="Where registered voices are (default: <model-dir>/voices; "
                              "see `cosyvino voices`)."),
            _plan_opt, _backend_opt, _threads_opt,
            click.option("--json", "as_json", is_flag=True,
                         help="Print stats as JSON (on stderr when the audio goes to "
                              "stdout)."))):
        fn = option(fn)
    return fn


def _read_recording(path: str | None, option: str, *, source: bool = False,
                    mel_rate: int | None = None):
    """``path`` read and checked as a prompt (or, ``source``, a voice-conversion source)
    recording before the model loads: the :class:`cosyvino.prompt_audio.PromptAudio` the
    library then uses as is (None for None), its prompt-mel waveform at ``mel_rate`` (None:
    v1's 22050 Hz; the loaded family's: :func:`_at_family_rate`).

    Raises the ``PromptAudioError`` s of :func:`cosyvino.prompt_audio.load_prompt_audio`
    (their messages name the problem and the limit), prefixed with the option."""
    if path is None:
        return None
    from cosyvino.prompt_audio import SOURCE_MIN_SECONDS, PromptAudioError, load_prompt_audio

    kw = {"what": "source audio", "min_seconds": SOURCE_MIN_SECONDS} if source else {}
    if mel_rate is not None:
        kw["mel_rate"] = mel_rate
    try:
        return load_prompt_audio(path, **kw)
    except PromptAudioError as e:
        raise _prefixed(e, option) from None


def _at_family_rate(audio, path: str | None, option: str, synth_, *, source: bool = False):
    """``audio`` (read by :func:`_read_recording` before the model loaded) read again from
    ``path`` when the loaded family's prompt encoder takes another prompt-mel rate (CosyVoice2:
    24 kHz); as is otherwise."""
    rate = getattr(synth_.prompt_encoder, "mel_rate", None)
    if audio is None or rate is None or audio.mel_rate == rate:
        return audio
    return _read_recording(path, option, source=source, mel_rate=rate)


def _prefixed(e, option: str):
    """``e`` with ``option`` in front of its message (same type and attributes)."""
    e.args = (f"{option}: {e}",) + e.args[1:]
    return e


def _check_text_option(value: str | None, option: str) -> str | None:
    if value is not None and not value.strip():
        raise InputError(f"{option} is empty")
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{option} is not valid UTF-8; check the terminal's encoding"
                             ) from None
    return value


def _run_synthesis(ctx, **kwargs):
    """:func:`_synthesis` with the library's mode-input names in its InputErrors given as this
    CLI's options (:func:`with_cli_names`)."""
    try:
        _synthesis(ctx, **kwargs)
    except InputError as e:
        if type(e) is not InputError:  # typed subclasses keep their own message
            raise
        raise InputError(with_cli_names(str(e))) from None


def _synthesis(ctx, *, text, model_dir, voice, output, fmt, stream, hop_schedule, speed,
                   seed, num_speech_tokens, n_timesteps, voices_dir, plan_path, backend, threads, as_json,
                   mode=None, prompt_wav=None, prompt_text=None, instruct=None,
                   source_wav=None, command="synth"):
    """What ``synth`` and ``vc`` do: check everything that can be checked before the model
    loads (text, output, recordings, voice name), load it, synthesize (whole or streamed) in
    the mode the inputs select (``mode`` None: the library's first fit), write the audio and
    print the stats."""
    given_fmt = fmt
    fmt = _output_format(output, fmt)
    if given_fmt is None and output != "-" and not os.path.splitext(output)[1]:
        click.echo(f"note: {output} has no extension: writing WAV (name it .mp3/.flac/... or "
                   "give --format)", err=True)
    prompt_audio = _read_recording(prompt_wav, "--prompt-wav")
    source_audio = _read_recording(source_wav, "--source-wav", source=True)
    prompt_text = _check_text_option(prompt_text, "--prompt-text")
    instruct = _check_text_option(instruct, "--instruct")
    if prompt_audio is not None and voice is not None:
        raise InputError("give either a voice (-s/-v) or --prompt-wav (a recording), not both")
    echo = (lambda msg: click.echo(msg, err=True)) if output == "-" else click.echo
    run = _run_settings(ctx, plan_path, model_dir, backend, threads)
    for note in run["notes"]:
        click.echo(f"note: {note}", err=True)
    _check_before_load(run["model_dir"], None if source_audio is not None else text, voice,
                       voices_dir)
    click.echo(f"cosyvino {command}: {_describe(run)}; model dir "
               f"{run['model_dir'] or 'the embedded default'}", err=True)
    synth_ = _synthesizer(run, voices_dir)
    prompt_audio = _at_family_rate(prompt_audio, prompt_wav, "--prompt-wav", synth_)
    source_audio = _at_family_rate(source_audio, source_wav, "--source-wav", synth_, source=True)
    prompted = prompt_audio is not None or source_audio is not None
    if voice is None and not prompted and synth_.speakers:
        voice = synth_.speakers[0]
        click.echo(f"voice: {voice} (the model's first speaker; -s picks another)", err=True)
    options = dict(speed=speed, seed=seed, num_speech_tokens=num_speech_tokens,
                   n_timesteps=n_timesteps)
    inputs = {"mode": mode, "prompt_audio": prompt_audio, "prompt_text": prompt_text,
              "instruction": instruct, "source_audio": source_audio}
    options.update({k: v for k, v in inputs.items() if v is not None})
    if hop_schedule is not None:
        options["hop_schedule"] = hop_schedule
    # validated here, before any audio: the mode the request runs in, for the report
    request = synth_.request(text, voice, **options)
    mode_used = _mode_of(synth_, request)
    if stream:
        stats = _stream_to(synth_, output, fmt, text, voice, options)
    else:
        audio = _synthesize_with_progress(synth_, text, voice, options)
        sink = _AudioSink(output, fmt, audio.sample_rate) if fmt == "raw" else None
        if sink is None:
            audio.write(output, fmt)
        else:
            sink.write(audio.samples)
            sink.close()
        stats = dict(audio.stats)
    who = voice if voice is not None else f"prompt {prompt_wav}"
    stats.update(output="-" if output == "-" else os.path.abspath(output), format=fmt,
                 sample_rate=synth_.sample_rate, speaker=voice, mode=mode_used,
                 prompt_wav=prompt_wav, source_wav=source_wav, backend=run["backend"],
                 threads=run["threads"], backend_options=run["backend_options"],
                 settings_source=run["source"])
    if as_json:
        echo(json.dumps(stats, ensure_ascii=False, indent=2))
    else:
        echo(_stage_table(stats))
        echo(f"wrote {output} ({mode_used}, voice {who}, backend {run['backend']}): "
             f"{_summary(stats)}")


#: the library's names of the mode inputs (in its error messages) -> the CLI's options
CLI_INPUT_NAMES = {"prompt_audio": "--prompt-wav", "prompt_text": "--prompt-text",
                   "instruction": "--instruct", "source_audio": "--source-wav"}


def with_cli_names(message: str) -> str:
    """``message`` (a library InputError's) with the mode inputs named as the CLI options
    that give them (``prompt_audio`` -> ``--prompt-wav``, ...)."""
    return re.sub(r"\b(" + "|".join(CLI_INPUT_NAMES) + r")\b",
                  lambda m: CLI_INPUT_NAMES[m.group(1)], message)


def _mode_of(synth_, request) -> str | None:
    """The mode ``request`` runs in: the named one, else the first of the model's modes the
    request fits (the library's rule; cheap: no prompt processing)."""
    if request.mode is not None:
        return request.mode
    try:  # SynthesisRequest's own matching (it reads no audio); only a label here
        voice = request._voice(synth_.voices) if request.voice is not None else None
        return request._mode(synth_.engine.modes, voice, {}).name
    except Exception:  # noqa: BLE001 - the synthesis itself reports real errors
        return None


@main.command()
@click.argument("text", required=False)
@_run_model_dir_opt
@click.option("--speaker", "-s", default=None,
              help="Speaker id (see `cosyvino speakers`) or registered voice (default: the "
                   "model's first speaker).")
@click.option("--voice", "-v", "voice_name", default=None,
              help="A registered voice (`cosyvino voices add`): zero-shot with its stored "
                   "transcript, cross-lingual without one.")
@click.option("--prompt-wav", type=click.Path(dir_okay=False), default=None,
              help="Clone the voice of this recording (1-30 s; wav, flac, mp3, ogg, ...): "
                   "zero-shot with --prompt-text, cross-lingual without.")
@click.option("--prompt-text", default=None,
              help="Transcript of --prompt-wav (zero-shot), or replacing a registered "
                   "voice's.")
@click.option("--instruct", default=None,
              help="Instruction for the speaker (instruct mode; Instruct models), e.g. "
                   "'A calm, gentle narrator.'.")
@click.option("--mode", default=None,
              help="Synthesis mode (sft, zero_shot, cross_lingual, instruct; default: the "
                   "first the inputs fit).")
@click.option("--text-file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Read the text (UTF-8) from a file ('-' = stdin).")
@_output_options
@click.pass_context
@_friendly_errors
def synth(ctx, text, model_dir, speaker, voice_name, prompt_wav, prompt_text, instruct, mode,
          text_file, output, fmt, stream, hop_schedule, speed, seed, n_timesteps,
          num_speech_tokens, voices_dir, plan_path, backend, threads, as_json):
    """Synthesize TEXT (or --text-file) to an audio file.

    \b
    Modes (docs/voice-cloning.md):
      -s SPEAKER                            built-in speaker (sft)
      --prompt-wav F --prompt-text T        zero-shot voice cloning
      --prompt-wav F                        cross-lingual (language tag in TEXT, e.g. <|en|>)
      -s SPEAKER --instruct T               instruct (CosyVoice-300M-Instruct)
      --prompt-wav F --instruct T           instruct2 (CosyVoice2; -v NAME for a voice)
      -v NAME                               a registered voice (`cosyvino voices add`)

    Everything that can be checked before the model loads is checked first: the text (UTF-8,
    something to speak), the output format and directory, the prompt recording (readable,
    1-30 s, not silent), the voice name.
    """
    text = _read_text(text, text_file)
    if speaker is not None and voice_name is not None:
        raise InputError("give either -s/--speaker or -v/--voice, not both")
    _run_synthesis(ctx, text=text, model_dir=model_dir, voice=voice_name or speaker,
                   output=output, fmt=fmt, stream=stream, hop_schedule=hop_schedule,
                   speed=speed, seed=seed, num_speech_tokens=num_speech_tokens,
                   n_timesteps=n_timesteps,
                   voices_dir=voices_dir, plan_path=plan_path, backend=backend,
                   threads=threads, as_json=as_json, mode=mode, prompt_wav=prompt_wav,
                   prompt_text=prompt_text, instruct=instruct)


@main.command()
@_run_model_dir_opt
@click.option("--source-wav", type=click.Path(dir_okay=False), required=True,
              help="The recording to convert (0.2-30 s): what is said.")
@click.option("--prompt-wav", type=click.Path(dir_okay=False), default=None,
              help="A recording of the target voice (1-30 s).")
@click.option("--voice", "-v", "voice_name", default=None,
              help="A registered voice as the target, instead of --prompt-wav.")
@_output_options
@click.pass_context
@_friendly_errors
def vc(ctx, model_dir, source_wav, prompt_wav, voice_name, output, fmt, stream, hop_schedule,
       speed, seed, n_timesteps, num_speech_tokens, voices_dir, plan_path, backend, threads,
       as_json):
    """Voice conversion: say what --source-wav says in the voice of --prompt-wav (or of a
    registered voice, -v). No text and no LLM: the source's speech tokens go through the flow
    and the vocoder conditioned on the target voice."""
    if (prompt_wav is None) == (voice_name is None):
        raise InputError("give the target voice: --prompt-wav FILE or -v/--voice NAME (one "
                         "of them)")
    _run_synthesis(ctx, text="", model_dir=model_dir, voice=voice_name, output=output,
                   fmt=fmt, stream=stream, hop_schedule=hop_schedule, speed=speed, seed=seed,
                   num_speech_tokens=num_speech_tokens, n_timesteps=n_timesteps,
                   voices_dir=voices_dir,
                   plan_path=plan_path, backend=backend, threads=threads, as_json=as_json,
                   mode="vc", prompt_wav=prompt_wav, source_wav=source_wav, command="vc")


def _stream_to(synth_, output, fmt, text, speaker, options: dict) -> dict:
    """Run :meth:`Synthesizer.stream`, writing each chunk as it comes (:class:`_AudioSink`);
    prints the time to first audio and, at the end, the RTF on stderr. Returns the stats of
    the whole synthesis (as :meth:`Synthesizer.synthesize`'s, plus ``first_audio_seconds``:
    from the start of synthesis to the first chunk written)."""
    import time

    from cosyvino.timing import StageTimes, audio_stats

    times, tokens, chunks, first, seed_used = StageTimes(), 0, 0, None, None
    start = time.perf_counter()
    sink = _AudioSink(output, fmt, synth_.sample_rate)
    chunk_stream = None
    try:
        from cosyvino.audio import chunk_position, smooth_join

        chunk_stream = synth_.stream(text, speaker, **options)
        done = 0
        for chunk in chunk_stream:
            seg, index, last = chunk_position(chunk.stats, done)
            done += int(last)
            # the segment-join fades of Synthesizer.synthesize and the server
            sink.write(smooth_join(chunk.samples, seg, chunk_stream.total, synth_.sample_rate,
                                   first=index == 0, last=last))
            chunks += 1
            tokens += int(chunk.speech_tokens.size)
            seed_used = chunk.stats.get("seed", seed_used)
            for name, v in chunk.stats.get("stages", {}).items():
                times.seconds[name] += v["seconds"]
                times.calls[name] += v["calls"]
            if first is None:
                first = time.perf_counter() - start
                click.echo(f"first audio after {first:.2f} s", err=True)
        sink.close()
    except BaseException:
        sink.abort()
        if chunk_stream is not None:
            chunk_stream.close()  # stops what is still running
        raise
    wall = time.perf_counter() - start
    stats = audio_stats(times, sink.samples_written / synth_.sample_rate, wall, tokens)
    stats.update(chunks=chunks, first_audio_seconds=round(first, 4) if first else None,
                 seed=seed_used)
    # first audio and RTF are in the caller's summary line; the live line above gave the first
    click.echo(f"streamed {chunks} chunks", err=True)
    return stats


def _synthesize_with_progress(synth_, text, speaker, options: dict):
    from tqdm import tqdm

    with tqdm(desc="segments", unit="seg", file=sys.stderr, leave=False,
              disable=not sys.stderr.isatty()) as bar:
        def advance(done, total):
            bar.total = total
            bar.update(1)
        return synth_.synthesize(text, speaker, on_segment=advance, **options)


@main.command()
@_run_model_dir_opt
@_plan_opt
@_backend_opt
@_threads_opt
@click.option("--out-dir", default=".", show_default=True, help="Where to write demo-*.wav.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
@_friendly_errors
def demo(ctx, model_dir, plan_path, backend, threads, out_dir, seed):
    """Synthesize a Chinese and an English sentence; print per-stage times and RTF.

    Runs as the plan from `cosyvino plan` says (backend, threads, precision) when there is one;
    explicit flags win. Without --model-dir (or a plan's) this uses the embedded default model,
    created once as a SYNTHETIC CosyVoice-300M checkpoint (random weights: real cost, noise
    audio).
    """
    from cosyvino.families.cosyvoice1.synthetic import is_synthetic

    if not os.path.isdir(out_dir):
        raise InputError(f"--out-dir does not exist: {out_dir}")
    run = _run_settings(ctx, plan_path, model_dir, backend, threads)
    for note in run["notes"]:
        click.echo(f"note: {note}", err=True)
    synth_ = _synthesizer(run)
    click.echo(f"model: {synth_.model_dir} ({_describe(run)}, load {synth_.load_seconds:.1f} s)"
               + (" [SYNTHETIC random weights: expect noise]"
                  if is_synthetic(synth_.model_dir) else ""))
    from cosyvino.measurement_voice import measurement_voice

    for lang, speaker, text in DEMO_SENTENCES:
        # the sentence's speaker, else the model's first, else a stand-in prompt voice (a
        # model may have no built-in speakers)
        speaker = measurement_voice(synth_, speaker)
        audio = synth_.synthesize(text, speaker, seed=seed)
        path = os.path.join(out_dir, f"demo-{lang}.wav")
        audio.write(path)
        click.echo(f"\n[{lang}] {getattr(speaker, 'name', speaker)}: {text}")
        click.echo(_stage_table(audio.stats))
        click.echo(f"wrote {path}: {_summary(audio.stats)}")


@main.command()
@_model_dir_opt
@click.option("--json", "as_json", is_flag=True)
@_friendly_errors
def speakers(model_dir, as_json):
    """List the speaker ids of a model (official dir: spk2info.pt; converted dir such as
    D/openvino or D/onnx: speakers.json)."""
    from cosyvino.defaults import ensure_default_model

    names = _speaker_names(model_dir or ensure_default_model())
    click.echo(json.dumps(names, ensure_ascii=False) if as_json else "\n".join(names))


def synthetic_family(family: str | None, preset: str):
    """The registered family that makes ``preset`` (``--family`` when given; else the one
    whose :meth:`~cosyvino.families.ModelFamily.presets` include it; when several do, the
    default family (``tiny``), else the first by name (``0.5b``: CosyVoice2)).

    Raises:
        ModelDirError: ``family`` is not registered.
        InputError: the family has no such preset, or no family has it (the
            message lists each family's presets).
    """
    from cosyvino import families

    classes = families.family_classes()
    offers = {name: tuple(cls.presets()) for name, cls in sorted(classes.items())}
    listing = "; ".join(f"{n}: {', '.join(p)}" for n, p in offers.items() if p)
    if family is not None:
        cls = families.get_family(family)
        if preset not in offers.get(family, ()):
            raise InputError(f"family {family!r} has no preset {preset!r}; presets: "
                             f"{listing or 'none'}")
        return cls
    having = [n for n, p in offers.items() if preset in p]
    if not having:
        raise InputError(f"unknown preset {preset!r}; presets: {listing or 'none'}")
    if families.DEFAULT_FAMILY in having:
        return classes[families.DEFAULT_FAMILY]
    # else the first by name: a preset name a newer family reuses keeps meaning what it
    # meant (``0.5b`` without --family stays CosyVoice2, CosyVoice3 needs --family)
    return classes[having[0]]


@main.command("make-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--preset", default="tiny", show_default=True,
              help="Model size: tiny or 300m (cosyvoice1), tiny or 0.5b (cosyvoice2).")
@click.option("--family", default=None,
              help="Model family, e.g. cosyvoice1 or cosyvoice2 (default: the family whose "
                   "presets include PRESET; cosyvoice1 for tiny).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--hift-weight-norm", type=click.Choice(["parametrizations", "weight_g"]),
              default="parametrizations", show_default=True,
              help="Key spelling of the weight-normed convolutions in hift.pt.")
@click.option("--overwrite", is_flag=True, help="Replace OUT_DIR if it exists.")
@_friendly_errors
def make_model_cmd(out_dir, preset, family, seed, hift_weight_norm, overwrite):
    """Write a SYNTHETIC checkpoint (random weights, official layout) to OUT_DIR."""
    from tqdm import tqdm

    fam = synthetic_family(family, preset)
    try:  # the generator builds our torch model to get the official keys and shapes
        import torch  # noqa: F401
    except ImportError as e:
        raise BackendError(f"cosyvino make-model needs torch ({e}); "
                           "pip install 'cosyvino[torch]'") from e

    if os.path.exists(out_dir) and not overwrite:
        raise InputError(f"{out_dir} already exists; pick a new directory or use --overwrite")
    with tqdm(total=5, desc=f"make-model {fam.name} {preset}", file=sys.stderr,
              disable=not sys.stderr.isatty()) as bar:
        def step(msg):
            bar.set_postfix_str(msg)
            bar.update(1)
        fam.make_synthetic(preset, out_dir, seed=seed, hift_weight_norm=hift_weight_norm,
                           overwrite=overwrite, progress=step)
    click.echo(f"wrote synthetic {fam.name} {preset} model to {out_dir}")


@main.command()
@_model_dir_opt
@click.option("--json", "as_json", is_flag=True)
@_friendly_errors
def info(model_dir, as_json):
    """Summarize a model directory (config, files, parameter counts, speakers).

    For a converted dir (D/openvino, D/onnx) the files and their precision come from its
    manifest and the speakers from speakers.json; parameter counts are not shown there."""
    from cosyvino.defaults import default_model_dir
    from cosyvino.families.official import official_family

    model_dir = model_dir or default_model_dir()
    official = official_family(model_dir)
    if official == "cosyvoice2":  # the official dir's summary (configs, files, parameters)
        from cosyvino.families.cosyvoice2.info import model_info
    elif official == "cosyvoice3":
        from cosyvino.families.cosyvoice3.info import model_info
    else:
        from cosyvino.families.cosyvoice1.info import model_info

    data = model_info(model_dir)
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
from cosyvino.cli.download import download  # noqa: E402
from cosyvino.cli.plan import plan  # noqa: E402
from cosyvino.cli.quantize import quantize  # noqa: E402
from cosyvino.cli.ray_serve import ray_serve  # noqa: E402
from cosyvino.cli.serve import serve  # noqa: E402
from cosyvino.cli.voices import voices  # noqa: E402

for _command in (convert, bench, quantize, serve, plan, voices, download, ray_serve):
    main.add_command(_command)


if __name__ == "__main__":
    main()
