"""The non-graph files of a converted CosyVoice3 dir: ``cosyvoice3.yaml``, the tokenizer files,
the voices and the fixed CFM noise (shared with CosyVoice2:
:mod:`cosyvino.families.cosyvoice23.serving_files`), plus the fixed NSF table ``sine_waves``
(sheet v3 §6.2), replayed with torch at conversion
(:func:`~cosyvino.families.cosyvoice3.fixed_tables.make_fixed_tables`) so serving needs no
torch. The table is float32 [1, 7 200 000, 9] (~259 MB); serving memory-maps it and reads the
rows a vocoder call uses. Must not import torch.
"""

from __future__ import annotations

import os

import numpy as np

from ..cosyvoice23.serving_files import read_table, write_speech_lm_files
from .config import YAML_NAME

#: the fixed NSF table of a converted dir
SINE_WAVES_FILE = "nsf_sine_waves.npy"


def write_serving_files(model, model_dir: str, out_dir: str) -> list[str]:
    """Write the shared files and the NSF table of the loaded
    :class:`~.torch.model.CosyVoice3TorchModel` ``model`` into ``out_dir``; returns their
    names. OSError on a write; ConfigError (a yaml the table replay does not reproduce)."""
    names = write_speech_lm_files(model, model_dir, out_dir, YAML_NAME)
    np.save(os.path.join(out_dir, SINE_WAVES_FILE), np.asarray(model.sine_waves(), np.float32))
    return [*names, SINE_WAVES_FILE]


def read_sine_waves(conv_dir: str) -> np.ndarray:
    """The NSF table of a converted dir, float32 [1, samples, 9], memory-mapped read-only.
    Raises ConvertedModelError (missing/corrupt)."""
    return read_table(conv_dir, SINE_WAVES_FILE, "NSF sine-wave table [1, samples, 9]", 3,
                      mmap=True)


__all__ = ["SINE_WAVES_FILE", "read_sine_waves", "write_serving_files"]
