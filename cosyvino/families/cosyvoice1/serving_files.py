"""The non-graph files of a converted CosyVoice v1 dir (the runtime applies them in numpy) and
the LLM facts its manifest records: written by ``cosyvino convert`` through
:meth:`cosyvino.families.cosyvoice1.CosyVoice1.write_serving_files`, read by
:mod:`cosyvino.families.cosyvoice1.serving_tables`. Works on a loaded
:class:`cosyvino.families.cosyvoice1.torch.loading.TorchModel` (tensors to numpy; no torch
import of its own).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: this module must not import torch
    from .torch.loading import TorchModel

#: the files :func:`write_serving_files` writes, in manifest order
SERVING_FILES = ("llm_tables.npz", "cosyvoice.yaml", "speakers.json", "speakers.npy")


def llm_cache_layout(m: TorchModel) -> tuple[int, int, int, int]:
    """``(layers, heads, head_dim, width)`` of the LLM's KV cache."""
    enc = m.llm.llm
    return len(enc.encoders), enc.num_heads, enc.head_dim, enc.cfg.output_size


def llm_tables(m: TorchModel) -> dict[str, np.ndarray]:
    """The LLM's small tables the runtime applies in numpy, float32: ``speech_embedding``
    ``[V, D]``, ``special`` ``[2, D]`` (sos, task_id), ``spk_affine_weight`` ``[D, 192]``,
    ``spk_affine_bias`` ``[D]``, ``pos_weight`` ``[L, d, d]`` (every layer's
    ``self_attn.linear_pos.weight``, for the ``llm`` graph's ``pos_keys`` inputs,
    :class:`cosyvino.families.cosyvoice1.positional.PositionalKeys`; see
    :mod:`cosyvino.converted`)."""
    lm = m.llm
    pos = np.stack([layer.self_attn.linear_pos.weight.detach().numpy()
                    for layer in lm.llm.encoders]).astype(np.float32)
    return {
        "pos_weight": pos,
        "speech_embedding": lm.speech_embedding.weight.detach().numpy().astype(np.float32),
        "special": lm.llm_embedding.weight.detach().numpy().astype(np.float32),
        "spk_affine_weight": lm.spk_embed_affine_layer.weight.detach().numpy().astype(np.float32),
        "spk_affine_bias": lm.spk_embed_affine_layer.bias.detach().numpy().astype(np.float32),
    }


def write_serving_files(m: TorchModel, model_dir: str, out_dir: str) -> list[str]:
    """Write :data:`SERVING_FILES` into ``out_dir``: the LLM tables, the speakers (names in
    ``speakers.json``, float32 x-vectors ``[S, 192]`` in that row order in ``speakers.npy``)
    and a copy of ``model_dir/cosyvoice.yaml``; returns their names. OSError on a write."""
    np.savez(os.path.join(out_dir, "llm_tables.npz"), **llm_tables(m))
    shutil.copyfile(os.path.join(model_dir, "cosyvoice.yaml"),
                    os.path.join(out_dir, "cosyvoice.yaml"))
    names = list(m.speakers)
    with open(os.path.join(out_dir, "speakers.json"), "w", encoding="utf-8") as f:
        json.dump(names, f, ensure_ascii=False)
    np.save(os.path.join(out_dir, "speakers.npy"),
            np.concatenate([m.speakers[n] for n in names]).astype(np.float32))
    return list(SERVING_FILES)
