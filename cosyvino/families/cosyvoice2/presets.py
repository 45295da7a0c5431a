"""Built-in CosyVoice2 model shapes for ``cosyvino make-model --family cosyvoice2``.

* ``tiny``: the small shape of the official-code golden ``tiny-c`` (tests/fixtures/tiny-c):
  Qwen2 32 wide, 2 layers; the flow encoder keeps upstream's hard-coded 512 width
  (1 block, 4 heads, FFN 64); estimator channels [32]; HiFT base 32.
* ``0.5b``: CosyVoice2-0.5B (sheet v2 §4.1 Qwen2-0.5B, §5.1 flow, §6.1 HiFT;
  ``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml``): 505,803,812 unique LLM parameters,
  112,549,360 flow, 20,821,295 HiFT (sheet v2 §1).

Each preset is a :class:`CosyVoice2Preset`: the Qwen2 config (``CosyVoice-BlankEN/config.json``)
plus the flow and HiFT configs that the yaml readers of :mod:`.flow_config` and
:mod:`.hift_config` return for the rendered yaml (round-trip tested). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cosyvino.families.cosyvoice1.config import CFMConfig, SamplingConfig
from cosyvino.families.cosyvoice2.flow_config import (
    CausalEstimatorConfig,
    CausalFlowConfig,
    UpsampleEncoderConfig,
)
from cosyvino.families.cosyvoice2.hift_config import HiFTConfig
from cosyvino.families.cosyvoice23.qwen2_config import QWEN2_0_5B, Qwen2Config

#: speech tokens of CosyVoice2 (sheet v2 §2: 6561 = 3^8 FSQ codes)
SPEECH_TOKEN_SIZE = 6561
#: flow tokens per streaming chunk (yaml ``chunk_size``) and mel frames per token (sheet v2 §2)
CHUNK_SIZE, TOKEN_MEL_RATIO, TOKEN_FRAME_RATE = 25, 2, 25
SAMPLE_RATE = 24000


@dataclass(frozen=True)
class CosyVoice2Preset:
    """Everything a synthetic CosyVoice2 dir is made from.

    ``qwen``: the Qwen2 decoder (``CosyVoice-BlankEN/config.json``; ``llm_input_size`` =
    ``llm_output_size`` = ``qwen.hidden_size``); ``flow`` / ``hift``: as the yaml readers give
    them; ``spk_embed_dim`` 192 (CAM++)."""

    name: str
    qwen: Qwen2Config
    flow: CausalFlowConfig
    hift: HiFTConfig
    speech_token_size: int = SPEECH_TOKEN_SIZE
    spk_embed_dim: int = 192
    sample_rate: int = SAMPLE_RATE
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


def _flow(*, heads: int, units: int, blocks: int, est_ch: int, est_head_dim: int,
          est_blocks: int, est_mid: int, est_heads: int) -> CausalFlowConfig:
    return CausalFlowConfig(
        input_size=512, output_size=80, spk_embed_dim=192, vocab_size=SPEECH_TOKEN_SIZE,
        input_frame_rate=TOKEN_FRAME_RATE, token_mel_ratio=TOKEN_MEL_RATIO, pre_lookahead_len=3,
        # upstream builds the encoder 512 wide whatever the size (flow_config
        # HARD_CODED_ENCODER_WIDTH), so even the tiny preset keeps it
        encoder=UpsampleEncoderConfig(input_size=512, output_size=512, attention_heads=heads,
                                      linear_units=units, num_blocks=blocks,
                                      static_chunk_size=CHUNK_SIZE),
        estimator=CausalEstimatorConfig(
            in_channels=320, out_channels=80, channels=(est_ch,), attention_head_dim=est_head_dim,
            n_blocks=est_blocks, num_mid_blocks=est_mid, num_heads=est_heads, act_fn="gelu",
            static_chunk_size=CHUNK_SIZE * TOKEN_MEL_RATIO),
        cfm=CFMConfig())


def tiny() -> CosyVoice2Preset:
    """The shape of the official-code golden ``tiny-c`` (its yaml and config.json)."""
    qwen = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, vocab_size=151936)
    return CosyVoice2Preset(
        name="tiny", qwen=qwen,
        flow=_flow(heads=4, units=64, blocks=1, est_ch=32, est_head_dim=16, est_blocks=1,
                   est_mid=2, est_heads=2),
        hift=HiFTConfig(base_channels=32, f0_cond_channels=32))


def full_0_5b() -> CosyVoice2Preset:
    """CosyVoice2-0.5B (module docstring; every key and shape is the manifest's)."""
    return CosyVoice2Preset(
        name="0.5b", qwen=QWEN2_0_5B,
        flow=_flow(heads=8, units=2048, blocks=6, est_ch=256, est_head_dim=64, est_blocks=4,
                   est_mid=12, est_heads=8),
        hift=HiFTConfig())


PRESETS = {"tiny": tiny, "0.5b": full_0_5b}
