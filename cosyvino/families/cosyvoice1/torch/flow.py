"""Module tree of the CosyVoice v1 flow (upstream ``cosyvoice/flow/flow.py::MaskedDiffWithXvec``).

A container only: it owns the parameters under the official names so ``flow.pt`` loads with
``strict=True``; the computations are done by the stage modules
(:mod:`.flow_encoder`, :mod:`.length_regulator`, :mod:`.estimator`) and the CFM solver.
Depends on torch and the sibling model modules only.
"""

from __future__ import annotations

from torch import nn

from cosyvino.families.cosyvoice1.config import FlowConfig
from cosyvino.families.cosyvoice1.torch.estimator import ConditionalDecoder
from cosyvino.families.cosyvoice1.torch.length_regulator import InterpolateRegulator
from cosyvino.families.cosyvoice1.torch.transformer import Encoder


class Flow(nn.Module):
    """``input_embedding`` Embedding(vocab_size, input_size); ``spk_embed_affine_layer``
    Linear(spk_embed_dim, output_size); ``encoder`` full-attention conformer;
    ``encoder_proj`` Linear(encoder width, output_size); ``decoder.estimator``
    :class:`ConditionalDecoder` (upstream ``ConditionalCFM`` holds no parameters of its own);
    ``length_regulator`` :class:`InterpolateRegulator`.

    Registration order equals upstream (architecture sheet 5.6), so ``state_dict()`` lists the
    keys in the official file order.
    """

    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = Encoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = nn.Module()
        self.decoder.estimator = ConditionalDecoder(cfg.estimator)
        self.length_regulator = InterpolateRegulator(cfg.length_regulator_channels,
                                                     cfg.length_regulator_sampling_ratios)
