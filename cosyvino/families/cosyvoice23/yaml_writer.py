"""The sections the CosyVoice2 and CosyVoice3 recipe yamls share, as text.

Upstream's ``examples/libritts/cosyvoice{2,3}/conf/cosyvoice{2,3}.yaml`` are the same file but
for the LM / flow / HiFT class names, the flow's encoder (v2 conformer) or look-ahead layer (v3),
the estimator (v2 U-Net, v3 DiT), v3's ``conv_pre_look_right`` and three data-pipeline lines.
Each family's ``yaml_writer`` joins these sections around its own parts; the rendered text of
the tiny presets equals the official-code goldens' yaml (tested per family). No torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice1.config import CFMConfig, SamplingConfig

SEEDS = """# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

"""


def yaml_list(values) -> str:
    """``[1, 3, 5]`` / ``[[1, 3, 5], [1, 3, 5]]``: a (nested) sequence in the recipe's flow
    style."""
    return "[" + ", ".join(yaml_list(v) if isinstance(v, (list, tuple)) else str(v)
                           for v in values) + "]"


def yaml_number(x: float) -> str:
    """A number as the recipe writes it and yaml reads it back as the same value: ``2`` for
    2.0, else the float's repr (``1e-06``, ``0.7``)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def comment_lines(comment: str) -> str:
    """``comment``'s lines as ``# ...`` lines (each newline-terminated; empty for ``""``)."""
    return "".join(f"# {line}\n" for line in comment.splitlines())


def fixed_params(*, sample_rate: int, llm_size: int, spk_embed_dim: int,
                 token_frame_rate: int, token_mel_ratio: int, chunk_size: int) -> str:
    """The ``fixed params`` / ``stream related params`` head up to the ``model params``
    comment (``qwen_pretrain_path`` empty: the official loader sets it, sheet v2 §1)."""
    return f"""# fixed params
sample_rate: {sample_rate}
llm_input_size: {llm_size}
llm_output_size: {llm_size}
spk_embed_dim: {spk_embed_dim}
qwen_pretrain_path: ''
token_frame_rate: {token_frame_rate}
token_mel_ratio: {token_mel_ratio}

# stream related params
chunk_size: {chunk_size} # streaming inference chunk size, in token
num_decoding_left_chunks: -1 # streaming inference flow decoder left chunk size, <0 means use all left chunks

# model params
# for all class/function included in this repo, we use !<name> or !<new> for intialization, so that user may find all corresponding class/function according to one single yaml.
# for system/third_party class/function, we do not require this.
"""


def llm_section(lm_class: str, speech_token_size: int, s: SamplingConfig) -> str:
    """``llm: !new:cosyvoice.llm.llm.<lm_class>`` on the Qwen2 encoder with RAS sampling."""
    return f"""llm: !new:cosyvoice.llm.llm.{lm_class}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_token_size}
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

"""


def flow_head(flow_class: str, flow) -> str:
    """``flow: !new:cosyvoice.flow.flow.<flow_class>`` and its scalar arguments (``flow``: the
    family's flow config: ``input_size``, ``output_size``, ``vocab_size``,
    ``pre_lookahead_len``); the family's encoder / look-ahead layer follows."""
    return f"""flow: !new:cosyvoice.flow.flow.{flow_class}
    input_size: {flow.input_size}
    output_size: {flow.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {flow.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {flow.pre_lookahead_len}
"""


def cfm_decoder(spk_emb_dim: int, cfm: CFMConfig) -> str:
    """The flow's ``decoder: CausalConditionalCFM`` head with its ``cfm_params``; the family's
    ``estimator:`` follows (indented 8)."""
    return f"""    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: {spk_emb_dim}
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: {yaml_number(cfm.sigma_min)}
                solver: '{cfm.solver}'
                t_scheduler: '{cfm.t_scheduler}'
                training_cfg_rate: 0.2
                inference_cfg_rate: {yaml_number(cfm.inference_cfg_rate)}
                reg_loss_type: 'l1'
"""


def hift_section(hift_class: str, f0_class: str, hift, extra: str = "") -> str:
    """``hift: !new:cosyvoice.hifigan.generator.<hift_class>`` from the family's HiFT config
    ``hift`` (the v2 / v3 config fields), ``extra`` lines (indented 4) before the
    ``f0_predictor: <f0_class>``; ends with a blank line."""
    return f"""hift: !new:cosyvoice.hifigan.generator.{hift_class}
    in_channels: {hift.in_channels}
    base_channels: {hift.base_channels}
    nb_harmonics: {hift.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {hift.nsf_alpha}
    nsf_sigma: {hift.nsf_sigma}
    nsf_voiced_threshold: {yaml_number(hift.nsf_voiced_threshold)}
    upsample_rates: {yaml_list(hift.upsample_rates)}
    upsample_kernel_sizes: {yaml_list(hift.upsample_kernel_sizes)}
    istft_params:
        n_fft: {hift.istft_n_fft}
        hop_len: {hift.istft_hop_len}
    resblock_kernel_sizes: {yaml_list(hift.resblock_kernel_sizes)}
    resblock_dilation_sizes: {yaml_list(hift.resblock_dilation_sizes)}
    source_resblock_kernel_sizes: {yaml_list(hift.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {yaml_list(hift.source_resblock_dilation_sizes)}
    lrelu_slope: {hift.lrelu_slope}
    audio_limit: {hift.audio_limit}
{extra}    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0_class}
        num_class: {hift.f0_num_class}
        in_channels: {hift.f0_in_channels}
        cond_channels: {hift.f0_cond_channels}

"""


def _mel_spectrogram(key: str, fmax: str) -> str:
    """A ``matcha`` mel-spectrogram node at 24 kHz (hop 480 = one 50 Hz mel frame)."""
    return f"""{key}: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: {fmax}
    center: False
"""


def training_sections(*, tokenizer_extra: str, truncate_length: str, feat_fmax: str) -> str:
    """The recipe's GAN, data-pipeline and training sections, verbatim but for the family's
    ``get_tokenizer`` extra lines (indented 4), the ``truncate_length`` value (with its
    comment) and the ``feat_extractor``'s ``fmax``. Nothing here is read by cosyvino (or by
    the official inference); they make a synthetic yaml as hard to parse as a downloaded one."""
    return f"""# gan related module
{_mel_spectrogram("mel_spec_transform1", "null")}hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
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
{tokenizer_extra}allowed_special: 'all'
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
    truncate_length: {truncate_length}
{_mel_spectrogram("feat_extractor", feat_fmax)}compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
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


__all__ = ["SEEDS", "cfm_decoder", "comment_lines", "fixed_params", "flow_head",
           "hift_section", "llm_section", "training_sections", "yaml_list", "yaml_number"]
