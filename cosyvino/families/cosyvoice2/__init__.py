"""The CosyVoice2 family (CosyVoice2-0.5B): config, torch model, modes, streaming policy and graph
table. What it shares with CosyVoice3 (the Qwen2 speech LM on ``inputs_embeds``, the causal flow
pieces, the Qwen tokenizer) lives once in :mod:`cosyvino.families.cosyvoice23`.
Facts: the CosyVoice2 architecture sheet (section numbers cited in each module)."""

from __future__ import annotations

from cosyvino.hookspecs import hookimpl

from ..base import GraphTable
from ..cosyvoice23.family import TYPICAL_DECODE_POSITIONS, SpeechLMFamily
from .modes import PROMPT_MODEL_FILES

#: official checkpoint files a conversion is made from (recorded by hash in manifests)
SOURCE_FILES = ("cosyvoice2.yaml", "CosyVoice-BlankEN/config.json", "llm.pt", "flow.pt",
                "hift.pt", "spk2info.pt")


class CosyVoice2(SpeechLMFamily):
    """CosyVoice2-0.5B: Qwen2 speech LM -> causal flow matching (fixed noise) -> 24 kHz HiFT.
    Detection, speakers, decode profile, modes, the prompt-encoder choice and the OpenVINO
    layout of the LLM step: :class:`~cosyvino.families.cosyvoice23.family.SpeechLMFamily`;
    here the v2 prompt encoder and the synthetic presets."""

    name = "cosyvoice2"
    text_in = True  # bistream text input (sheet v2 §4.6, families/cosyvoice23/text_in_program.py)
    description = "CosyVoice2 (CosyVoice2-0.5B)"
    config_files = ("cosyvoice2.yaml",)
    title = "CosyVoice2"
    source_file_names = SOURCE_FILES
    # github.com/FunAudioLLM/CosyVoice README (2026-03, commit ace7c47), "Model download":
    # snapshot_download('iic/CosyVoice2-0.5B') on ModelScope, 'FunAudioLLM/CosyVoice2-0.5B' on HF
    download_ids = {"CosyVoice2-0.5B": {"huggingface": "FunAudioLLM/CosyVoice2-0.5B",
                                        "modelscope": "iic/CosyVoice2-0.5B"}}
    prompt_model_files = PROMPT_MODEL_FILES
    head_bias = True
    quantizable = True  # cosyvino quantize: graph-runner stages, recorded at the runner

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
    def read_config(cls, model_dir: str):
        from .model_config import read_model_config

        return read_model_config(model_dir)

    @classmethod
    def graphs(cls, config) -> GraphTable:
        from .graphs import graph_table

        return graph_table(config)

    @classmethod
    def load_torch_model(cls, model_dir: str):
        from .torch.model import load_torch_model

        return load_torch_model(model_dir)

    @classmethod
    def estimator_cost(cls, config, tokens: int):
        """``token_mel_ratio`` (2) frames per token, and the FLOP of one batch-2 causal U-Net
        call on them with full attention (:mod:`.flops`)."""
        from .flops import estimator_gflop

        frames = int(tokens) * config.flow.token_mel_ratio
        gflop = estimator_gflop(config.flow, frames)
        return None if gflop is None else (frames, gflop)

    @classmethod
    def write_serving_files(cls, model, model_dir: str, out_dir: str) -> list[str]:
        from .serving_files import write_serving_files

        return write_serving_files(model, model_dir, out_dir)

    @classmethod
    def stages_from_runner(cls, runner, model_dir: str):
        from .graph_stages import CosyVoice2GraphStages

        return CosyVoice2GraphStages(runner, model_dir)

    @classmethod
    def make_frontend(cls, config):
        from .frontend import CosyVoice2Frontend

        return CosyVoice2Frontend.from_model_dir(config.model_dir)

    @classmethod
    def prompt_models_reason(cls, model_dir) -> str:
        """:func:`.modes.prompt_models_reason` (the missing prompt-model files)."""
        from .modes import prompt_models_reason

        return prompt_models_reason(model_dir)

    @classmethod
    def recording_encoder(cls, model_dir: str, backend: str | None, *, embedding_dim: int,
                          mel_bins: int, speech_vocab: int, **options):
        """The v2 :class:`~.prompt_models.PromptEncoder` (``campplus.onnx`` +
        ``speech_tokenizer_v2.onnx`` on ``backend``, None: OpenVINO when installed, else
        another backend that runs ONNX files; the dir's own 24 kHz prompt mel,
        :func:`~.prompt_models.read_prompt_mel_config`).

        Raises: ConfigError / ModelDirError from reading the yaml's ``feat_extractor``."""
        from .prompt_models import PromptEncoder, read_prompt_mel_config

        return PromptEncoder(model_dir, backend, mel=read_prompt_mel_config(model_dir),
                             embedding_dim=embedding_dim, mel_bins=mel_bins,
                             speech_vocab=speech_vocab, **options)

    @classmethod
    def new_program(cls, stages, request, draws, frontend, batchers=None):
        from .program import CosyVoice2Program, CosyVoice2TextInProgram

        if getattr(request, "text_stream", False):
            return CosyVoice2TextInProgram(stages, request, draws, frontend)
        return CosyVoice2Program(stages, request, draws, frontend)


@hookimpl
def register_families(register):
    register(CosyVoice2)


__all__ = ["SOURCE_FILES", "TYPICAL_DECODE_POSITIONS", "CosyVoice2"]
