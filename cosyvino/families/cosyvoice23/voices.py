"""CosyVoice2/3 voices of ``spk2info.pt`` (sheet v2 §3.7; v3 keeps the same layout, sheet v3 §1)
as cosyvino voices: SFT speakers and official zero-shot bundles (read by :mod:`.speakers`), and
the numpy files a converted dir keeps them in. Shared by both families. Must not import torch.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosyvino.errors import ConvertedModelError
from cosyvino.voices import Voice

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


def split_speakers(speakers: Mapping[str, Any], decode: Callable[[list[int]], str] | None = None
                   ) -> tuple[dict[str, np.ndarray], dict[str, PromptVoice]]:
    """The SFT speakers (name -> float32 [1, 192]) and the zero-shot bundles (name ->
    :class:`PromptVoice`) of what :func:`~.speakers.load_spk2info` read (name ->
    :class:`~.speakers.Speaker`). ``decode``: Qwen ids -> text for the bundles'
    ``prompt_text`` (None: the ids written out). An entry with both layouts is an SFT speaker
    (its ``embedding``) and a prompt voice (its bundle's ``flow_embedding``); the prompt voice
    is what requests naming it get."""
    sft: dict[str, np.ndarray] = {}
    bundles: dict[str, PromptVoice] = {}
    for name, spk in speakers.items():
        if spk.embedding is not None:
            sft[name] = np.asarray(spk.embedding, np.float32)
        b = spk.bundle
        if b is None:
            continue
        ids = np.asarray(b.prompt_text_token, np.int64)
        text = decode([int(i) for i in ids]) if decode is not None else " ".join(map(str, ids))
        bundles[name] = PromptVoice(
            name=name, embedding=b.flow_embedding, prompt_speech_tokens=b.flow_prompt_speech_token,
            prompt_mel=b.prompt_speech_feat, prompt_text=text, builtin=True,
            prompt_text_tokens=ids, llm_prompt_speech_tokens=b.llm_prompt_speech_token)
    return sft, bundles


def spk2info_voices(model_dir: str, config, load_tokenizer: Callable[[str], Any]
                    ) -> tuple[dict[str, np.ndarray], dict[str, PromptVoice]]:
    """SFT speakers and zero-shot bundles of ``model_dir/spk2info.pt`` (empty without one:
    optional upstream), checked against ``config`` (a
    :class:`~.model_config.SpeechLMModelConfig`); bundle transcripts decoded with
    ``load_tokenizer(model_dir)`` (the family's Qwen tokenizer). Imports torch (the reader).
    Raises CheckpointError / ModelDirError (unreadable file or tokenizer)."""
    path = os.path.join(model_dir, "spk2info.pt")
    if not os.path.isfile(path):
        return {}, {}
    from .speakers import load_spk2info

    cfg = config.flow
    entries = load_spk2info(path, embed_dim=cfg.spk_embed_dim, mel_bins=cfg.output_size,
                            speech_token_size=config.llm.speech_token_size)
    return split_speakers(entries, decode=load_tokenizer(model_dir).decode)


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
