"""The numpy half of a converted CosyVoice v1 model's LLM: speaker x-vectors and the small LLM
tables that the runtime backends apply without a graph. Must import neither torch nor any runtime.

Files (written by :func:`cosyvino.families.cosyvoice1.serving_files.write_serving_files`, layout in
:mod:`cosyvino.converted`): ``speakers.json`` (names) + ``speakers.npy`` (float32 [S, 192]),
``llm_tables.npz`` (``speech_embedding`` [V, D], ``special`` [2, D] = sos, task_id,
``spk_affine_weight`` [D, 192], ``spk_affine_bias`` [D], ``pos_weight`` [L, d, d]: the LLM's
positional projections, from which :class:`cosyvino.families.cosyvoice1.positional.
PositionalKeys` makes the ``llm`` graph's ``pos_keys`` inputs).
"""

from __future__ import annotations

import json
import os

import numpy as np

from cosyvino.converted import convert_hint
from cosyvino.errors import ConvertedModelError


def read_speakers(conv_dir: str, runtime: str) -> dict[str, np.ndarray]:
    """Speaker name -> float32 x-vector ``[1, 192]``, in file order. Raises
    :class:`ConvertedModelError` (naming ``speakers.json`` and the ``cosyvino convert`` command
    for ``runtime``) when the files are missing or unreadable."""
    path = os.path.join(conv_dir, "speakers.json")
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f)
        emb = np.load(os.path.join(conv_dir, "speakers.npy"))
    except (OSError, ValueError) as e:
        raise ConvertedModelError(f"{path}: cannot read speakers ({e}); re-run "
                                  f"`{convert_hint(runtime)}`", path) from None
    return {n: emb[i:i + 1].astype(np.float32) for i, n in enumerate(names)}


class ServingTablesMixin:
    """The three table-driven :class:`cosyvino.backends.Stages` methods (``embed_llm_speaker``,
    ``embed_speech_tokens``, ``llm_special_embeddings``) in numpy, for backends whose graphs
    start after the embeddings. List it before ``Stages`` in the bases and call
    :meth:`_load_serving_tables` in ``__init__``; it also sets ``self.speakers``."""

    def _load_serving_tables(self, conv_dir: str, runtime: str, pos_bucket: int = 1) -> None:
        """Also sets ``self.positional_keys`` (windows of multiples of ``pos_bucket`` rows,
        the manifest's ``llm.pos_bucket``; heads from ``self.config``, set before). Raises
        ConvertedModelError for a dir written before the positional tables were (re-run the
        convert command)."""
        from .positional import PositionalKeys

        self.speakers = read_speakers(conv_dir, runtime)
        tables = np.load(os.path.join(conv_dir, "llm_tables.npz"))
        if "pos_weight" not in tables.files:
            raise ConvertedModelError(
                f"{conv_dir}: converted before the LLM took its positional tables as inputs "
                f"(no pos_weight in llm_tables.npz); re-run `{convert_hint(runtime)}` "
                "(and `cosyvino quantize` for a quantized dir)", conv_dir)
        self.positional_keys = PositionalKeys(tables["pos_weight"],
                                              self.config.llm.llm.attention_heads, pos_bucket)
        self._speech_embedding = np.ascontiguousarray(tables["speech_embedding"])
        special = tables["special"]
        self._sos = special[0].reshape(1, 1, -1).copy()
        self._task = special[1].reshape(1, 1, -1).copy()
        self._spk_w = np.ascontiguousarray(tables["spk_affine_weight"].T)  # [192, D]
        self._spk_b = tables["spk_affine_bias"].copy()

    def embed_llm_speaker(self, embedding):
        """float32 ``[B, 192]`` x-vectors -> ``[B, 1, D]``: L2-normalised (as the official
        ``F.normalize``, eps 1e-12), then the LLM's speaker affine layer."""
        e = np.asarray(embedding, np.float32)
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return (e @ self._spk_w + self._spk_b).astype(np.float32)[:, None, :]

    def embed_speech_tokens(self, tokens):
        """int ``[B, T]`` speech tokens -> float32 ``[B, T, D]`` (a lookup in
        ``speech_embedding``)."""
        return self._speech_embedding[np.asarray(tokens, np.int64)]

    def llm_special_embeddings(self):
        """``(sos, task_id)``, each float32 ``[1, 1, D]``."""
        return self._sos, self._task
