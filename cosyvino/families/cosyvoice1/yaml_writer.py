"""Render a :class:`ModelConfig` as an official-format ``cosyvoice.yaml`` (hyperpyyaml tags).

Used for synthetic checkpoints so they are laid out exactly like an official download and go
through the same strict loading path. Only the inference-relevant sections are written.
Round-trip: ``read_model_config(render_cosyvoice_yaml(cfg)) == cfg`` (tested). No torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice1.config import EncoderConfig, ModelConfig

_ENCODER_CLASS = {"conformer": "cosyvoice.transformer.encoder.ConformerEncoder",
                  "transformer": "cosyvoice.transformer.encoder.TransformerEncoder"}


def _list(values) -> str:
    return "[" + ", ".join(_list(v) if isinstance(v, (list, tuple)) else str(v)
                           for v in values) + "]"


def _encoder(e: EncoderConfig, indent: str) -> str:
    lines = [
        f"input_size: {e.input_size}", f"output_size: {e.output_size}",
        f"attention_heads: {e.attention_heads}", f"linear_units: {e.linear_units}",
        f"num_blocks: {e.num_blocks}", "dropout_rate: 0.1", "positional_dropout_rate: 0.1",
        "attention_dropout_rate: 0.0", f"normalize_before: {e.normalize_before}",
        f"input_layer: '{e.input_layer}'", "pos_enc_layer_type: 'rel_pos_espnet'",
        "selfattention_layer_type: 'rel_selfattn'", f"static_chunk_size: {e.static_chunk_size}",
    ]
    if e.layer_type == "conformer":
        lines += ["use_cnn_module: False", "macaron_style: False"]
    if not e.key_bias:
        lines.append("key_bias: False")
    return "".join(f"{indent}{line}\n" for line in lines)


def render_cosyvoice_yaml(cfg: ModelConfig, comment: str = "") -> str:
    """The yaml text for ``cfg`` (``comment`` lines are prepended as ``# ...``)."""
    llm, flow, hift, mel = cfg.llm, cfg.flow, cfg.hift, cfg.mel
    s = llm.sampling
    est = flow.estimator
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return f"""{head}# CosyVoice v1 model config (hyperpyyaml layout of the official model repositories).
sample_rate: {cfg.sample_rate}
text_encoder_input_size: {llm.text_encoder_input_size}
llm_input_size: {llm.llm_input_size}
llm_output_size: {llm.llm_output_size}
spk_embed_dim: {llm.spk_embed_dim}

llm: !new:cosyvoice.llm.llm.TransformerLM
    text_encoder_input_size: !ref <text_encoder_input_size>
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    text_token_size: {llm.text_token_size}
    speech_token_size: {llm.speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    spk_embed_dim: !ref <spk_embed_dim>
    text_encoder: !new:{_ENCODER_CLASS[llm.text_encoder.layer_type]}
{_encoder(llm.text_encoder, " " * 8)}    llm: !new:{_ENCODER_CLASS[llm.llm.layer_type]}
{_encoder(llm.llm, " " * 8)}    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: {s.top_p}
        top_k: {s.top_k}
        win_size: {s.win_size}
        tau_r: {s.tau_r}

flow: !new:cosyvoice.flow.flow.MaskedDiffWithXvec
    input_size: {flow.input_size}
    output_size: {flow.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {flow.vocab_size}
    input_frame_rate: {flow.input_frame_rate}
    only_mask_loss: True
    encoder: !new:{_ENCODER_CLASS[flow.encoder.layer_type]}
{_encoder(flow.encoder, " " * 8)}    length_regulator: !new:cosyvoice.flow.length_regulator.InterpolateRegulator
        channels: {flow.length_regulator_channels}
        sampling_ratios: {_list(flow.length_regulator_sampling_ratios)}
    decoder: !new:cosyvoice.flow.flow_matching.ConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {flow.output_size}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: {flow.cfm.sigma_min!r}
                solver: '{flow.cfm.solver}'
                t_scheduler: '{flow.cfm.t_scheduler}'
                training_cfg_rate: 0.2
                inference_cfg_rate: {flow.cfm.inference_cfg_rate}
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.ConditionalDecoder
            in_channels: {est.in_channels}
            out_channels: {est.out_channels}
            channels: {_list(est.channels)}
            dropout: 0.0
            attention_head_dim: {est.attention_head_dim}
            n_blocks: {est.n_blocks}
            num_mid_blocks: {est.num_mid_blocks}
            num_heads: {est.num_heads}
            act_fn: '{est.act_fn}'

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: {hift.in_channels}
    base_channels: {hift.base_channels}
    nb_harmonics: {hift.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {hift.nsf_alpha}
    nsf_sigma: {hift.nsf_sigma}
    nsf_voiced_threshold: {hift.nsf_voiced_threshold:g}
    upsample_rates: {_list(hift.upsample_rates)}
    upsample_kernel_sizes: {_list(hift.upsample_kernel_sizes)}
    istft_params:
        n_fft: {hift.istft_n_fft}
        hop_len: {hift.istft_hop_len}
    resblock_kernel_sizes: {_list(hift.resblock_kernel_sizes)}
    resblock_dilation_sizes: {_list(hift.resblock_dilation_sizes)}
    source_resblock_kernel_sizes: {_list(hift.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {_list(hift.source_resblock_dilation_sizes)}
    lrelu_slope: {hift.lrelu_slope}
    audio_limit: {hift.audio_limit}
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: {hift.f0_num_class}
        in_channels: {hift.f0_in_channels}
        cond_channels: {hift.f0_cond_channels}

get_tokenizer: !name:whisper.tokenizer.get_tokenizer
    multilingual: True
    num_languages: 100
    language: 'en'
    task: 'transcribe'
allowed_special: '{cfg.allowed_special}'
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: {mel.n_fft}
    num_mels: {mel.num_mels}
    sampling_rate: !ref <sample_rate>
    hop_size: {mel.hop_size}
    win_size: {mel.win_size}
    fmin: {mel.fmin:g}
    fmax: {"null" if mel.fmax is None else f"{mel.fmax:g}"}
    center: False
"""
