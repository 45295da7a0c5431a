"""The bundled tiny model and its golden tensors, readable without torch.

``fixtures/tiny-a`` is a CosyVoice-300M-shaped model shrunk to a few MB (official layout:
``cosyvoice.yaml``, ``llm.pt``, ``flow.pt``, ``hift.pt``, ``spk2info.pt``) whose golden tensors
were produced by the official CosyVoice code (``golden.pt``; see shared/reference in the repo).
``goldens.npz`` holds the subset of ``golden.pt`` the conformance suite compares against, as
plain numpy arrays, so a backend that never needs torch can run the suite torch-free.
:func:`export_goldens` rewrites it from ``golden.pt`` (needs torch). Must not import torch at
module level.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np

#: the bundled golden tiny model dir (official checkpoint layout)
TINY_MODEL_DIR = pathlib.Path(__file__).parent / "fixtures" / "tiny-a"
#: numpy copy of the golden tensors the conformance suite uses
GOLDENS_NPZ = TINY_MODEL_DIR / "goldens.npz"

#: key in goldens.npz -> path in golden.pt ("/"-separated); shapes are those of tiny-a
#: (D = 64, V + 1 = 4097, text L = 17, speech tokens 24 (LLM) / 60 (flow), mel T = 103)
GOLDEN_KEYS = {
    "llm/text_token": "llm/text_token",                 # int64 [1, 17]
    "llm/embedding": "llm/embedding",                   # float32 [1, 192]
    "llm/text_encoder_out": "llm/text_encoder_out",     # float32 [1, 17, D]
    "llm/lm_input": "llm/lm_input",                     # float32 [1, 20, D] SOS SPK TEXT TASK
    "llm/forced_speech_tokens": "llm/forced_speech_tokens",  # int64 [24]
    "llm/logp": "llm/logp",                             # float32 [25, V+1] teacher-forced rows
    "flow/speech_token": "flow/speech_token",           # int64 [1, 60]
    "flow/embedding": "flow/embedding",                 # float32 [1, 192]
    "flow/spk_proj": "flow/spk_proj",                   # float32 [1, 80]
    "flow/encoder_proj_out": "flow/encoder_proj_out",   # float32 [1, 60, 80]
    "flow/length_regulated": "flow/length_regulated",   # float32 [1, 103, 80]
    "flow/noise": "flow/noise",                         # float32 [1, 80, 103]
    "flow/mel": "flow/mel",                             # float32 [1, 80, 103]
    "estimator/x": "flow/estimator_in/x",               # float32 [2, 80, 57]
    "estimator/mask": "flow/estimator_in/mask",         # float32 [2, 1, 57]
    "estimator/mu": "flow/estimator_in/mu",             # float32 [2, 80, 57]
    "estimator/t": "flow/estimator_in/t",               # float32 [2]
    "estimator/spks": "flow/estimator_in/spks",         # float32 [2, 80]
    "estimator/cond": "flow/estimator_in/cond",         # float32 [2, 80, 57]
    "estimator/out": "flow/estimator_out",              # float32 [2, 80, 57]
    "hift/mel": "hift/mel",                             # float32 [1, 80, 103]
    "hift/f0": "hift/f0",                               # float32 [1, 103] Hz
    "hift/source": "hift/source",                       # float32 [1, 1, 256 * 103]
    "hift/wav": "hift/wav",                             # float32 [1, 256 * 103]
}


def load_goldens(path: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
    """The golden arrays by :data:`GOLDEN_KEYS` name (default: the bundled ``goldens.npz``).
    Token arrays are int64, everything else float32.

    Raises:
        FileNotFoundError: no such file (an installed cosyvino without its package data).
        KeyError: the file lacks a key of :data:`GOLDEN_KEYS`.
    """
    with np.load(path or GOLDENS_NPZ, allow_pickle=False) as f:
        out = {k: f[k] for k in GOLDEN_KEYS}
    return out


def export_goldens(golden_pt: str | os.PathLike, out_npz: str | os.PathLike) -> None:
    """Write the :data:`GOLDEN_KEYS` subset of an official ``golden.pt`` to ``out_npz``
    (atomically). Needs torch. Integer tensors become int64 (``text_token`` is int32 in the
    official file; the stage interface takes int64), float tensors float32.

    Raises:
        KeyError: ``golden_pt`` lacks one of the entries.
    """
    import torch

    from ..fileutil import publish

    golden = torch.load(os.fspath(golden_pt), map_location="cpu", weights_only=False)
    arrays = {}
    for key, src in GOLDEN_KEYS.items():
        obj = golden
        for part in src.split("/"):
            obj = obj[part]
        a = obj.detach().cpu().numpy()
        arrays[key] = a.astype(np.int64 if a.dtype.kind in "iu" else np.float32)
    out_npz = os.fspath(out_npz)
    fd, tmp = tempfile.mkstemp(suffix=".npz", dir=os.path.dirname(os.path.abspath(out_npz)))
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        publish(tmp, out_npz)
    except BaseException:
        os.unlink(tmp)
        raise
