"""The ``torch_module`` s of the graph-table entries CosyVoice2 and CosyVoice3 share
(:mod:`cosyvino.families.cosyvoice23.graph_specs`): the text and speech embedding lookups of the
speech LM. The ``llm`` entry is the LM module itself. Depends on torch.
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor


class TextEmbeddingGraph(nn.Module):
    """ids int64 [1, n] (Qwen text ids) -> rows float32 [1, n, D] (the tied ``embed_tokens``)."""

    def __init__(self, llm):
        super().__init__()
        self.table = llm.qwen.embed_tokens

    def forward(self, ids: Tensor) -> Tensor:
        return self.table(ids)


class SpeechEmbeddingGraph(nn.Module):
    """tokens int64 [1, n] (0 .. V - 1) -> rows float32 [1, n, D] (``speech_embedding``; in v3
    its rows after the speech tokens are SOS / EOS / TASK / FILL, sheet v3 §4.1)."""

    def __init__(self, llm):
        super().__init__()
        self.table = llm.speech_embedding

    def forward(self, tokens: Tensor) -> Tensor:
        return self.table(tokens)


__all__ = ["SpeechEmbeddingGraph", "TextEmbeddingGraph"]
