"""The CosyVoice3 family (Fun-CosyVoice3-0.5B-2512): config, torch model, modes, streaming policy
and graph table. What it shares with CosyVoice2 (the Qwen2 speech LM on ``inputs_embeds``, the
causal flow pieces, the Qwen tokenizer, the family plumbing: graph stages, serving files, voices,
modes, the program) lives once in :mod:`cosyvino.families.cosyvoice23`.
Facts: the CosyVoice3 architecture sheet (section numbers cited in each module)."""

from __future__ import annotations

from cosyvino.hookspecs import hookimpl

from ..base import GraphTable
from ..cosyvoice23.family import TYPICAL_DECODE_POSITIONS, SpeechLMFamily

#: official checkpoint files a conversion is made from (recorded by hash in manifests)
SOURCE_FILES = ("cosyvoice3.yaml", "CosyVoice-BlankEN/config.json", "llm.pt", "flow.pt",
                "hift.pt", "spk2info.pt")


class CosyVoice3(SpeechLMFamily):
    """Fun-CosyVoice3-0.5B: Qwen2 speech LM -> pre-lookahead + DiT flow matching (fixed noise) ->
    causal 24 kHz HiFT (fixed NSF table). Detection, speakers, decode profile, modes and the
    prompt-encoder stand-in: :class:`~cosyvino.families.cosyvoice23.family.SpeechLMFamily`."""

    name = "cosyvoice3"
    text_in = True  # bistream text input (sheet v3 §4, families/cosyvoice23/text_in_program.py)
    description = "CosyVoice3 (Fun-CosyVoice3-0.5B)"
    config_files = ("cosyvoice3.yaml",)
    title = "CosyVoice3"
    source_file_names = SOURCE_FILES
    # github.com/FunAudioLLM/CosyVoice README (2026-03, commit ace7c47), "Model download": the
    # same id on both hubs, snapshot_download('FunAudioLLM/Fun-CosyVoice3-0.5B-2512')
    download_ids = {"Fun-CosyVoice3-0.5B-2512": {
        "huggingface": "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        "modelscope": "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"}}
    prompt_model_files = ("campplus.onnx", "speech_tokenizer_v3.onnx")
    head_bias = False  # llm_decoder Linear(896, 6761, bias=False), sheet v3 §4.1

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
    def write_serving_files(cls, model, model_dir: str, out_dir: str) -> list[str]:
        from .serving_files import write_serving_files

        return write_serving_files(model, model_dir, out_dir)

    @classmethod
    def stages_from_runner(cls, runner, model_dir: str):
        from .graph_stages import CosyVoice3GraphStages

        return CosyVoice3GraphStages(runner, model_dir)

    @classmethod
    def make_frontend(cls, config):
        from .frontend import CosyVoice3Frontend

        return CosyVoice3Frontend.from_model_dir(config.model_dir)

    @classmethod
    def new_program(cls, stages, request, draws, frontend, batchers=None):
        from .program import CosyVoice3Program, CosyVoice3TextInProgram

        if getattr(request, "text_stream", False):
            return CosyVoice3TextInProgram(stages, request, draws, frontend)
        return CosyVoice3Program(stages, request, draws, frontend)


@hookimpl
def register_families(register):
    register(CosyVoice3)


__all__ = ["SOURCE_FILES", "TYPICAL_DECODE_POSITIONS", "CosyVoice3"]
