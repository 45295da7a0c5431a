"""CosyVoice2 voices of ``spk2info.pt`` (sheet v2 §3.7): SFT speakers and official zero-shot
bundles, and the numpy files a converted dir keeps them in. Must not import torch (the official
``.pt`` is read by :func:`read_spk2info`, which imports it only then).

An official ``spk2info.pt`` maps a name to either

* ``{"embedding": [1, 192]}``: an SFT speaker (``inference_sft``; flow speaker embedding), or
* a zero-shot bundle written by upstream ``add_zero_shot_spk``: ``prompt_text`` (Qwen token ids
  [1, L]), ``llm_prompt_speech_token`` / ``flow_prompt_speech_token`` [1, N],
  ``prompt_speech_feat`` [1, 2N, 80], ``llm_embedding`` / ``flow_embedding`` [1, 192] and their
  ``*_len`` entries. Such a voice serves ``zero_shot``, ``cross_lingual`` and ``instruct2`` by
  name (upstream ``zero_shot_spk_id``) without the prompt models.

A bundle's transcript is stored as token ids; :class:`PromptVoice` keeps them
(``prompt_text_tokens``) so the LLM gets exactly the official ids, and carries their decoded
text as ``prompt_text`` (what ``zero_shot`` requires of a voice and what listings show).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from cosyvino.errors import CheckpointError, ConvertedModelError
from cosyvino.voices import Voice

#: spk2info keys of a zero-shot bundle that cosyvino reads (sheet v2 §3.7)
BUNDLE_KEYS = ("prompt_text", "flow_prompt_speech_token", "prompt_speech_feat",
               "flow_embedding")
#: the converted dir's files (:func:`write_voice_files` / :func:`read_voice_files`)
VOICES_JSON, VOICES_NPZ = "voices.json", "voices.npz"


@dataclass(frozen=True, eq=False)
class PromptVoice(Voice):
    """A :class:`Voice` from an official zero-shot bundle, with its transcript as the Qwen
    token ids the bundle stores: ``prompt_text_tokens`` int64 [L] (``prompt_text`` is their
    decoded text). ``llm_prompt_speech_tokens`` int64 [N]: the LLM's prompt speech tokens (the
    flow's are ``prompt_speech_tokens``; upstream stores both, equal after alignment)."""

    prompt_text_tokens: np.ndarray | None = None
    llm_prompt_speech_tokens: np.ndarray | None = None

    def digest(self) -> str:
        """:meth:`Voice.digest` extended by the stored token ids (they reach the LLM)."""
        import hashlib

        h = hashlib.sha256(super().digest().encode())
        for arr in (self.prompt_text_tokens, self.llm_prompt_speech_tokens):
            h.update(b"none;" if arr is None else np.asarray(arr, "<i8").tobytes() + b";")
        return h.hexdigest()


def _array(value: Any, dtype, what: str, path: str) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - any unreadable entry is the same typed error
        raise CheckpointError(f"{path}: {what} is not an array ({e})", path) from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)):
        raise CheckpointError(f"{path}: {what} is not numeric ({arr.dtype})", path)
    return arr.astype(dtype)


def split_spk2info(data: Mapping[str, Any], path: str, *, embed_dim: int, mel_bins: int,
                   decode: Callable[[list[int]], str] | None = None
                   ) -> tuple[dict[str, np.ndarray], dict[str, PromptVoice]]:
    """The SFT speakers (name -> float32 [1, embed_dim]) and the zero-shot bundles (name ->
    :class:`PromptVoice`) of a loaded ``spk2info`` mapping. ``decode``: Qwen ids -> text for
    the bundles' ``prompt_text`` (None: the ids written out).

    An entry with an ``embedding`` is a speaker (even if it also holds a bundle, as upstream's
    ``inference_sft`` reads only that key); an entry with every key of :data:`BUNDLE_KEYS` is a
    bundle; anything else is refused.

    Raises: CheckpointError naming the entry (not a mapping, missing keys, wrong shapes)."""
    speakers: dict[str, np.ndarray] = {}
    bundles: dict[str, PromptVoice] = {}
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{path}: expected a dict name -> info, got "
                              f"{type(data).__name__}", path)
    for name, info in data.items():
        name = str(name)
        if not isinstance(info, Mapping):
            raise CheckpointError(f"{path}: entry {name!r} is not a dict", path)
        if "embedding" in info:
            emb = _array(info["embedding"], np.float32, f"{name!r} embedding", path)
            if emb.size != embed_dim:
                raise CheckpointError(f"{path}: speaker {name!r} embedding has shape "
                                      f"{list(emb.shape)}, expected [1, {embed_dim}]", path)
            speakers[name] = emb.reshape(1, embed_dim)
            continue
        missing = [k for k in BUNDLE_KEYS if k not in info]
        if missing:
            raise CheckpointError(f"{path}: entry {name!r} has neither 'embedding' (an SFT "
                                  f"speaker) nor a zero-shot bundle (missing {missing})", path)
        bundles[name] = _bundle_voice(name, info, path, embed_dim, mel_bins, decode)
    return speakers, bundles


