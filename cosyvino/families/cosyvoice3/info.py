"""``cosyvino info`` for an official CosyVoice3 dir: config highlights, files, parameter counts
and speakers, without building modules (sheet v3 §1, §4.1); the summary is shared with
CosyVoice2 (:func:`cosyvino.families.cosyvoice23.info.speech_lm_dir_info`); ``servable`` says how
the registered CosyVoice3 family serves the dir.
"""

from __future__ import annotations

import os

from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice23.info import speech_lm_dir_info

from .config import YAML_NAME, read_cosyvoice3_config

#: the files of an official CosyVoice3 dir that the official code reads (sheet v3 §1)
FILES = (YAML_NAME, "llm.pt", "flow.pt", "hift.pt", "spk2info.pt", "campplus.onnx",
         "speech_tokenizer_v3.onnx", "CosyVoice-BlankEN/config.json",
         "CosyVoice-BlankEN/vocab.json", "CosyVoice-BlankEN/merges.txt")


def model_info(model_dir: str) -> dict:
    """The summary dict of an official CosyVoice3 dir
    (:func:`~cosyvino.families.cosyvoice23.info.speech_lm_dir_info`; ``speech_head_rows`` is
    6761 for v3).

    Raises ModelDirError / ConfigError / CheckpointError (a checkpoint that cannot be read)."""
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_cosyvoice3_config(model_dir)
    return speech_lm_dir_info(
        model_dir, family="cosyvoice3", sample_rate=cfg.sample_rate, llm=cfg.llm, files=FILES,
        servable="yes: torch on this dir; onnxruntime after `cosyvino convert --format onnx`")
