"""Render a :class:`~.presets.CosyVoice2Preset` as an official-format ``cosyvoice2.yaml``.

The text follows upstream's recipe yaml (``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml``,
sheet v2 source list) section by section, hyperpyyaml tags and the data-pipeline / training
sections included, so a synthetic dir reads exactly like a downloaded one: for the ``tiny``
preset the inert parse equals that of the official-code golden ``tiny-c`` yaml (tested), and the
v2 readers (:mod:`.config`, :mod:`.flow_config`, :mod:`.hift_config`) give back the preset's
configs. The sections shared with v3 are in :mod:`cosyvino.families.cosyvoice23.yaml_writer`.
``qwen_pretrain_path`` stays empty: the official loader overrides it with
``<model_dir>/CosyVoice-BlankEN`` (sheet v2 §1). No torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice2.presets import (
    CHUNK_SIZE,
    TOKEN_FRAME_RATE,
    TOKEN_MEL_RATIO,
    CosyVoice2Preset,
)
from cosyvino.families.cosyvoice23 import yaml_writer as sections
from cosyvino.families.cosyvoice23.yaml_writer import yaml_list


def _model_sections(p: CosyVoice2Preset) -> str:
    flow, enc, est = p.flow, p.flow.encoder, p.flow.estimator
    if TOKEN_MEL_RATIO != flow.token_mel_ratio or enc.static_chunk_size != CHUNK_SIZE or \
            est.static_chunk_size != CHUNK_SIZE * TOKEN_MEL_RATIO:
        raise ValueError("the recipe yaml ties the chunk sizes to chunk_size / token_mel_ratio")
    return (sections.fixed_params(sample_rate=p.sample_rate, llm_size=p.qwen.hidden_size,
                                  spk_embed_dim=p.spk_embed_dim,
                                  token_frame_rate=TOKEN_FRAME_RATE,
                                  token_mel_ratio=TOKEN_MEL_RATIO, chunk_size=CHUNK_SIZE)
            + sections.llm_section("Qwen2LM", p.speech_token_size, p.sampling)
            + sections.flow_head("CausalMaskedDiffWithXvec", flow)
            + f"""    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {enc.output_size}
        attention_heads: {enc.attention_heads}
        linear_units: {enc.linear_units}
        num_blocks: {enc.num_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {enc.input_size}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
"""
            + sections.cfm_decoder(flow.output_size, flow.cfm)
            + f"""        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: {est.in_channels}
            out_channels: {est.out_channels}
            channels: {yaml_list(est.channels)}
            dropout: 0.0
            attention_head_dim: {est.attention_head_dim}
            n_blocks: {est.n_blocks}
            num_mid_blocks: {est.num_mid_blocks}
            num_heads: {est.num_heads}
            act_fn: '{est.act_fn}'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

"""
            + sections.hift_section("HiFTGenerator", "ConvRNNF0Predictor", p.hift))


#: the recipe's training sections (not read by cosyvino), with v2's three own lines
_TRAINING_SECTIONS = sections.training_sections(
    tokenizer_extra="", truncate_length="24480 # must be a multiplier of hop_size",
    feat_fmax="8000")


def render_cosyvoice2_yaml(preset: CosyVoice2Preset, comment: str = "") -> str:
    """The ``cosyvoice2.yaml`` text of ``preset`` (``comment`` lines prepended as ``# ...``).

    Raises:
        ValueError: a preset whose flow chunk sizes differ from the recipe's ties
            (encoder ``chunk_size`` 25, estimator ``chunk_size * token_mel_ratio``).
    """
    return (sections.comment_lines(comment) + sections.SEEDS + _model_sections(preset)
            + _TRAINING_SECTIONS)
