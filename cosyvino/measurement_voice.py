"""The voice a measurement speaks with (``cosyvino bench``, ``cosyvino plan --tune``) on a model
of any family: a built-in speaker where the model has one, else a voice registered once from a
recording, or from a speech-like stand-in when none is given (an official CosyVoice2 dir may
have no built-in speakers). Numpy only; must not import torch.
"""

from __future__ import annotations

import weakref

import numpy as np

#: name the registered measurement voice gets
MEASUREMENT_VOICE = "bench-voice"
#: sample rate of the stand-in clip, Hz (what the prompt models read; the intake resamples)
STAND_IN_RATE = 16000
#: transcript stored with the measurement voice: the official zero-shot example prompt's
#: (``examples/zero_shot_prompt.wav``); the costs measured do not depend on the words
STAND_IN_TEXT = "希望你以后能够做的比我还好呦。"


def stand_in_clip(seconds: float) -> tuple[np.ndarray, int]:
    """(float32 [N] mono samples, :data:`STAND_IN_RATE`) of ``seconds``: noise with a 4 Hz
    syllable envelope at about -20 dBFS, seed 0 (the prompt models' cost depends on the length
    only)."""
    rate = STAND_IN_RATE
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    x = 0.1 * rng.standard_normal(t.size) * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t))
    return x.astype(np.float32), rate


#: Synthesizer -> the prompt voice made for it (made once per loaded model)
_MADE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def measurement_voice(tts, preferred: str | None = None, clip=None,
                      text: str = STAND_IN_TEXT, name: str = MEASUREMENT_VOICE):
    """The voice to measure ``tts`` (a :class:`cosyvino.Synthesizer`) with: ``preferred`` when
    it is a built-in speaker, else the first built-in speaker (names, str), else a prompt
    :class:`~cosyvino.voices.Voice` called ``name`` made once from ``clip`` ((samples, rate);
    None: a 5 s :func:`stand_in_clip`) with transcript ``text``
    (:meth:`~cosyvino.Synthesizer.prompt_voice`: nothing is written to the model's voice
    store). Either is what ``tts.synthesize(text, voice)`` takes.

    Raises:
        cosyvino.errors.CosyvinoError: no built-in speakers and no ``zero_shot`` mode to make
            a voice with (the message lists the modes the model has)."""
    speakers = list(tts.speakers)
    if preferred in speakers:
        return preferred
    if speakers:
        return speakers[0]
    made = _MADE.get(tts)
    if made is not None:
        return made
    if "zero_shot" not in tts.modes:
        from .errors import CosyvinoError

        raise CosyvinoError(f"nothing to measure with: the model has no built-in speakers and "
                            f"no prompt models to make a voice (modes: "
                            f"{', '.join(tts.modes) or 'none'})")
    voice = tts.prompt_voice(clip if clip is not None else stand_in_clip(5.0), text, name=name)
    _MADE[tts] = voice
    return voice
