"""One CosyVoice3 request as a state machine the engine steps: the program shared with CosyVoice2
(:class:`cosyvino.families.cosyvoice23.program.SpeechLMProgram`, lanes ``llm`` / ``audio``) with
v3's choices. Must not import torch.

* decoding: the v3 rule (:mod:`.decoding`, ``min_length="official"``: upstream HEAD masks only
  index 6561 below min_len, so the minimum is not enforced; any of the 200 ids 6561..6760
  stops).
* LLM text: :mod:`.modes` (the ``<|endofprompt|>`` system-prefix convention per segment).
* silent-token filter: more than 5 silent tokens in a row do not reach the flow (:mod:`.silence`);
  the LLM and the sampler see every token.
* hops: the CosyVoice2 policy (:mod:`cosyvino.families.cosyvoice2.streaming`: segment, or the
  official 25 + pad, 50, 100 ... token hops; sheet v3 §7: the same schedule).
* audio: :class:`~.token2wav.Token2Wav3` (fixed CFM noise; the causal HiFT re-run over the
  segment's mel so far with the fixed NSF table, samples already emitted cut; or the
  incremental vocoder where ``streaming.vocoder_streaming`` asks and the backend offers it: the
  same samples). No random draw after the LLM: the audio is a function of the tokens. v3's DiT
  flow has no incremental form yet: ``flow_streaming`` falls back to official (logged).
"""

from __future__ import annotations

from ..cosyvoice2.streaming import policy
from ..cosyvoice23.program import AUDIO, LLM, SpeechLMProgram
from . import modes as v3_modes
from .decoding import decoding_rule
from .silence import SilentTokenFilter
from .token2wav import Token2Wav3


class CosyVoice3Program(SpeechLMProgram):
    """A validated request on loaded :class:`~.stages.CosyVoice3Stages` (see
    :class:`~cosyvino.families.cosyvoice23.program.SpeechLMProgram` for chunks and errors)."""

    def decoding_rule(self):
        return decoding_rule(self.config.llm, "official")

    def llm_prefix(self, request, frontend):
        self._prefix_ids = v3_modes.default_prefix_ids(frontend.tokenize)
        return v3_modes.llm_prefix(request, frontend.tokenize, frontend.normalize)

    def llm_text(self, text):
        return v3_modes.segment_llm_text(text, self.prefix.text_before, self._prefix_ids)

    def keep_for_flow(self, token: int) -> bool:
        if len(self.tokens) == 1:  # a segment's first token: a fresh run count
            self._silence = SilentTokenFilter()
        return self._silence.keep(token)

    def hop_policy(self, hop_schedule: str, prompt_tokens: int):
        return policy(hop_schedule, prompt_tokens)

    def new_stream(self):
        return Token2Wav3(self.stages, self.cond.embedding, prompt_token=self.cond.prompt_token,
                          prompt_feat=self.cond.prompt_feat,
                          n_timesteps=self.request.n_timesteps, speed=self.request.speed,
                          flow_stream=self.flow_stream(),
                          final_hop=self.request.streaming.final_hop,
                          vocoder_stream=self.vocoder_stream())

    def stream_stats(self, stream):
        return {**super().stream_stats(stream), "vocoder_streaming": stream.vocoder_mode}

    def vocode(self, stream, segment, mel, hop):
        return stream.vocoder(mel, hop.finalize, before_decode=self.check_cancelled)


__all__ = ["AUDIO", "LLM", "CosyVoice3Program"]
