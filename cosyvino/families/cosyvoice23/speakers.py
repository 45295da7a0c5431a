"""CosyVoice2/3 ``spk2info.pt``: SFT speakers and registered zero-shot voices (sheet v2 §3.7;
CosyVoice3 uses the same layout, sheet v3 §1).

Two entry layouts, possibly mixed in one file:

- SFT (the v1 layout): ``{"embedding": float [1, 192]}``. ``inference_sft`` feeds it to the flow
  (the v2 LLM takes no speaker embedding).
- Zero-shot bundle, as upstream ``add_zero_shot_spk`` + ``save_spkinfo`` write it:
  ``prompt_text`` int [1, L] (Qwen2 text ids), ``llm_prompt_speech_token`` int [1, N],
  ``flow_prompt_speech_token`` int [1, N'], ``prompt_speech_feat`` float [1, 2N', 80] (24 kHz
  mel, time-major), ``llm_embedding`` / ``flow_embedding`` float [1, 192], each with a
  ``<name>_len`` int [1] (the embeddings have none). Used by zero-shot / cross-lingual /
  instruct2 with ``zero_shot_spk_id``; such entries have no ``embedding``, so upstream SFT with
  them fails (KeyError) — :attr:`Speaker.embedding` is None for them.

Names alone (without torch) come from
:func:`cosyvino.families.cosyvoice1.checkpoint.read_speaker_names`, which reads either layout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosyvino.errors import CheckpointError
from cosyvino.families.cosyvoice1.checkpoint import load_torch_file

#: the keys of a zero-shot bundle (sheet v2 §3.7), each but the embeddings with a ``*_len``
BUNDLE_TOKEN_KEYS = ("prompt_text", "llm_prompt_speech_token", "flow_prompt_speech_token")
BUNDLE_KEYS = (*BUNDLE_TOKEN_KEYS, "prompt_speech_feat", "llm_embedding", "flow_embedding")


@dataclass(frozen=True, eq=False)
class ZeroShotBundle:
    """A registered voice's prompt data (arrays without the batch axis of the file).

    Attributes:
        prompt_text_token: int64 [L] Qwen2 ids of the prompt transcript (LLM text prefix).
        llm_prompt_speech_token: int64 [N] speech tokens after the TASK slot (sheet v2 §4.4).
        flow_prompt_speech_token: int64 [N'] flow prompt tokens.
        prompt_speech_feat: float32 [M, mel_bins] flow prompt mel (M = 2 N' when aligned).
        llm_embedding, flow_embedding: float32 [1, S] CAM++ x-vectors (the LLM one unused by v2 and v3).
    """

    prompt_text_token: np.ndarray
    llm_prompt_speech_token: np.ndarray
    flow_prompt_speech_token: np.ndarray
    prompt_speech_feat: np.ndarray
    llm_embedding: np.ndarray
    flow_embedding: np.ndarray


@dataclass(frozen=True, eq=False)
class Speaker:
    """One ``spk2info.pt`` entry: ``embedding`` float32 [1, S] (SFT layout; None if absent) and/or
    ``bundle`` (zero-shot layout; None if absent). At least one is set."""

    name: str
    embedding: np.ndarray | None = None
    bundle: ZeroShotBundle | None = None

    @property
    def flow_embedding(self) -> np.ndarray:
        """The flow's speaker embedding: the SFT ``embedding``, else the bundle's
        ``flow_embedding`` (upstream uses ``embedding`` for both LLM and flow in SFT)."""
        return self.embedding if self.embedding is not None else self.bundle.flow_embedding


def _array(value: Any, where: str, path: str) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.float()
        value = value.numpy()
    if not isinstance(value, np.ndarray):
        raise CheckpointError(f"{path}: {where} must be a tensor, got {type(value).__name__}",
                              path)
    return value


def _embedding(value: Any, where: str, path: str, embed_dim: int) -> np.ndarray:
    arr = _array(value, where, path)
    if not np.issubdtype(arr.dtype, np.floating) or arr.size != embed_dim \
            or not np.all(np.isfinite(arr)):
        raise CheckpointError(f"{path}: {where} must be finite float [1, {embed_dim}], got "
                              f"{arr.dtype} {list(arr.shape)}", path)
    return arr.astype(np.float32).reshape(1, embed_dim)


def _check_len(info: Mapping, key: str, actual: int, where: str, path: str) -> None:
    if f"{key}_len" not in info:
        return  # older or third-party writers omit the lengths; the arrays are authoritative
    length = _array(info[f"{key}_len"], f"{where}.{key}_len", path).reshape(-1)
    if length.size != 1 or int(length[0]) != actual:
        raise CheckpointError(f"{path}: {where}.{key}_len is {length.tolist()} but {key} holds "
                              f"{actual}", path)


def _tokens(info: Mapping, key: str, where: str, path: str, upper: int | None) -> np.ndarray:
    arr = _array(info[key], f"{where}.{key}", path)
    if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 2 or arr.shape[0] != 1:
        raise CheckpointError(f"{path}: {where}.{key} must be int [1, N], got {arr.dtype} "
                              f"{list(arr.shape)}", path)
    flat = arr[0].astype(np.int64)
    if flat.size and (flat.min() < 0 or (upper is not None and flat.max() >= upper)):
        raise CheckpointError(f"{path}: {where}.{key} holds ids outside 0..{(upper or 0) - 1}: "
                              f"{flat.min()}..{flat.max()}", path)
    _check_len(info, key, flat.size, where, path)
    return flat


def _bundle(info: Mapping, where: str, path: str, embed_dim: int, mel_bins: int,
            speech_token_size: int) -> ZeroShotBundle:
    missing = [k for k in BUNDLE_KEYS if k not in info]
    if missing:
        raise CheckpointError(f"{path}: {where} is a zero-shot bundle without "
                              f"{', '.join(missing)}", path)
    feat = _array(info["prompt_speech_feat"], f"{where}.prompt_speech_feat", path)
    if not np.issubdtype(feat.dtype, np.floating) or feat.ndim != 3 or feat.shape[0] != 1 \
            or feat.shape[2] != mel_bins or not np.all(np.isfinite(feat)):
        raise CheckpointError(f"{path}: {where}.prompt_speech_feat must be finite float "
                              f"[1, M, {mel_bins}], got {feat.dtype} {list(feat.shape)}", path)
    _check_len(info, "prompt_speech_feat", feat.shape[1], where, path)
    return ZeroShotBundle(
        prompt_text_token=_tokens(info, "prompt_text", where, path, None),
        llm_prompt_speech_token=_tokens(info, "llm_prompt_speech_token", where, path,
                                        speech_token_size),
        flow_prompt_speech_token=_tokens(info, "flow_prompt_speech_token", where, path,
                                         speech_token_size),
        prompt_speech_feat=feat[0].astype(np.float32),
        llm_embedding=_embedding(info["llm_embedding"], f"{where}.llm_embedding", path,
                                 embed_dim),
        flow_embedding=_embedding(info["flow_embedding"], f"{where}.flow_embedding", path,
                                  embed_dim),
    )


def load_spk2info(path: str | os.PathLike, *, embed_dim: int = 192, mel_bins: int = 80,
                  speech_token_size: int = 6561) -> dict[str, Speaker]:
    """Read a CosyVoice2/3 ``spk2info.pt`` (both layouts, sheet v2 §3.7), in file order.

    Args:
        embed_dim: speaker embedding width (192, CAM++); mel_bins: prompt mel bins (80);
        speech_token_size: prompt speech token ids must be below it (6561).

    Raises:
        ModelDirError: missing/unreadable file.
        CheckpointError: not a dict of dicts, no speakers, an entry with neither ``embedding``
            nor the bundle keys, an incomplete bundle, wrong dtypes/shapes, ``*_len`` values
            that disagree with their arrays, out-of-range speech tokens (names file, speaker
            and key).
    """
    path = os.fspath(path)
    data = load_torch_file(path, mmap=False)
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{path}: expected a dict speaker -> info dict, got "
                              f"{type(data).__name__}", path)
    speakers: dict[str, Speaker] = {}
    for name, info in data.items():
        where = f"speaker {name!r}"
        if not isinstance(info, Mapping):
            raise CheckpointError(f"{path}: {where} must be a dict, got {type(info).__name__}",
                                  path)
        has_bundle = any(k in info for k in BUNDLE_KEYS)
        if "embedding" not in info and not has_bundle:
            raise CheckpointError(f"{path}: {where} has neither 'embedding' (SFT) nor the "
                                  f"zero-shot keys ({', '.join(BUNDLE_KEYS)})", path)
        embedding = (_embedding(info["embedding"], f"{where}.embedding", path, embed_dim)
                     if "embedding" in info else None)
        bundle = (_bundle(info, where, path, embed_dim, mel_bins, speech_token_size)
                  if has_bundle else None)
        speakers[str(name)] = Speaker(str(name), embedding, bundle)
    if not speakers:
        raise CheckpointError(f"{path} holds no speakers", path)
    return speakers
