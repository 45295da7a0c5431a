"""Render a :class:`~.presets.CosyVoice2Preset` as an official-format ``cosyvoice2.yaml``.

The text follows upstream's recipe yaml (``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml``,
sheet v2 source list) section by section, hyperpyyaml tags and the data-pipeline / training
sections included, so a synthetic dir reads exactly like a downloaded one: for the ``tiny``
preset the inert parse equals that of the official-code golden ``tiny-c`` yaml (tested), and the
v2 readers (:mod:`.config`, :mod:`.flow_config`, :mod:`.hift_config`) give back the preset's
configs. ``qwen_pretrain_path`` stays empty: the official loader overrides it with
``<model_dir>/CosyVoice-BlankEN`` (sheet v2 §1). No torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice2.presets import (
    CHUNK_SIZE,
    TOKEN_FRAME_RATE,
    TOKEN_MEL_RATIO,
    CosyVoice2Preset,
)


def _list(values) -> str:
    return "[" + ", ".join(_list(v) if isinstance(v, (list, tuple)) else str(v)
                           for v in values) + "]"


def _num(x: float) -> str:
    """A float as yaml reads it back as the same value (``1e-06``, ``0.7``)."""
    return repr(float(x)) if float(x) != int(x) else str(int(x))


def _model_sections(p: CosyVoice2Preset) -> str:
    flow, enc, est, hift, s = p.flow, p.flow.encoder, p.flow.estimator, p.hift, p.sampling
    if TOKEN_MEL_RATIO != flow.token_mel_ratio or enc.static_chunk_size != CHUNK_SIZE or \
            est.static_chunk_size != CHUNK_SIZE * TOKEN_MEL_RATIO:
        raise ValueError("the recipe yaml ties the chunk sizes to chunk_size / token_mel_ratio")
    return f"""# fixed params
sample_rate: {p.sample_rate}
llm_input_size: {p.qwen.hidden_size}
llm_output_size: {p.qwen.hidden_size}
spk_embed_dim: {p.spk_embed_dim}
qwen_pretrain_path: ''
token_frame_rate: {TOKEN_FRAME_RATE}
token_mel_ratio: {TOKEN_MEL_RATIO}

# stream related params
chunk_size: {CHUNK_SIZE} # streaming inference chunk size, in token
num_decoding_left_chunks: -1 # streaming inference flow decoder left chunk size, <0 means use all left chunks

# model params
# for all class/function included in this repo, we use !<name> or !<new> for intialization, so that user may find all corresponding class/function according to one single yaml.
# for system/third_party class/function, we do not require this.
llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {p.speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: {s.top_p}
        top_k: {s.top_k}
        win_size: {s.win_size}
        tau_r: {s.tau_r}

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {flow.input_size}
    output_size: {flow.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {flow.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {flow.pre_lookahead_len}
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
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
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {flow.output_size}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: {_num(flow.cfm.sigma_min)}
                solver: '{flow.cfm.solver}'
                t_scheduler: '{flow.cfm.t_scheduler}'
                training_cfg_rate: 0.2
                inference_cfg_rate: {_num(flow.cfm.inference_cfg_rate)}
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: {est.in_channels}
            out_channels: {est.out_channels}
            channels: {_list(est.channels)}
            dropout: 0.0
            attention_head_dim: {est.attention_head_dim}
            n_blocks: {est.n_blocks}
            num_mid_blocks: {est.num_mid_blocks}
            num_heads: {est.num_heads}
            act_fn: '{est.act_fn}'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: {hift.in_channels}
    base_channels: {hift.base_channels}
    nb_harmonics: {hift.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {hift.nsf_alpha}
    nsf_sigma: {hift.nsf_sigma}
    nsf_voiced_threshold: {_num(hift.nsf_voiced_threshold)}
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
"""


# The recipe's training sections, verbatim: nothing here is read by cosyvino (or by the
# official inference); they make a synthetic yaml as hard to parse as a downloaded one.
_TRAINING_SECTIONS = """
# gan related module
mel_spec_transform1: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResSpecDiscriminator
    mel_spec_transform: [
        !ref <mel_spec_transform1>
    ]

# processor functions
parquet_opener: !name:cosyvoice.dataset.processor.parquet_opener
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
allowed_special: 'all'
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
    allowed_special: !ref <allowed_special>
filter: !name:cosyvoice.dataset.processor.filter
    max_length: 6000
    min_length: 100
    token_max_length: 200
    token_min_length: 1
resample: !name:cosyvoice.dataset.processor.resample
    resample_rate: !ref <sample_rate>
truncate: !name:cosyvoice.dataset.processor.truncate
    truncate_length: 24480 # must be a multiplier of hop_size
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
    num_frames: 960
compute_whisper_fbank: !name:cosyvoice.dataset.processor.compute_whisper_fbank
    num_frames: 960
compute_f0: !name:cosyvoice.dataset.processor.compute_f0
    sample_rate: !ref <sample_rate>
    hop_size: 480
parse_embedding: !name:cosyvoice.dataset.processor.parse_embedding
    normalize: True
shuffle: !name:cosyvoice.dataset.processor.shuffle
    shuffle_size: 1000
sort: !name:cosyvoice.dataset.processor.sort
    sort_size: 500  # sort_size should be less than shuffle_size
batch: !name:cosyvoice.dataset.processor.batch
    batch_type: 'dynamic'
    max_frames_in_batch: 2000
padding: !name:cosyvoice.dataset.processor.padding
    use_spk_embedding: False # change to True during sft


# dataset processor pipeline
data_pipeline: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <compute_fbank>,
    !ref <parse_embedding>,
    !ref <compute_whisper_fbank>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]
data_pipeline_gan: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <truncate>,
    !ref <compute_fbank>,
    !ref <compute_f0>,
    !ref <parse_embedding>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]

# llm flow train conf
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5 # change to 1e-5 during sft
    scheduler: constantlr # change to constantlr during sft
    scheduler_conf:
        warmup_steps: 2500
    max_epoch: 200
    grad_clip: 5
    accum_grad: 2
    log_interval: 100
    save_per_step: -1

# gan train conf
train_conf_gan:
    optim: adam
    optim_conf:
        lr: 0.0002 # use small lr for gan training
    scheduler: constantlr
    optim_d: adam
    optim_conf_d:
        lr: 0.0002 # use small lr for gan training
    scheduler_d: constantlr
    max_epoch: 200
    grad_clip: 5
    accum_grad: 1 # in gan training, accum_grad must be 1
    log_interval: 100
    save_per_step: -1
"""

_SEEDS = """# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

"""


def render_cosyvoice2_yaml(preset: CosyVoice2Preset, comment: str = "") -> str:
    """The ``cosyvoice2.yaml`` text of ``preset`` (``comment`` lines prepended as ``# ...``).

    Raises:
        ValueError: a preset whose flow chunk sizes differ from the recipe's ties
            (encoder ``chunk_size`` 25, estimator ``chunk_size * token_mel_ratio``).
    """
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + _SEEDS + _model_sections(preset) + _TRAINING_SECTIONS
