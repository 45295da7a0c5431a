"""The non-graph files a converted CosyVoice2/3 dir shares: the family yaml and the tokenizer
files (``read_config`` and the frontend read them there too), the voices of ``spk2info.pt``
(:mod:`.voices`) and the fixed CFM noise table (sheet v2 §5.4, v3 §5.4: drawn with torch at
conversion, so serving needs no torch). Written by each family's ``write_serving_files``
(CosyVoice3 adds its fixed NSF table), read by :mod:`.graph_stages`. Must not import torch.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from cosyvino.errors import ConvertedModelError

from .qwen2_config import QWEN_DIR
from .voices import write_voice_files

#: the CFM noise table of a converted dir, float32 [1, 80, 15000]
NOISE_FILE = "cfm_noise.npy"
#: what the tokenizer and the Qwen2 config need of ``CosyVoice-BlankEN/`` (not the weights)
QWEN_FILES = ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def write_speech_lm_files(model, model_dir: str, out_dir: str, yaml_name: str) -> list[str]:
    """Write ``yaml_name``, the ``CosyVoice-BlankEN/`` files, the voices and the noise table of
    the loaded torch model ``model`` (``speakers``, ``voices``, ``cfm_noise()``) into
    ``out_dir``; returns their names (relative paths). OSError on a write."""
    names = [yaml_name]
    shutil.copyfile(os.path.join(model_dir, yaml_name), os.path.join(out_dir, yaml_name))
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


def read_table(conv_dir: str, name: str, what: str, ndim: int, *, mmap: bool = False
               ) -> np.ndarray:
    """The float32 array ``name`` of a converted dir with ``ndim`` dimensions (``mmap``:
    memory-mapped read-only, for a large table sliced per call). Raises ConvertedModelError
    (missing/corrupt/other dtype or rank)."""
    path = os.path.join(conv_dir, name)
    try:
        table = np.load(path, mmap_mode="r" if mmap else None)
    except (OSError, ValueError) as e:
        raise ConvertedModelError(f"{path}: cannot read the {what} ({e}); convert the model "
                                  "again", path) from None
    if table.ndim != ndim or table.dtype != np.float32:
        raise ConvertedModelError(f"{path}: expected a float32 {what} of {ndim} dimensions, got "
                                  f"{table.dtype} {list(table.shape)}", path)
    return table


def read_noise(conv_dir: str) -> np.ndarray:
    """The CFM noise table of a converted dir, float32 [1, 80, frames]. Raises
    ConvertedModelError (missing/corrupt)."""
    return read_table(conv_dir, NOISE_FILE, "CFM noise table [1, 80, frames]", 3)


__all__ = ["NOISE_FILE", "QWEN_FILES", "read_noise", "read_table", "write_speech_lm_files"]
