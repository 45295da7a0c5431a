"""One CosyVoice2 request as a state machine the engine steps: the program shared with CosyVoice3
(:class:`cosyvino.families.cosyvoice23.program.SpeechLMProgram`, two lanes ``llm`` / ``audio``)
with v2's choices. Must not import torch.

* decoding: the v2 rule (:mod:`.decoding`: bounds from the tts-text length, only EOS masked
  below the minimum, three stop ids); every token goes to the flow.
* LLM prefix: :func:`.modes.llm_prefix` (prompt transcript / instruction + prompt tokens).
* hops: :mod:`.streaming` (segment, or the official 25 + pad, 50, 100 ... token hops).
* audio: :class:`~.token2wav.Token2Wav` (the fixed seed-0 flow noise; the incremental flow
  where ``streaming.flow_streaming`` asks and the backend offers it), then the HiFT cache
  vocoder with NSF Gaussian noise from ``draws.nsf`` at the call's output-sample position on
  the segment.
"""

from __future__ import annotations

import numpy as np

from ..cosyvoice23.program import AUDIO, LLM, SpeechLMProgram
from . import modes as v2_modes
from .decoding import decoding_rule
from .streaming import policy
from ..cosyvoice23.text_in_program import TextInMixin
from .token2wav import Token2Wav


class CosyVoice2Program(SpeechLMProgram):
    """A validated request on loaded :class:`~.stages.CosyVoice2Stages` (see
    :class:`~cosyvino.families.cosyvoice23.program.SpeechLMProgram` for chunks and errors)."""

    def decoding_rule(self):
        return decoding_rule(self.config.llm)

    def llm_prefix(self, request, frontend):
        return v2_modes.llm_prefix(request, frontend.tokenize, frontend.normalize)

    def hop_policy(self, hop_schedule: str, prompt_tokens: int):
        return policy(hop_schedule, prompt_tokens)

    def new_stream(self):
        return Token2Wav(self.stages, self.cond.embedding, prompt_token=self.cond.prompt_token,
                         prompt_feat=self.cond.prompt_feat,
                         n_timesteps=self.request.n_timesteps, speed=self.request.speed,
                         flow_stream=self.flow_stream(),
                         final_hop=self.request.streaming.final_hop)

    def vocode(self, stream, segment, mel, hop):
        nh = self.config.hift.nb_harmonics + 1

        def noise(start: int, samples: int) -> np.ndarray:
            return self.draws.nsf(segment, nh, samples, start=start)[1]

        return stream.vocoder(mel, noise, hop.finalize, before_decode=self.check_cancelled)


class CosyVoice2TextInProgram(TextInMixin, CosyVoice2Program):
    """A v2 request whose text arrives while it runs (upstream bistream input, sheet v2 §4.6;
    :mod:`cosyvino.families.cosyvoice23.text_in_program`)."""


__all__ = ["AUDIO", "LLM", "CosyVoice2Program", "CosyVoice2TextInProgram"]
