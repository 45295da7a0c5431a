"""The official CosyVoice3 streaming vocoder: re-run over all mel so far, cut what was emitted
(numpy only, no torch).

Upstream: ``CosyVoice3Model.token2wav`` (``cosyvoice/cli/model.py``); CosyVoice3 architecture sheet
§7. Golden: ``tests/fixtures/tiny-e/stream.pt`` (tests/test_parity_cosyvoice3_hift.py).

* Schedule: exactly CosyVoice2's (hops 25 + prompt pad, 50, 100, 100 ... plus 3 look-ahead tokens;
  the last call finalizes with full attention; sheet §7), so it is
  :func:`cosyvino.families.cosyvoice2.official_stream.hop_schedule` /
  :class:`~cosyvino.families.cosyvoice2.official_stream.TokenHopSchedule`, re-exported here
  (only their token fields apply: v3 has no mel/source cache).
* Vocoder (:class:`VocoderRerunStream`): each call's new mel frames are appended to the
  utterance's mel; the causal vocoder runs over ALL of it (``finalize`` as the flow call's) and
  the samples after those already emitted are returned. A non-final run over M frames returns
  ``480 (M − 8)`` samples that a later run reproduces exactly (causal convolutions, fixed noise
  table), so no cross-fade is needed; the final run returns ``480 M``. Cost: the vocoder re-runs
  over the whole utterance at every chunk (quadratic in length).

Speed ≠ 1 (upstream interpolates the whole mel, allowed only for a single final call) is not
handled here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice2.official_stream import (
    FlowCall,
    StreamConstants,
    TokenHopSchedule,
    hop_schedule,
)

__all__ = ["FlowCall", "StreamConstants", "TokenHopSchedule", "VocoderRerunStream",
           "emitted_samples", "hop_schedule", "utterance_frames"]

#: the vocoder on numpy arrays: (mel float32 [1, 80, M], finalize) -> wav float32 [1, n] with
#: n = hop_length · M (finalize) or hop_length · (M − frames_held_back)
Vocoder = Callable[[np.ndarray, bool], np.ndarray]


def utterance_frames(calls: list[FlowCall], token_mel_ratio: int = 2) -> list[int]:
    """Mel frames the utterance holds after each call (the vocoder's input length): the call's
    new frames plus all earlier ones, i.e. ``token_mel_ratio`` × the tokens up to the end of its
    new ones (sheet §7)."""
    return [token_mel_ratio * (call.token_offset + call.new_tokens) for call in calls]


def emitted_samples(calls: list[FlowCall], token_mel_ratio: int = 2, hop_length: int = 480,
                    frames_held_back: int = 8) -> list[int]:
    """Output samples each call emits: the run's samples (``hop_length · M``, less
    ``frames_held_back`` frames when not final) minus what earlier calls emitted (sheet §7). They
    sum to ``hop_length`` × the utterance's frames."""
    out, done = [], 0
    for call, m in zip(calls, utterance_frames(calls, token_mel_ratio)):
        total = hop_length * (m if call.finalize else max(0, m - frames_held_back))
        out.append(max(0, total - done))
        done = max(done, total)
    return out


class VocoderRerunStream:
    """The vocoder half of the official v3 stream for one utterance (upstream ``token2wav``
    after the flow, with ``hift_cache_dict[uuid]`` = {mel, speech_offset}; sheet §7).

    Args:
        vocoder: ``(mel [1, 80, M], finalize) -> wav [1, n]`` (e.g. the torch
            ``CausalHiFTGenerator.inference`` with the fixed table, converted to numpy).

    Call :meth:`hop` once per flow call, in order, with that call's new mel frames. Not
    thread-safe.
    """

    def __init__(self, vocoder: Vocoder):
        self.vocoder = vocoder
        self.mel: np.ndarray | None = None
        self.speech_offset = 0
        self.finished = False

    def hop(self, new_mel: np.ndarray, finalize: bool) -> np.ndarray:
        """Append ``new_mel`` (float32 [1, 80, m], the flow's frames from ``2 · token_offset``
        on), re-vocode the whole utterance and return the samples not emitted before (float32
        [n], 24 kHz).

        Raises:
            InputError: after the final hop; a mel of the wrong rank, bin count or without frames.
        """
        if self.finished:
            raise InputError("the stream has already been finalized")
        mel = np.asarray(new_mel, np.float32)
        if mel.ndim != 3 or mel.shape[0] != 1 or mel.shape[-1] == 0:
            raise InputError(f"new mel must be [1, n_mels, frames > 0], got {mel.shape}")
        if self.mel is not None and mel.shape[1] != self.mel.shape[1]:
            raise InputError(f"new mel has {mel.shape[1]} bins, the utterance "
                             f"{self.mel.shape[1]}")
        self.mel = mel if self.mel is None else np.concatenate([self.mel, mel], axis=-1)
        wav = np.asarray(self.vocoder(self.mel, finalize), np.float32).reshape(-1)
        out = wav[self.speech_offset:]
        self.speech_offset += out.shape[0]
        self.finished = bool(finalize)
        return np.ascontiguousarray(out)
