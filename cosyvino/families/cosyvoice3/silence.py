"""The silent-token filter CosyVoice3 applies between the LLM and the flow (sheet v3 §4.3,
upstream ``CosyVoice3Model.llm_job``). Must not import torch.

Of a run of consecutive "silent" speech tokens (:data:`SILENT_TOKENS`) the first
:data:`MAX_SILENT_RUN` go to the flow and the rest are dropped; any other token ends the run.
The LLM itself still gets every token (its history and the sampler's window are unfiltered);
given speech tokens (``vc``) bypass the filter.
"""

from __future__ import annotations

from collections.abc import Iterable

#: upstream's ``silent_tokens`` (ids of the 6561-token speech vocabulary)
SILENT_TOKENS = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
#: upstream's ``max_silent_token_num``: silent tokens in a row that are still kept
MAX_SILENT_RUN = 5


class SilentTokenFilter:
    """The filter over one utterance's tokens, fed in order (not thread-safe)."""

    def __init__(self):
        self.run = 0  # silent tokens in a row so far

    def keep(self, token: int) -> bool:
        """Whether ``token`` goes to the flow."""
        if int(token) in SILENT_TOKENS:
            self.run += 1
            return self.run <= MAX_SILENT_RUN
        self.run = 0
        return True


def filter_silent_tokens(tokens: Iterable[int]) -> list[int]:
    """The tokens of one utterance that reach the flow (:class:`SilentTokenFilter`)."""
    f = SilentTokenFilter()
    return [int(t) for t in tokens if f.keep(t)]


__all__ = ["MAX_SILENT_RUN", "SILENT_TOKENS", "SilentTokenFilter", "filter_silent_tokens"]