def _bundle_voice(name, info, path, embed_dim, mel_bins, decode) -> PromptVoice:
    text_ids = _array(info["prompt_text"], np.int64, f"{name!r} prompt_text", path).reshape(-1)
    flow_tokens = _array(info["flow_prompt_speech_token"], np.int64,
                         f"{name!r} flow_prompt_speech_token", path).reshape(-1)
    llm_tokens = (_array(info["llm_prompt_speech_token"], np.int64,
                         f"{name!r} llm_prompt_speech_token", path).reshape(-1)
                  if "llm_prompt_speech_token" in info else flow_tokens)
    feat = _array(info["prompt_speech_feat"], np.float32, f"{name!r} prompt_speech_feat", path)
    emb = _array(info["flow_embedding"], np.float32, f"{name!r} flow_embedding", path)
    if feat.size % mel_bins or emb.size != embed_dim or not text_ids.size or \
            not flow_tokens.size:
        raise CheckpointError(f"{path}: bundle {name!r} has prompt_speech_feat "
                              f"{list(feat.shape)} (expected [1, M, {mel_bins}]), "
                              f"flow_embedding {list(emb.shape)} (expected [1, {embed_dim}]), "
                              f"{text_ids.size} text ids, {flow_tokens.size} speech tokens",
                              path)
    text = decode([int(i) for i in text_ids]) if decode is not None else \
        " ".join(map(str, text_ids))
    return PromptVoice(name=name, embedding=emb.reshape(1, embed_dim),
                       prompt_speech_tokens=flow_tokens, prompt_mel=feat.reshape(-1, mel_bins),
                       prompt_text=text, builtin=True, prompt_text_tokens=text_ids,
                       llm_prompt_speech_tokens=llm_tokens)


def read_spk2info(path: str) -> Mapping[str, Any]:
    """The raw mapping of an official ``spk2info.pt`` (imports torch); {} when the file is
    absent (upstream: optional). Raises ModelDirError / CheckpointError (unreadable)."""
    if not os.path.isfile(path):
        return {}
    from cosyvino.families.cosyvoice1.checkpoint import load_torch_file

    return load_torch_file(path, mmap=False)


# ---- converted dirs ---------------------------------------------------------------------------

def write_voice_files(out_dir: str, speakers: Mapping[str, np.ndarray],
                      bundles: Mapping[str, PromptVoice]) -> list[str]:
    """Write :data:`VOICES_JSON` (names, kinds, prompt texts) and :data:`VOICES_NPZ` (arrays,
    keys ``v<i>.<field>``); returns the two names. OSError on a write."""
    index, arrays = [], {}
    for i, (name, emb) in enumerate(speakers.items()):
        index.append({"name": name, "kind": "sft"})
        arrays[f"v{i}.embedding"] = np.asarray(emb, np.float32)
    for j, (name, v) in enumerate(bundles.items(), start=len(index)):
        index.append({"name": name, "kind": "bundle", "prompt_text": v.prompt_text})
        arrays.update({f"v{j}.embedding": v.embedding,
                       f"v{j}.prompt_speech_tokens": v.prompt_speech_tokens,
                       f"v{j}.llm_prompt_speech_tokens": v.llm_prompt_speech_tokens,
                       f"v{j}.prompt_mel": v.prompt_mel,
                       f"v{j}.prompt_text_tokens": v.prompt_text_tokens})
    with open(os.path.join(out_dir, VOICES_JSON), "w", encoding="utf-8") as f:
        json.dump(index, f, ensure_ascii=False, indent=1)
    np.savez(os.path.join(out_dir, VOICES_NPZ), **arrays)
    return [VOICES_JSON, VOICES_NPZ]


def read_voice_files(conv_dir: str) -> tuple[dict[str, np.ndarray], dict[str, PromptVoice]]:
    """What :func:`write_voice_files` wrote. Raises ConvertedModelError (missing/corrupt)."""
    jpath, npath = (os.path.join(conv_dir, n) for n in (VOICES_JSON, VOICES_NPZ))
    try:
        with open(jpath, encoding="utf-8") as f:
            index = json.load(f)
        with np.load(npath) as z:
            arrays = {k: z[k] for k in z.files}
        speakers, bundles = {}, {}
        for i, entry in enumerate(index):
            name = entry["name"]
            if entry["kind"] == "sft":
                speakers[name] = arrays[f"v{i}.embedding"]
                continue
            bundles[name] = PromptVoice(
                name=name, embedding=arrays[f"v{i}.embedding"],
                prompt_speech_tokens=arrays[f"v{i}.prompt_speech_tokens"],
                prompt_mel=arrays[f"v{i}.prompt_mel"], prompt_text=entry["prompt_text"],
                builtin=True, prompt_text_tokens=arrays[f"v{i}.prompt_text_tokens"],
                llm_prompt_speech_tokens=arrays[f"v{i}.llm_prompt_speech_tokens"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertedModelError(f"{conv_dir}: cannot read the voices ({VOICES_JSON}, "
                                  f"{VOICES_NPZ}): {e}; convert the model again", jpath) from None
    return speakers, bundles
