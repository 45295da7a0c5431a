"""CosyVoice3 speech tokens -> waveform, one hop at a time: the flow shared with CosyVoice2
(:class:`cosyvino.families.cosyvoice23.token2wav.FlowHops`: fixed CFM noise, look-ahead, new
frames from ``2 · start``) and the official v3 vocoder stream (sheet v3 §7): each hop's new mel
frames join the segment's mel, the causal HiFT re-runs over all of it with the fixed NSF table
and the samples not emitted before are returned
(:class:`~.official_stream.VocoderRerunStream`). A non-final hop holds back the last 8 frames'
samples; the final one emits the rest. numpy only; the stage calls run on any backend. With an
incremental vocoder stream (issue 36, ``StreamingOptions.vocoder_streaming``; torch:
:class:`cosyvino.families.cosyvoice3.torch.incremental_hift.IncrementalCausalHiFT`) each hop
decodes only a window of its new frames plus the receptive field: the same samples.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cosyvoice23.token2wav import FlowHops
from .official_stream import VocoderRerunStream


class Token2Wav3(FlowHops):
    """One segment's flow + vocoder state on loaded :class:`~.stages.CosyVoice3Stages`
    (arguments as :class:`FlowHops`; ``vocoder_stream``: an incremental vocoder with the same
    ``hop(new_mel, finalize)`` as :class:`~.official_stream.VocoderRerunStream`, e.g.
    ``stages.new_vocoder_stream()``, or None: the official re-run)."""

    def __init__(self, stages, embedding: np.ndarray, *, prompt_token=None, prompt_feat=None,
                 n_timesteps: int | None = None, speed: float = 1.0, flow_stream=None,
                 final_hop: str = "official", vocoder_stream=None, **flow_options):
        super().__init__(stages, embedding, prompt_token=prompt_token, prompt_feat=prompt_feat,
                         n_timesteps=n_timesteps, speed=speed, flow_stream=flow_stream,
                         final_hop=final_hop, **flow_options)
        self.vocoder_mode = "official" if vocoder_stream is None else "incremental"
        self.stream = vocoder_stream or VocoderRerunStream(stages.vocoder)

    def vocoder(self, new_mel: np.ndarray, finalize: bool,
                before_decode: Callable[[], None] | None = None) -> np.ndarray:
        """Vocode a hop's new mel frames (:meth:`flow`) and return the samples it emits,
        float32 [n]. Raises InputError (after the final hop; a non-final segment mel of 8
        frames or fewer)."""
        if before_decode is not None:
            before_decode()
        return self.stream.hop(new_mel, finalize)


__all__ = ["Token2Wav3"]
