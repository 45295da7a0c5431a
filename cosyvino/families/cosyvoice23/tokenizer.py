"""The Qwen2 text tokenizer of CosyVoice2/3 (``CosyVoice-BlankEN/``), through HF ``tokenizers``.

Sheet v2 §3.3: Qwen2 byte-level BPE (``vocab.json`` + ``merges.txt``), NFC normalization, the
Qwen2 pre-tokenizer regex, byte-level mapping, no BOS / EOS added; the specials of
``tokenizer_config.json`` keep their ids, then CosyVoice's added specials get consecutive ids in
the official order (``<|endofprompt|>`` = 151646, ..., ``[mn]`` = 151662). Added specials are
always matched as whole tokens; language tags such as ``<|en|>`` are plain BPE text. CosyVoice3
appends more specials to the same list (sheet v3 §3.3): pass them as ``added_specials``.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from cosyvino.errors import ConfigError, ModelDirError

from .qwen2_config import QWEN_DIR

#: Qwen2's pre-tokenizer split pattern (transformers ``Qwen2Tokenizer`` PRETOKENIZE_REGEX):
#: contractions, letter runs with one leading non-letter, single digits, punctuation runs, newlines
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: the added specials of upstream ``CosyVoice2Tokenizer``, in its order (sheet v2 §3.3)
COSYVOICE2_ADDED_SPECIALS: tuple[str, ...] = (
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>",
    "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]",
    "<laughter>", "</laughter>", "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]",
    "[mn]",
)

#: the id the official LLM code hard-codes for ``<|endofprompt|>`` (sheet v2 §3.3, v3 §3.3)
END_OF_PROMPT = "<|endofprompt|>"
END_OF_PROMPT_ID = 151646

_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _base_specials(config_path: str) -> list[tuple[int, str]]:
    """(id, content) of ``added_tokens_decoder`` in ``tokenizer_config.json``, by id."""
    try:
        with open(config_path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{config_path} is not valid JSON: {e}", config_path) from None
    decoder = data.get("added_tokens_decoder", {}) if isinstance(data, dict) else None
    if not isinstance(decoder, dict):
        raise ConfigError(f"{config_path}: 'added_tokens_decoder' must be an object", config_path)
    out = []
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str) or not str(key).isdigit():
            raise ConfigError(f"{config_path}: 'added_tokens_decoder.{key}' must map an integer "
                              "id to an object with a 'content' string", config_path)
        out.append((int(key), content))
    return sorted(out)


class QwenTextTokenizer:
    """Text -> Qwen2 token ids, as upstream ``get_qwen_tokenizer(...).encode(text)``.

    Args:
        blank_en_dir: the ``CosyVoice-BlankEN`` dir (``vocab.json``, ``merges.txt``,
            ``tokenizer_config.json``).
        added_specials: CosyVoice's added specials in the official order (default: v2's).

    Raises:
        ModelDirError: a tokenizer file is missing or unreadable (names the file).
        ConfigError: a malformed file, or ids that differ from the ones the official code relies
            on (a base special not at its configured id; ``<|endofprompt|>`` not 151646).
    """

    def __init__(self, blank_en_dir: str | os.PathLike,
                 added_specials: Sequence[str] = COSYVOICE2_ADDED_SPECIALS):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
        from tokenizers import pre_tokenizers

        blank_en_dir = os.fspath(blank_en_dir)
        paths = {name: os.path.join(blank_en_dir, name) for name in _FILES}
        for path in paths.values():
            if not os.path.isfile(path):
                raise ModelDirError(f"tokenizer file not found: {path} (a CosyVoice2/3 model dir "
                                    f"holds {QWEN_DIR}/ with {', '.join(_FILES)})", path)
        base = _base_specials(paths["tokenizer_config.json"])
        try:
            bpe = models.BPE.from_file(paths["vocab.json"], paths["merges.txt"])
        except Exception as e:  # tokenizers raises its own Exception type on a bad file
            raise ConfigError(f"cannot build the BPE from {paths['vocab.json']} and "
                              f"{paths['merges.txt']}: {e}", paths["vocab.json"]) from None
        tok = Tokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        # the base specials first (ids from tokenizer_config.json), then CosyVoice's, skipping
        # the ones already present: the official add_special_tokens gives the new ones
        # consecutive ids after the current length
        for content in [c for _, c in base] + [c for c in added_specials
                                               if c not in {b for _, b in base}]:
            tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        for want, content in base:
            got = tok.token_to_id(content)
            if got != want:
                raise ConfigError(f"{paths['tokenizer_config.json']}: special {content!r} has id "
                                  f"{want} there but {got} after {paths['vocab.json']} "
                                  "(vocab and tokenizer_config disagree)",
                                  paths["tokenizer_config.json"])
        if END_OF_PROMPT in added_specials and tok.token_to_id(END_OF_PROMPT) != END_OF_PROMPT_ID:
            raise ConfigError(f"{blank_en_dir}: {END_OF_PROMPT} gets id "
                              f"{tok.token_to_id(END_OF_PROMPT)}, but the official CosyVoice code "
                              f"relies on {END_OF_PROMPT_ID} (expected the Qwen2 base vocabulary of "
                              "151643 tokens plus 3 base specials)", blank_en_dir)
        self._tok = tok
        self.added_specials = tuple(added_specials)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS; added specials matched whole, sheet v2 §3.3)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (the yaml's ``skip_special_tokens=True`` default drops specials)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string (an added special or a byte-level BPE entry), or None."""
        return self._tok.token_to_id(token)

    def __len__(self) -> int:
        """Vocabulary size including added tokens (151663 for v2, sheet v2 §3.3)."""
        return self._tok.get_vocab_size(with_added_tokens=True)


def load_qwen_tokenizer(model_dir: str | os.PathLike,
                        added_specials: Sequence[str] = COSYVOICE2_ADDED_SPECIALS
                        ) -> QwenTextTokenizer:
    """The tokenizer of a CosyVoice2/3 model dir (``<model_dir>/CosyVoice-BlankEN``).

    Raises: as :class:`QwenTextTokenizer`."""
    return QwenTextTokenizer(os.path.join(os.fspath(model_dir), QWEN_DIR), added_specials)
