"""CosyVoice2 speech tokens -> waveform, one hop at a time: the flow from the fixed noise and the
HiFT cache of the official streaming (sheet v2 §5.3-5.4, §7.3). The flow half is shared with
CosyVoice3 (:class:`cosyvino.families.cosyvoice23.token2wav.FlowHops`). numpy only; the stage
calls run on any backend. The program (:mod:`.program`) drives it; the hop windows come from
:mod:`.streaming`.

Per hop ``(start, stop, finalize)`` of a segment:

* flow: ``prompt ⧺ tokens[0:stop]`` through the encoder (``finalize=False``: the last 3 tokens
  are look-ahead only, chunk attention; the final hop: full attention, zero look-ahead), CFM
  Euler + CFG from columns ``0..M-1`` of the fixed noise table (no random draw), prompt frames
  cut, then only the new frames ``[2 start, ...)`` kept (upstream ``token2wav``'s
  ``[:, :, 2·offset:]``). The whole-segment computation is the final hop with ``start`` 0.
* vocoder: f0 and the SineGen2 source over the cached 8 frames + the new ones, the Gaussian
  noise drawn at the call's output-sample position on the segment, then
  :class:`~.official_stream.VocoderStream` (source overwrite, decode, Hamming cross-fade,
  held-back tail).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cosyvoice23.token2wav import FlowHops
from .official_stream import StreamConstants, VocoderStream
from .streaming import OFFICIAL


class Token2Wav(FlowHops):
    """One segment's flow + vocoder state on loaded :class:`~.stages.CosyVoice2Stages`.

    ``embedding`` float32 [1, 192] (raw flow x-vector); ``prompt_token`` int [N1] and
    ``prompt_feat`` float32 [2 N1, 80] (None: no prompt); ``n_timesteps`` Euler steps (None:
    the config's 10); ``speed`` a tempo change of each hop's new frames (linear resize);
    ``flow_stream`` / ``final_hop`` / ``flow_options`` (``max_state_bytes``): the incremental
    flow (:class:`FlowHops`).
    """

    def __init__(self, stages, embedding: np.ndarray, *, prompt_token=None, prompt_feat=None,
                 n_timesteps: int | None = None, speed: float = 1.0,
                 constants: StreamConstants = OFFICIAL, flow_stream=None,
                 final_hop: str = "official", **flow_options):
        super().__init__(stages, embedding, prompt_token=prompt_token, prompt_feat=prompt_feat,
                         n_timesteps=n_timesteps, speed=speed, flow_stream=flow_stream,
                         final_hop=final_hop, **flow_options)
        self.constants = constants
        self.stream = VocoderStream(_StageVocoder(stages), constants)
        self.vocoder_frame = 0  # first mel frame of the next vocoder call on the segment

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder(self, new_mel: np.ndarray, noise: Callable[[int, int], np.ndarray],
                finalize: bool, before_decode: Callable[[], None] | None = None) -> np.ndarray:
        """Vocode a hop's new mel frames (:meth:`flow`) and return the samples it emits,
        float32 [n]. ``noise(start_sample, samples)`` gives the SineGen2 Gaussian draw float32
        [1, 9, samples] for the call's samples on the segment's sample line."""
        hop = self.cfg.samples_per_frame
        mel = self.stream.vocoder_mel(new_mel)
        n = mel.shape[-1]
        f0 = self.stages.vocoder_f0(mel)
        source = self.stages.vocoder_source(f0, noise(hop * self.vocoder_frame, hop * n))
        if before_decode is not None:
            before_decode()
        wav = self.stream.hop(new_mel, finalize, source=source)
        if not finalize:
            self.vocoder_frame += n - self.constants.mel_cache_len
        return wav


class _StageVocoder:
    """The stages' vocoder calls as :class:`~.official_stream.Vocoder`."""

    def __init__(self, stages):
        self.stages = stages
        self.hop_length = stages.config.samples_per_frame
        self.nb_harmonics = stages.config.hift.nb_harmonics

    def f0(self, mel):
        return self.stages.vocoder_f0(mel)

    def source(self, f0, noise):
        return self.stages.vocoder_source(f0, noise)

    def decode(self, mel, source):
        return self.stages.vocoder_decode(mel, source)


__all__ = ["Token2Wav"]
