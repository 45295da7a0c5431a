"""The non-graph files of a converted CosyVoice2 dir: ``cosyvoice2.yaml``, the tokenizer files,
the voices of ``spk2info.pt`` and the fixed CFM noise table, written and read by the code shared
with CosyVoice3 (:mod:`cosyvino.families.cosyvoice23.serving_files`). Must not import torch.
"""

from __future__ import annotations

from ..cosyvoice23.serving_files import (
    NOISE_FILE,
    QWEN_FILES,
    read_noise,
    write_speech_lm_files,
)
from .config import YAML_NAME


def write_serving_files(model, model_dir: str, out_dir: str) -> list[str]:
    """Write the yaml, ``CosyVoice-BlankEN/`` files, voices and noise table of the loaded
    :class:`~.torch.model.CosyVoice2TorchModel` ``model`` into ``out_dir``; returns their
    names (relative paths). OSError on a write."""
    return write_speech_lm_files(model, model_dir, out_dir, YAML_NAME)


__all__ = ["NOISE_FILE", "QWEN_FILES", "read_noise", "write_serving_files"]
