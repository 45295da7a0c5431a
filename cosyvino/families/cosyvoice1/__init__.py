"""The CosyVoice v1 model family (CosyVoice-300M, -300M-SFT, -300M-Instruct): config and yaml
reading, synthetic presets, the PyTorch model, THE graph table (:mod:`.graphs`), the stage
calls (:mod:`.stages`), modes, streaming policy and the per-request program. Registered
through the ``register_families`` hook (a built-in plugin of the core). Importing this package
does not import torch.
"""

from __future__ import annotations

import os

from cosyvino.hookspecs import hookimpl

from ..base import DecodeProfile, GraphTable, ModelFamily

#: official checkpoint files a conversion is made from (recorded by hash in manifests)
SOURCE_FILES = ("cosyvoice.yaml", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt")

#: cached positions of a typical request mid-decode: a 5 s segment ends at ~50 prompt/text
#: positions + 250 speech tokens (50 Hz, architecture sheet section 3)
TYPICAL_DECODE_POSITIONS = 300


class CosyVoice1(ModelFamily):
    """CosyVoice v1: text-speech LM (TransformerLM) -> conditional flow matching -> HiFT."""

    name = "cosyvoice1"
    description = "CosyVoice v1 (CosyVoice-300M / -SFT / -Instruct)"
    config_files = ("cosyvoice.yaml",)
    lanes = ("llm", "audio")  # the LLM and the flow/vocoder hops (program.py)
    quantizable = True  # cosyvino quantize: its own OpenVINO stages, recorded by capture.py
    # github.com/FunAudioLLM/CosyVoice README, "Model download" (snapshot_download calls)
    download_ids = {
        "CosyVoice-300M": {"huggingface": "FunAudioLLM/CosyVoice-300M",
                           "modelscope": "iic/CosyVoice-300M"},
        "CosyVoice-300M-SFT": {"huggingface": "FunAudioLLM/CosyVoice-300M-SFT",
                               "modelscope": "iic/CosyVoice-300M-SFT"},
        "CosyVoice-300M-Instruct": {"huggingface": "FunAudioLLM/CosyVoice-300M-Instruct",
                                    "modelscope": "iic/CosyVoice-300M-Instruct"},
    }

    @classmethod
    def detect(cls, model_dir: str) -> bool:
        path = os.path.join(os.fspath(model_dir), "cosyvoice.yaml")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return False
        # v2/v3 yamls name Qwen2LM / CosyVoice2 classes; v1 names cosyvoice.llm.llm.TransformerLM
        return "Qwen2LM" not in text and "CausalMaskedDiffWithXvec" not in text

    @classmethod
    def read_config(cls, model_dir: str):
        from .yaml_config import read_model_config

        return read_model_config(model_dir)

    @classmethod
    def source_files(cls, model_dir: str) -> tuple[str, ...]:
        return SOURCE_FILES

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        from .presets import PRESETS

        return tuple(PRESETS)

    @classmethod
    def make_synthetic(cls, preset: str, out_dir: str, **kwargs) -> str:
        from .synthetic import make_model

        return make_model(preset, out_dir, **kwargs)

    @classmethod
    def graphs(cls, config) -> GraphTable:
        from .graphs import graph_table

        return graph_table(config)

    @classmethod
    def load_torch_model(cls, model_dir: str):
        from .torch.loading import load_torch_model

        return load_torch_model(model_dir)

    @classmethod
    def write_serving_files(cls, model, model_dir: str, out_dir: str) -> list[str]:
        from .serving_files import write_serving_files

        return write_serving_files(model, model_dir, out_dir)

    @classmethod
    def export_graph(cls, model, spec, *, state_in_graph: bool = False):
        """With the state in the graph (the OpenVINO exporter) the stateful ``llm`` step is
        :class:`cosyvino.export.openvino.model_patcher.LLMCacheStep` (its positional tables in
        windows of ``POS_BUCKET`` rows); every other graph, and every graph of an exporter that
        feeds the state back (ONNX), is the table's own module."""
        if state_in_graph and spec.state:
            from cosyvino.export.openvino.model_patcher import LLMCacheStep

            return spec, LLMCacheStep(model.llm)
        return super().export_graph(model, spec, state_in_graph=state_in_graph)

    @classmethod
    def export_layout(cls, *, state_in_graph: bool = False) -> dict:
        """With the state in the graph (OpenVINO):
        :data:`cosyvino.export.openvino.model_patcher.LLM_LAYOUT` (imports torch)."""
        if state_in_graph:
            from cosyvino.export.openvino.model_patcher import LLM_LAYOUT

            return dict(LLM_LAYOUT)
        return {}

    @classmethod
    def manifest_fields(cls, model, *, stateful: bool, llm_layout: dict | None = None) -> dict:
        from .serving_files import llm_cache_layout

        layers, heads, dk, d = llm_cache_layout(model)
        return {"llm": {"layers": layers, "heads": heads, "head_dim": dk, "width": d,
                        "stateful": stateful, "pos_bucket": 1,
                        **(llm_layout or {})}}

    @classmethod
    def speakers(cls, model_dir: str) -> list[str]:
        from .checkpoint import read_speaker_names

        return read_speaker_names(os.path.join(model_dir, "spk2info.pt"))

    @classmethod
    def stages_from_runner(cls, runner, model_dir: str):
        from .graph_stages import GraphStages

        return GraphStages(runner, model_dir)

    @classmethod
    def speech_vocab(cls, config) -> int:
        return config.flow.vocab_size

    @classmethod
    def decode_profile(cls, config) -> DecodeProfile:
        """The TransformerLM decoder of ``config.llm`` (architecture sheet 3.2): per block the
        q/k/v/out projections (4 d^2), the relative-position projection (d^2) and the FFN
        (2 d F), plus the speech-token head (d x (speech_token_size + 1)); fp32 K/V caches."""
        enc = config.llm.llm
        d, ffn, layers = enc.output_size, enc.linear_units, enc.num_blocks
        params = layers * (5 * d * d + 2 * d * ffn) \
            + config.llm.llm_output_size * (config.llm.speech_token_size + 1)
        return DecodeProfile(params=int(params), kv_bytes_per_position=2 * layers * d * 4,
                             typical_positions=TYPICAL_DECODE_POSITIONS)

    @classmethod
    def estimator_cost(cls, config, tokens: int):
        """Frames of ``tokens`` tokens at v1's length regulation and the FLOP of one batch-2
        ConditionalDecoder call on them (:func:`.flops.estimator_gflop`)."""
        from .flops import estimator_gflop
        from .length_regulation import mel_frames_for_tokens

        frames = mel_frames_for_tokens(tokens)
        gflop = estimator_gflop(config, frames)
        return None if gflop is None else (frames, gflop)

    @classmethod
    def pipeline(cls, stages):
        from .pipeline import Pipeline

        return Pipeline(stages)

    @classmethod
    def modes_for(cls, model_dir, stages) -> dict:
        from .modes import modes_for

        return modes_for(model_dir, stages.speakers)

    @classmethod
    def mode_unavailable_reason(cls, model_dir, stages, name: str) -> str | None:
        from .modes import unavailable_reason

        return unavailable_reason(model_dir, stages.speakers, name)

    @classmethod
    def prompt_encoder(cls, model_dir, stages, *, backend: str | None = None, **options):
        """A :class:`.prompt_models.PromptEncoder` over ``model_dir``'s prompt models (None
        without a model dir); ``backend`` None: OpenVINO when installed, else another backend
        that runs ONNX files."""
        if model_dir is None:
            return None
        from .prompt_models import PromptEncoder

        cfg = stages.config
        return PromptEncoder(model_dir, backend, embedding_dim=cfg.flow.spk_embed_dim,
                             speech_vocab=cfg.flow.vocab_size, mel_bins=cfg.flow.output_size,
                             **options)

    @classmethod
    def batchable_stages(cls, stages) -> dict:
        """``{"estimator": (stages.estimate, stages.max_estimator_batch)}`` when the stages
        take more than one request per estimator call, else {}."""
        cap = int(getattr(stages, "max_estimator_batch", 1))
        return {"estimator": (stages.estimate, cap)} if cap >= 2 else {}

    @classmethod
    def new_program(cls, stages, request, draws, frontend, batchers=None):
        from .pipeline import Pipeline
        from .program import CosyVoice1Program

        rv = (batchers or {}).get("estimator")
        pipeline = None if rv is None else Pipeline(stages, estimator_rendezvous=rv)
        return CosyVoice1Program(stages, request, draws, frontend, pipeline=pipeline)


from .modes import MODES, PROMPT_MODEL_FILES  # noqa: E402  (numpy only)

CosyVoice1.modes = MODES
CosyVoice1.prompt_model_files = PROMPT_MODEL_FILES


@hookimpl
def register_families(register):
    register(CosyVoice1)
