"""Built-in model shapes: ``tiny`` (tests; equal to the official-code golden ``tiny-a``) and
``300m`` (CosyVoice-300M / -SFT / -Instruct; upstream ``examples/libritts/cosyvoice/conf/cosyvoice.yaml``).

Used by ``cosyvino make-model`` to write synthetic checkpoints in the official layout.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice1.config import (
    EncoderConfig,
    EstimatorConfig,
    FlowConfig,
    HiFTConfig,
    LLMConfig,
    ModelConfig,
)

_RES_DIL = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
_SRC_DIL = ((1, 3, 5), (1, 3, 5))


def _config(*, te_in, llm_dim, te_heads, te_units, te_blocks, llm_heads, llm_units, llm_blocks,
            flow_in, fe_out, fe_heads, fe_units, fe_blocks, est_ch, est_head_dim, est_blocks,
            est_mid, est_heads, hift_base, f0_cond) -> ModelConfig:
    llm = LLMConfig(
        text_encoder_input_size=te_in, llm_input_size=llm_dim, llm_output_size=llm_dim,
        text_token_size=51866, speech_token_size=4096, spk_embed_dim=192,
        text_encoder=EncoderConfig(
            input_size=te_in, output_size=llm_dim, attention_heads=te_heads,
            linear_units=te_units, num_blocks=te_blocks, layer_type="conformer",
            input_layer="linear", static_chunk_size=1),
        llm=EncoderConfig(
            input_size=llm_dim, output_size=llm_dim, attention_heads=llm_heads,
            linear_units=llm_units, num_blocks=llm_blocks, layer_type="transformer",
            input_layer="linear_legacy", static_chunk_size=1),
    )
    flow = FlowConfig(
        input_size=flow_in, output_size=80, spk_embed_dim=192, vocab_size=4096,
        input_frame_rate=50,
        encoder=EncoderConfig(
            input_size=flow_in, output_size=fe_out, attention_heads=fe_heads,
            linear_units=fe_units, num_blocks=fe_blocks, layer_type="conformer",
            input_layer="linear", static_chunk_size=0),
        length_regulator_channels=80, length_regulator_sampling_ratios=(1, 1, 1, 1),
        estimator=EstimatorConfig(
            in_channels=320, out_channels=80, channels=tuple(est_ch),
            attention_head_dim=est_head_dim, n_blocks=est_blocks, num_mid_blocks=est_mid,
            num_heads=est_heads),
    )
    hift = HiFTConfig(
        in_channels=80, base_channels=hift_base, nb_harmonics=8, sampling_rate=22050,
        nsf_alpha=0.1, nsf_sigma=0.003, nsf_voiced_threshold=10, upsample_rates=(8, 8),
        upsample_kernel_sizes=(16, 16), istft_n_fft=16, istft_hop_len=4,
        resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=_RES_DIL,
        source_resblock_kernel_sizes=(7, 11), source_resblock_dilation_sizes=_SRC_DIL,
        lrelu_slope=0.1, audio_limit=0.99, f0_cond_channels=f0_cond,
    )
    return ModelConfig(sample_rate=22050, llm=llm, flow=flow, hift=hift)


def tiny() -> ModelConfig:
    """The small shape of the official-code golden ``tiny-a`` (cosyvino/testing/fixtures/tiny-a)."""
    return _config(te_in=32, llm_dim=64, te_heads=4, te_units=96, te_blocks=2, llm_heads=4,
                   llm_units=128, llm_blocks=2, flow_in=32, fe_out=48, fe_heads=4, fe_units=64,
                   fe_blocks=2, est_ch=(32, 32), est_head_dim=16, est_blocks=1, est_mid=2,
                   est_heads=2, hift_base=32, f0_cond=32)


def full_300m() -> ModelConfig:
    """CosyVoice-300M(-SFT/-Instruct): 310,718,465 / 104,874,752 / 20,460,591 parameters."""
    return _config(te_in=512, llm_dim=1024, te_heads=16, te_units=4096, te_blocks=6,
                   llm_heads=16, llm_units=4096, llm_blocks=14, flow_in=512, fe_out=512,
                   fe_heads=8, fe_units=2048, fe_blocks=6, est_ch=(256, 256), est_head_dim=64,
                   est_blocks=4, est_mid=12, est_heads=8, hift_base=512, f0_cond=512)


PRESETS = {"tiny": tiny, "300m": full_300m}
