"""Typed hyperparameters of a CosyVoice v1 model.

Filled from the official ``cosyvoice.yaml`` by :mod:`cosyvino.families.cosyvoice1.yaml_config` (which never
imports or runs what the yaml names) or from a built-in preset (:mod:`cosyvino.families.cosyvoice1.presets`).
Field names follow the upstream constructor arguments so a reader can map them back to the yaml.
This module must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EncoderConfig:
    """A rel-pos (ESPnet) encoder stack: the LLM text encoder, the LLM itself, the flow encoder.

    ``layer_type`` is ``"conformer"`` (SiLU FFN, norms ``norm_mha``/``norm_ff``) or
    ``"transformer"`` (ReLU FFN, norms ``norm1``/``norm2``); upstream
    ``cosyvoice/transformer/encoder.py``. ``input_layer`` is ``"linear"`` (Linear+LayerNorm) or
    ``"linear_legacy"`` (Linear+LayerNorm+ReLU). ``static_chunk_size`` 1 means causal attention,
    0 means full attention.
    """

    input_size: int
    output_size: int
    attention_heads: int
    linear_units: int
    num_blocks: int
    layer_type: str = "conformer"
    input_layer: str = "linear"
    static_chunk_size: int = 0
    normalize_before: bool = True
    key_bias: bool = True
    layer_norm_eps: float = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """Repetition-aware sampling (RAS) parameters; upstream ``cosyvoice/utils/common.py``."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass(frozen=True)
class LLMConfig:
    """``TransformerLM`` (upstream ``cosyvoice/llm/llm.py``)."""

    text_encoder_input_size: int
    llm_input_size: int
    llm_output_size: int
    text_token_size: int
    speech_token_size: int
    spk_embed_dim: int
    text_encoder: EncoderConfig
    llm: EncoderConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Decoding bounds relative to the tts text token count (upstream llm.inference defaults).
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    @property
    def eos_token(self) -> int:
        """EOS id = speech_token_size (4096 for v1)."""
        return self.speech_token_size


@dataclass(frozen=True)
class EstimatorConfig:
    """``ConditionalDecoder`` U-Net (upstream ``cosyvoice/flow/decoder.py``)."""

    in_channels: int
    out_channels: int
    channels: tuple[int, ...]
    attention_head_dim: int
    n_blocks: int
    num_mid_blocks: int
    num_heads: int
    act_fn: str = "gelu"


@dataclass(frozen=True)
class CFMConfig:
    """Conditional flow matching solver (upstream ``cosyvoice/flow/flow_matching.py``)."""

    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "cosine"
    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10


@dataclass(frozen=True)
class FlowConfig:
    """``MaskedDiffWithXvec`` (upstream ``cosyvoice/flow/flow.py``)."""

    input_size: int
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    encoder: EncoderConfig
    length_regulator_channels: int
    length_regulator_sampling_ratios: tuple[int, ...]
    estimator: EstimatorConfig
    cfm: CFMConfig = field(default_factory=CFMConfig)


@dataclass(frozen=True)
class HiFTConfig:
    """``HiFTGenerator`` (upstream ``cosyvoice/hifigan/generator.py``)."""

    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    istft_n_fft: int
    istft_hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_num_class: int = 1
    f0_in_channels: int = 80
    f0_cond_channels: int = 512

    @property
    def hop_length(self) -> int:
        """Output samples per mel frame (prod(upsample_rates) * istft hop; 256 for v1)."""
        n = self.istft_hop_len
        for r in self.upsample_rates:
            n *= r
        return n


@dataclass(frozen=True)
class MelConfig:
    """Mel front-end of the flow (``feat_extractor``, Matcha ``mel_spectrogram``)."""

    n_fft: int = 1024
    num_mels: int = 80
    sampling_rate: int = 22050
    hop_size: int = 256
    win_size: int = 1024
    fmin: float = 0.0
    fmax: float | None = 8000.0


@dataclass(frozen=True)
class ModelConfig:
    """Everything cosyvino needs from ``cosyvoice.yaml``."""

    sample_rate: int
    llm: LLMConfig
    flow: FlowConfig
    hift: HiFTConfig
    mel: MelConfig = field(default_factory=MelConfig)
    allowed_special: str = "all"
