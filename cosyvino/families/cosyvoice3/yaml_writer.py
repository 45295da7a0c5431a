"""Render a :class:`~.presets.CosyVoice3Preset` as an official-format ``cosyvoice3.yaml``.

The text is upstream's recipe yaml (``examples/libritts/cosyvoice3/conf/cosyvoice3.yaml``, the
layout of the official-code golden ``tiny-e``'s yaml): hyperpyyaml tags, the data-pipeline and
training sections included, so a synthetic dir is parsed like a downloaded one and builds its
modules in the recipe's order (the fixed NSF tables replay that order,
:mod:`.fixed_tables`). The values are the preset's (its fixed fields are the recipe's), but
for the recipe's chunk size and sampling (:data:`CHUNK_SIZE`, :data:`RECIPE_SAMPLING`); for the
``tiny`` preset the text equals tiny-e's yaml (tested). The sections shared with v2 are in
:mod:`cosyvino.families.cosyvoice23.yaml_writer`. No torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice23 import yaml_writer as sections
from cosyvino.families.cosyvoice23.yaml_writer import yaml_number

from .presets import CosyVoice3Preset

#: the recipe's streaming chunk, in speech tokens (the DiT's ``static_chunk_size`` is
#: ``chunk_size * token_mel_ratio`` mel frames)
CHUNK_SIZE = 25
#: the recipe's RAS sampling (the v3 presets carry none: it is not a size)
RECIPE_SAMPLING = SamplingConfig(top_p=0.8, top_k=25, win_size=10, tau_r=0.1)

#: the recipe's training sections (not read by cosyvino), with v3's three own lines
_TRAINING_SECTIONS = sections.training_sections(
    tokenizer_extra="    version: cosyvoice3\n",
    truncate_length="24960 # must be a multiplier of hop_size and token_mel_ratio",
    feat_fmax="null")


def _model_sections(p: CosyVoice3Preset) -> str:
    flow, pre, est = p.flow, p.flow.pre_lookahead, p.flow.estimator
    return (sections.fixed_params(sample_rate=p.hift.sampling_rate, llm_size=p.qwen.hidden_size,
                                  spk_embed_dim=p.spk_embed_dim,
                                  token_frame_rate=flow.input_frame_rate,
                                  token_mel_ratio=flow.token_mel_ratio, chunk_size=CHUNK_SIZE)
            + sections.llm_section("CosyVoice3LM", p.speech_token_size, RECIPE_SAMPLING)
            + sections.flow_head("CausalMaskedDiffWithDiT", flow)
            + f"""    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: {pre.in_channels}
        channels: {pre.channels}
        pre_lookahead_len: {pre.pre_lookahead_len}
"""
            + sections.cfm_decoder(flow.output_size, flow.cfm)
            + f"""        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {est.dim}
            depth: {est.depth}
            heads: {est.heads}
            dim_head: {est.dim_head}
            ff_mult: {yaml_number(est.ff_mult)}
            mel_dim: {est.mel_dim}
            mu_dim: {est.mu_dim}
            spk_dim: {est.spk_dim}
            out_channels: {flow.output_size}
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

"""
            + sections.hift_section(
                "CausalHiFTGenerator", "CausalConvRNNF0Predictor", p.hift,
                extra=f"    conv_pre_look_right: {p.hift.conv_pre_look_right}\n"))


def render_cosyvoice3_yaml(preset: CosyVoice3Preset, comment: str = "") -> str:
    """The ``cosyvoice3.yaml`` text of ``preset`` (``comment`` lines prepended as ``# ...``)."""
    return (sections.comment_lines(comment) + sections.SEEDS + _model_sections(preset)
            + _TRAINING_SECTIONS)


__all__ = ["render_cosyvoice3_yaml"]
