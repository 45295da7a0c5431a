"""The CosyVoice2 family (CosyVoice2-0.5B): config, torch model, modes, streaming policy and graph
table. What it shares with CosyVoice3 (the Qwen2 speech LM on ``inputs_embeds``, the causal flow
pieces, the Qwen tokenizer) lives once in :mod:`cosyvino.families.cosyvoice23`.
Facts: the CosyVoice2 architecture sheet (section numbers cited in each module)."""

from __future__ import annotations

import os

from cosyvino.hookspecs import hookimpl

from ..base import DecodeProfile, GraphTable, ModelFamily
from ..official import official_family
from .modes import MODES, PROMPT_MODEL_FILES

#: official checkpoint files a conversion is made from (recorded by hash in manifests)
SOURCE_FILES = ("cosyvoice2.yaml", "CosyVoice-BlankEN/config.json", "llm.pt", "flow.pt",
                "hift.pt", "spk2info.pt")
#: cached positions of a typical request mid-decode: ~30 prefix positions + 125 speech tokens
#: (a 5 s segment at 25 Hz, sheet v2 §2)
TYPICAL_DECODE_POSITIONS = 155


class CosyVoice2(ModelFamily):
    """CosyVoice2-0.5B: Qwen2 speech LM -> causal flow matching (fixed noise) -> 24 kHz HiFT."""

    name = "cosyvoice2"
    description = "CosyVoice2 (CosyVoice2-0.5B)"
    config_files = ("cosyvoice2.yaml",)
    prompt_model_files = PROMPT_MODEL_FILES
    lanes = ("llm", "audio")  # the LLM and the flow/vocoder hops (program.py)
    modes = MODES

    @classmethod
    def detect(cls, model_dir: str) -> bool:
        """An official dir whose first yaml in the official order is ``cosyvoice2.yaml``."""
        try:
            return official_family(model_dir) == cls.name
        except Exception:  # noqa: BLE001 - detect never raises
            return False

    @classmethod
    def read_config(cls, model_dir: str):
        from .model_config import read_model_config

        return read_model_config(model_dir)

    @classmethod
    def source_files(cls, model_dir: str) -> tuple[str, ...]:
        return SOURCE_FILES

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """``tiny`` and ``0.5b`` (:mod:`.presets`)."""
        from .presets import PRESETS

        return tuple(PRESETS)

    @classmethod
    def make_synthetic(cls, preset: str, out_dir: str, **kwargs) -> str:
        """:func:`.synthetic.make_model` (imports torch)."""
        from .synthetic import make_model

        return make_model(preset, out_dir, **kwargs)

    @classmethod
    def graphs(cls, config) -> GraphTable:
        from .graphs import graph_table

        return graph_table(config)

    @classmethod
    def load_torch_model(cls, model_dir: str):
        from .torch.model import load_torch_model

        return load_torch_model(model_dir)

    @classmethod
    def export_graph(cls, model, spec, in_graph_state: bool):
        """OpenVINO traces the stateful ``llm`` with one cache state per layer and K/V
        (:func:`.graphs.layer_state_spec`, :class:`.torch.llm.LayerCacheStep`); every other
        graph, and every graph for ONNX, is the table's own module."""
        if in_graph_state and spec.state:
            from .graphs import layer_state_spec
            from .torch.llm import LayerCacheStep

            return layer_state_spec(spec), LayerCacheStep(model.llm)
        return super().export_graph(model, spec, in_graph_state)

    @classmethod
    def export_layout(cls, in_graph_state: bool) -> dict:
        """OpenVINO: :data:`.graphs.OPENVINO_LLM_LAYOUT`."""
        if in_graph_state:
            from .graphs import OPENVINO_LLM_LAYOUT

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
    def write_serving_files(cls, model, model_dir: str, out_dir: str) -> list[str]:
        from .serving_files import write_serving_files

        return write_serving_files(model, model_dir, out_dir)

    @classmethod
    def speakers(cls, model_dir: str) -> list[str]:
        """The SFT speakers of ``spk2info.pt`` (entries with an ``embedding``; imports torch);
        of a converted dir, those of its voice files (numpy only).

        Raises ConvertedModelError: a converted dir's voice files are unreadable."""
        from cosyvino.converted import is_converted_dir

        if is_converted_dir(model_dir):
            from .voices import read_voice_files

            return list(read_voice_files(model_dir)[0])
        from .speakers import load_cosyvoice2_spk2info

        path = os.path.join(model_dir, "spk2info.pt")
        if not os.path.isfile(path):
            return []
        return [n for n, s in load_cosyvoice2_spk2info(path).items() if s.embedding is not None]

    @classmethod
    def stages_from_runner(cls, runner, model_dir: str):
        from .graph_stages import CosyVoice2GraphStages

        return CosyVoice2GraphStages(runner, model_dir)

    @classmethod
    def speech_vocab(cls, config) -> int:
        return config.flow.vocab_size

    @classmethod
    def decode_profile(cls, config) -> DecodeProfile:
        """Qwen2 decoder of ``config.llm.qwen`` (sheet v2 §8): per layer q (D·D + D), k and v
        (D·KV + KV each), o (D·D), the gated MLP (3·D·I) and two RMSNorms (2·D); the final norm
        (D); the speech head ``llm_decoder`` (D·V3 + V3). Qwen's text head is never run.
        fp32 K/V: 2 · layers · KV values per position (6144 at 0.5B)."""
        q, llm = config.llm.qwen, config.llm
        d, kv, i = q.hidden_size, q.num_key_value_heads * q.attention_head_dim, \
            q.intermediate_size
        per_layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * i + 2 * d
        params = q.num_hidden_layers * per_layer + d \
            + llm.llm_output_size * llm.vocab_out + llm.vocab_out
        return DecodeProfile(params=int(params),
                             kv_bytes_per_position=2 * q.num_hidden_layers * kv * 4,
                             typical_positions=TYPICAL_DECODE_POSITIONS)

    @classmethod
    def make_frontend(cls, config):
        from .frontend import CosyVoice2Frontend

        return CosyVoice2Frontend.from_model_dir(config.model_dir)

    @classmethod
    def modes_for(cls, model_dir, stages) -> dict:
        """Every v2 mode but ``sft`` without SFT speakers (:func:`.modes.modes_for`): the prompt
        modes are offered with or without the prompt models (stored voices serve them)."""
        from .modes import modes_for

        return modes_for(stages.speakers)

    @classmethod
    def mode_unavailable_reason(cls, model_dir, stages, name: str) -> str | None:
        from .modes import unavailable_reason

        return unavailable_reason(stages.speakers, name)

    @classmethod
    def prompt_encoder(cls, model_dir, stages, *, backend: str | None = None, **options):
        """The v2 :class:`~.prompt_models.PromptEncoder` (``campplus.onnx`` +
        ``speech_tokenizer_v2.onnx`` on ``backend``, None: OpenVINO when installed, else
        another backend that runs ONNX files; the dir's own 24 kHz prompt mel,
        :func:`~.prompt_models.read_prompt_mel_config`) when ``model_dir`` holds both prompt
        models; else an :class:`~.modes.UnavailablePromptEncoder` that refuses recordings with
        the missing file names and still checks stored voices.

        Raises: ConfigError / ModelDirError from reading the yaml's ``feat_extractor``."""
        from .modes import UnavailablePromptEncoder, missing_prompt_models

        cfg = stages.config.flow
        shapes = {"embedding_dim": cfg.spk_embed_dim, "speech_vocab": cfg.vocab_size,
                  "mel_bins": cfg.output_size}
        if model_dir is None or missing_prompt_models(model_dir):
            return UnavailablePromptEncoder(model_dir, **shapes)
        from .prompt_models import PromptEncoder, read_prompt_mel_config

        return PromptEncoder(model_dir, backend, mel=read_prompt_mel_config(model_dir),
                             **shapes, **options)

    @classmethod
    def new_program(cls, stages, request, draws, frontend, batchers=None):
        from .program import CosyVoice2Program

        return CosyVoice2Program(stages, request, draws, frontend)


@hookimpl
def register_families(register):
    register(CosyVoice2)
