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
import numpy as np

from ..cosyvoice23.program import AUDIO, LLM, SpeechLMProgram
from ..cosyvoice23.text_in_program import TextInMixin
from ..cosyvoice23.tokenizer import END_OF_PROMPT_ID
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


class CosyVoice3TextInProgram(TextInMixin, CosyVoice3Program):
    """A v3 request whose text arrives while it runs (upstream bistream input, sheet v3 §4:
    v2 §4.6 with the prompt text up to and including its first ``<|endofprompt|>`` placed
    right after SOS and only the rest queued; the EOS is 6562, FILL 6564).

    The prompt text is the mode's (transcript / instruction) with the default system prefix
    in front when it holds no ``<|endofprompt|>`` (the whole-text rule's ``add`` policy, decided
    before any streamed text is seen: a marker inside the streamed text is spoken as text).
    As upstream, with placed text and no prompt speech the first group is decoded as soon as
    the first text token arrives (the input is then ``[SOS][placed]``, not 5 text tokens)."""

    def bistream_prompt(self):
        before = self.prefix.text_before
        ids = [] if before is None else [int(i) for i in np.asarray(before).reshape(-1)]
        if END_OF_PROMPT_ID not in ids:
            ids = [int(i) for i in self._prefix_ids] + ids
        cut = ids.index(END_OF_PROMPT_ID) + 1
        return np.asarray(ids[:cut], np.int64), np.asarray(ids[cut:], np.int64)


__all__ = ["AUDIO", "LLM", "CosyVoice3Program", "CosyVoice3TextInProgram"]
