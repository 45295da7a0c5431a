"""What the CosyVoice2 and CosyVoice3 model families do alike (:class:`SpeechLMFamily`): official
dir detection by the family's yaml, the ``spk2info.pt`` speakers, the speech-LM decode profile,
the modes (:mod:`.modes`), the choice of prompt encoder (the family's own when the dir has its
prompt models, else the stand-in that refuses recordings) and the OpenVINO layout of the
stateful LLM step (one KV state per layer). Each family sets its names and files
and builds its own config, torch model, graph table, stages and program. Must not import torch.
"""

from __future__ import annotations

import os
from typing import ClassVar

from ..base import DecodeProfile, ModelFamily
from ..official import official_family
from .modes import MODES

#: cached positions of a typical request mid-decode: ~30 prefix positions + 125 speech tokens
#: (a 5 s segment at 25 Hz, sheet v2 §2 / v3 §2)
TYPICAL_DECODE_POSITIONS = 155


class SpeechLMFamily(ModelFamily):
    """Base of the CosyVoice2 / CosyVoice3 families. Subclasses set ``name``, ``description``,
    ``config_files`` (the yaml), :attr:`title`, :attr:`source_file_names`,
    :attr:`prompt_model_files`, :attr:`head_bias` and implement the model-specific methods."""

    lanes = ("llm", "audio")  # the LLM and the flow/vocoder hops (cosyvoice23.program)
    modes = MODES
    #: how messages name the family
    title: ClassVar[str] = ""
    #: official checkpoint files a conversion is made from (recorded by hash in manifests)
    source_file_names: ClassVar[tuple[str, ...]] = ()
    #: the prompt models of an official dir (CAM++ and the family's speech tokenizer)
    prompt_model_files: ClassVar[tuple[str, ...]] = ()
    #: whether the speech head ``llm_decoder`` has a bias (v2 yes, v3 no)
    head_bias: ClassVar[bool] = True

    @classmethod
    def batch_limits(cls) -> dict[str, int]:
        """One row per decode step (the stages' ``max_llm_batch`` 1: each request's
        :class:`LLMSession` steps alone) and one request per estimator call (no
        :meth:`batchable_stages`), on every backend."""
        return {"llm_batch": 1, "estimator_batch": 1}

    @classmethod
    def detect(cls, model_dir: str) -> bool:
        """An official dir whose first yaml in the official order is the family's."""
        try:
            return official_family(model_dir) == cls.name
        except Exception:  # noqa: BLE001 - detect never raises
            return False

    @classmethod
    def source_files(cls, model_dir: str) -> tuple[str, ...]:
        return cls.source_file_names

    @classmethod
    def speakers(cls, model_dir: str) -> list[str]:
        """The SFT speakers of ``spk2info.pt`` (entries with an ``embedding``; imports torch);
        of a converted dir, those of its voice files (numpy only).

        Raises ConvertedModelError: a converted dir's voice files are unreadable."""
        from cosyvino.converted import is_converted_dir

        if is_converted_dir(model_dir):
            from .voices import read_voice_files

            return list(read_voice_files(model_dir)[0])
        from .speakers import load_spk2info

        path = os.path.join(model_dir, "spk2info.pt")
        if not os.path.isfile(path):
            return []
        return [n for n, s in load_spk2info(path).items() if s.embedding is not None]

    @classmethod
    def speech_vocab(cls, config) -> int:
        return config.flow.vocab_size

    @classmethod
    def decode_profile(cls, config) -> DecodeProfile:
        """Qwen2 decoder of ``config.llm.qwen`` (sheet v2 §8, v3 §8): per layer q (D·D + D), k
        and v (D·KV + KV each), o (D·D), the gated MLP (3·D·I) and two RMSNorms (2·D); the final
        norm (D); the speech head ``llm_decoder`` (D·V, + V with :attr:`head_bias`). Qwen's text
        head is never run. fp32 K/V: 2 · layers · KV values per position (6144 at 0.5B)."""
        q, llm = config.llm.qwen, config.llm
        d, kv, i = q.hidden_size, q.num_key_value_heads * q.attention_head_dim, \
            q.intermediate_size
        per_layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * i + 2 * d
        params = q.num_hidden_layers * per_layer + d \
            + llm.llm_output_size * llm.vocab_out + (llm.vocab_out if cls.head_bias else 0)
        return DecodeProfile(params=int(params),
                             kv_bytes_per_position=2 * q.num_hidden_layers * kv * 4,
                             typical_positions=TYPICAL_DECODE_POSITIONS)

    @classmethod
    def export_graph(cls, model, spec, *, state_in_graph: bool = False):
        """With the state in the graph (the OpenVINO exporter) the stateful ``llm`` has one
        cache state per layer and K/V (:func:`.graph_specs.layer_state_spec`,
        :class:`.torch.speech_lm.LayerCacheStep`; the same Qwen2 step in v2 and v3); every
        other graph, and every graph of an exporter that feeds the state back (ONNX), is the
        table's own module. Imports torch (the module)."""
        if state_in_graph and spec.state:
            from .graph_specs import layer_state_spec
            from .torch.speech_lm import LayerCacheStep

            return layer_state_spec(spec), LayerCacheStep(model.llm)
        return super().export_graph(model, spec, state_in_graph=state_in_graph)

    @classmethod
    def export_layout(cls, *, state_in_graph: bool = False) -> dict:
        """With the state in the graph (OpenVINO): :data:`.graph_specs.OPENVINO_LLM_LAYOUT`."""
        if state_in_graph:
            from .graph_specs import OPENVINO_LLM_LAYOUT

            return dict(OPENVINO_LLM_LAYOUT)
        return {}

    @classmethod
    def manifest_fields(cls, model, *, stateful: bool, llm_layout: dict | None = None) -> dict:
        """For a stateful (OpenVINO) conversion, ``llm``: the cache layout (``layers``,
        ``kv_heads``, ``head_dim``), ``stateful`` and the exporter's ``llm_layout``; none for
        a conversion that feeds the state back (ONNX)."""
        if not stateful:
            return {}
        q = model.config.llm.qwen
        return {"llm": {"layers": q.num_hidden_layers, "kv_heads": q.num_key_value_heads,
                        "head_dim": q.attention_head_dim, "stateful": True,
                        **(llm_layout or {})}}

    @classmethod
    def modes_for(cls, model_dir, stages) -> dict:
        from .modes import modes_for

        return modes_for(stages.speakers)

    @classmethod
    def mode_unavailable_reason(cls, model_dir, stages, name: str) -> str | None:
        from .modes import unavailable_reason

        return unavailable_reason(stages.speakers, name)

    @classmethod
    def prompt_models_reason(cls, model_dir) -> str:
        """Why recordings are refused for ``model_dir`` (one sentence naming the prompt-model
        files): :func:`.modes.prompt_models_reason` of :attr:`prompt_model_files`."""
        from .modes import prompt_models_reason

        return prompt_models_reason(model_dir, cls.title, cls.prompt_model_files)

    @classmethod
    def recording_encoder(cls, model_dir: str, backend: str | None, *, embedding_dim: int,
                          mel_bins: int, speech_vocab: int, **options):
        """The family's prompt encoder that runs the prompt models of ``model_dir`` (which has
        all of :attr:`prompt_model_files`), or None when cosyvino does not run them for this
        family (default; CosyVoice3 for now)."""

    @classmethod
    def prompt_encoder(cls, model_dir, stages, *, backend: str | None = None, **options):
        """:meth:`recording_encoder` when ``model_dir`` holds every one of
        :attr:`prompt_model_files` and the family runs them; else an
        :class:`~.modes.UnavailablePromptEncoder` that refuses recordings with
        :meth:`prompt_models_reason` and still checks stored voices (shapes, prompt-mel rate).

        Raises what :meth:`recording_encoder` raises (e.g. ConfigError for a bad yaml)."""
        from .modes import UnavailablePromptEncoder, missing_prompt_models

        cfg = stages.config.flow
        shapes = {"embedding_dim": cfg.spk_embed_dim, "mel_bins": cfg.output_size,
                  "speech_vocab": cfg.vocab_size}
        if model_dir is not None and not missing_prompt_models(model_dir,
                                                                cls.prompt_model_files):
            encoder = cls.recording_encoder(model_dir, backend, **shapes, **options)
            if encoder is not None:
                return encoder
        return UnavailablePromptEncoder(model_dir, reason=cls.prompt_models_reason(model_dir),
                                        **shapes)


__all__ = ["TYPICAL_DECODE_POSITIONS", "SpeechLMFamily"]
