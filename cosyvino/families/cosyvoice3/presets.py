"""Built-in CosyVoice3 model shapes for ``cosyvino make-model --family cosyvoice3``.

* ``tiny``: the shape of the official-code golden ``tiny-e`` (tests/fixtures/tiny-e): Qwen2 32
  wide, 2 layers; pre-lookahead 48 channels; DiT 64 wide, 2 blocks, 4 heads × 16, ff_mult 2;
  HiFT base 32, f0 predictor 32.
* ``0.5b``: Fun-CosyVoice3-0.5B-2512 (sheet v3 §4.1 Qwen2-0.5B, §5.1 flow, §6.1 HiFT):
  642,283,136 ``llm.pt`` values (the tied text table counted twice), 332,257,120 ``flow.pt``,
  20,779,887 ``hift.pt`` (the reference key manifest; tests/fixtures/cosyvoice3-0.5b-*-keys.json).

Each preset is a :class:`CosyVoice3Preset`: the Qwen2 config (``CosyVoice-BlankEN/config.json``)
plus the flow and HiFT configs that :mod:`.flow_config` and :mod:`.hift_config` read back from
the rendered yaml (round-trip tested). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cosyvino.families.cosyvoice3.flow_config import (
    FUN_COSYVOICE3_0_5B,
    DiTFlowConfig,
    PreLookaheadConfig,
)
from cosyvino.families.cosyvoice3.hift_config import CausalHiFTConfig
from cosyvino.families.cosyvoice23.qwen2_config import QWEN2_0_5B, Qwen2Config

#: speech tokens of CosyVoice3 (sheet v3 §2: 6561 FSQ codes)
SPEECH_TOKEN_SIZE = 6561


@dataclass(frozen=True)
class CosyVoice3Preset:
    """Everything a synthetic CosyVoice3 dir is made from: ``qwen`` (``llm_input_size`` =
    ``llm_output_size`` = ``qwen.hidden_size``), ``flow`` / ``hift`` as the yaml readers give
    them; ``spk_embed_dim`` 192 (CAM++)."""

    name: str
    qwen: Qwen2Config
    flow: DiTFlowConfig
    hift: CausalHiFTConfig
    speech_token_size: int = SPEECH_TOKEN_SIZE
    spk_embed_dim: int = 192


def tiny() -> CosyVoice3Preset:
    """The shape of the official-code golden ``tiny-e`` (its yaml and config.json)."""
    qwen = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, vocab_size=151936,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
    full = FUN_COSYVOICE3_0_5B
    flow = replace(full, pre_lookahead=PreLookaheadConfig(in_channels=80, channels=48,
                                                          pre_lookahead_len=3),
                   estimator=replace(full.estimator, dim=64, depth=2, heads=4, dim_head=16,
                                     ff_mult=2))
    return CosyVoice3Preset(name="tiny", qwen=qwen, flow=flow,
                            hift=CausalHiFTConfig(base_channels=32, f0_cond_channels=32))


def full_0_5b() -> CosyVoice3Preset:
    """Fun-CosyVoice3-0.5B (module docstring; every key and shape is the manifest's)."""
    return CosyVoice3Preset(name="0.5b", qwen=QWEN2_0_5B, flow=FUN_COSYVOICE3_0_5B,
                            hift=CausalHiFTConfig())


PRESETS = {"tiny": tiny, "0.5b": full_0_5b}

__all__ = ["PRESETS", "SPEECH_TOKEN_SIZE", "CosyVoice3Preset", "full_0_5b", "tiny"]
