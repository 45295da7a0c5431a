"""Typed errors raised by cosyvino. Every message says what failed, where, and what to do.

All derive from :class:`CosyvinoError`, so callers (CLI, server) can map them to exit codes and
HTTP 4xx without catching library internals. Must not import torch.
"""

from __future__ import annotations


class CosyvinoError(Exception):
    """Base class of every error cosyvino raises on purpose."""


class ModelDirError(CosyvinoError):
    """A model directory or one of its files is missing or unreadable."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class ConfigError(ModelDirError):
    """``cosyvoice.yaml`` is malformed or lacks a required section/value."""


class CheckpointError(ModelDirError):
    """A ``.pt`` file is truncated/corrupt or its state_dict does not match the architecture.

    ``missing``, ``unexpected`` and ``mismatched`` (key, expected shape, found shape) list the
    differences found by the strict loader.
    """

    def __init__(self, message: str, path: str | None = None, *, missing=(), unexpected=(),
                 mismatched=()):
        super().__init__(message, path)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)


class InputError(CosyvinoError, ValueError):
    """Bad user input (text, speaker, speed, forced tokens ...). Maps to HTTP 400."""


class EmptyTextError(InputError):
    """The text has nothing to speak (empty, whitespace, punctuation/emoji/control only)."""


class PromptModelsUnavailableError(InputError):
    """The model cannot turn a recording (``prompt_audio`` / ``source_audio``) into a voice or
    speech tokens here: its prompt models are missing, or cosyvino does not run them for its
    family yet. The message names the files and what to use instead (a registered voice or one
    of the model's own voices). Maps to HTTP 400 naming the recording's field."""


class VoiceMismatchError(InputError):
    """A voice made for another model: its speaker embedding width, prompt speech-token ids,
    prompt mel bins or prompt mel rate do not fit the loaded model (the family's prompt
    encoder's ``check_voice``; e.g. a CosyVoice v1 voice, 22.05 kHz mel, on CosyVoice2).

    Attributes: ``voice`` (its name), ``reason`` (what does not fit)."""

    def __init__(self, voice: str, reason: str):
        self.voice, self.reason = voice, reason
        super().__init__(f"voice {voice!r} does not fit this model: {reason}; make the voice "
                         "again from its recording with this model")


class UnknownSpeakerError(InputError, KeyError):
    """No voice of this name: not a built-in speaker of the model (``spk2info.pt``) nor a
    registered voice.

    Args:
        speaker: the name asked for.
        available: the built-in speakers, in the model's order.
        registered: the registered voice names (listed after the built-ins, sorted).

    Attributes: ``speaker``; ``available``: every valid name, built-ins first;
    ``builtin`` / ``registered``: the two groups.
    """

    def __init__(self, speaker: str, available, registered=()):
        self.speaker = speaker
        self.builtin = list(dict.fromkeys(available))
        self.registered = sorted(set(registered) - set(self.builtin))
        self.available = self.builtin + self.registered
        listed = f"available speakers: {', '.join(self.builtin) or 'none'}"
        if self.registered:
            listed += f"; registered voices: {', '.join(self.registered)}"
        super().__init__(f"unknown speaker {speaker!r}; {listed}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class SynthesisCancelled(CosyvinoError):
    """Synthesis was stopped through the ``cancel`` event of :meth:`Synthesizer.stream`."""


class BackendError(CosyvinoError):
    """A backend is unknown, failed to load, or a stage failed to run."""


class PluginError(BackendError):
    """A plugin failed to import or registered something malformed."""


class ConvertedModelError(ModelDirError):
    """A converted (OpenVINO IR) model directory is missing, stale, corrupt or was edited.

    ``path`` names the offending file; the message says to re-run ``cosyvino convert``.
    """


#: errors defined next to the code that raises them, importable from here too (lazily: those
#: modules import this one)
_ELSEWHERE = {
    **{n: "prompt_audio" for n in ("PromptAudioError", "NotAudioError", "EmptyAudioError",
                                   "AudioTooShortError", "AudioTooLongError",
                                   "SilentAudioError", "InvalidAudioError")},
    **{n: "voice_store" for n in ("VoiceStoreError", "CorruptVoiceError",
                                  "InvalidVoiceNameError", "VoiceExistsError",
                                  "UnknownVoiceError")},
}


def __getattr__(name):
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"cosyvino.{module}"), name)
