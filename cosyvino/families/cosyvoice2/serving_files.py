"""The non-graph files of a converted CosyVoice2 dir: the configs and tokenizer files
(``read_config`` and the frontend read them there too), the voices of ``spk2info.pt``
(:mod:`.voices`) and the fixed CFM noise table (sheet v2 §5.4: drawn with torch at conversion,
so serving needs no torch). Written by :meth:`CosyVoice2.write_serving_files`, read by
:mod:`.graph_stages`. Must not import torch.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from cosyvino.errors import ConvertedModelError

from ..cosyvoice23.qwen2_config import QWEN_DIR
from .config import YAML_NAME
from .voices import write_voice_files

#: the CFM noise table of a converted dir, float32 [1, 80, 15000]
NOISE_FILE = "cfm_noise.npy"
#: what the tokenizer and the Qwen2 config need of ``CosyVoice-BlankEN/`` (not the weights)
QWEN_FILES = ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def write_serving_files(model, model_dir: str, out_dir: str) -> list[str]:
    """Write the yaml, ``CosyVoice-BlankEN/`` files, voices and noise table of the loaded
    :class:`~.torch.model.CosyVoice2TorchModel` ``model`` into ``out_dir``; returns their
    names (relative paths). OSError on a write."""
    names = [YAML_NAME]
    shutil.copyfile(os.path.join(model_dir, YAML_NAME), os.path.join(out_dir, YAML_NAME))
    os.makedirs(os.path.join(out_dir, QWEN_DIR), exist_ok=True)
    for name in QWEN_FILES:
        rel = f"{QWEN_DIR}/{name}"
        src = os.path.join(model_dir, QWEN_DIR, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, QWEN_DIR, name))
            names.append(rel)
    names += write_voice_files(out_dir, model.speakers, model.voices)
    np.save(os.path.join(out_dir, NOISE_FILE), np.asarray(model.cfm_noise(), np.float32))
    names.append(NOISE_FILE)
    return names


def read_noise(conv_dir: str) -> np.ndarray:
    """The noise table of a converted dir. Raises ConvertedModelError (missing/corrupt)."""
    path = os.path.join(conv_dir, NOISE_FILE)
    try:
        table = np.load(path)
    except (OSError, ValueError) as e:
        raise ConvertedModelError(f"{path}: cannot read the CFM noise table ({e}); convert "
                                  "the model again", path) from None
    if table.ndim != 3 or table.dtype != np.float32:
        raise ConvertedModelError(f"{path}: expected float32 [1, 80, frames], got "
                                  f"{table.dtype} {list(table.shape)}", path)
    return table
