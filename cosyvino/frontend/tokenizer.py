"""The CosyVoice v1 text tokenizer: whisper's multilingual tiktoken BPE, built offline.

CosyVoice v1 tokenizes text with openai-whisper's ``get_tokenizer(multilingual=True,
num_languages=100)`` and encodes with ``allowed_special="all"`` (no SOT/language/task prefix, no
EOT suffix). This module rebuilds exactly that ``tiktoken.Encoding`` from the vocabulary file
shipped in ``assets/multilingual.tiktoken`` (from the openai-whisper 20231117 sdist, MIT licence,
see ``assets/multilingual.tiktoken.LICENSE``), so no network and no ``openai-whisper`` install is
needed. The file's SHA-256 is checked when it is loaded.

Id layout (vocabulary size 51866 = the LLM's ``text_token_size``):

* 0..50256: the 50257 mergeable BPE ranks of the file;
* 50257 ``<|endoftext|>``, 50258 ``<|startoftranscript|>``;
* 50259..50358: the 100 language tags in whisper's order (``<|en|>`` 50259, ``<|zh|>`` 50260,
  ``<|ko|>`` 50264, ``<|ja|>`` 50266, ..., ``<|yue|>`` 50358);
* 50359 ``<|translate|>``, 50360 ``<|transcribe|>``, 50361 ``<|startoflm|>``,
  50362 ``<|startofprev|>``, 50363 ``<|nospeech|>``, 50364 ``<|notimestamps|>``;
* 50365..51865: the timestamps ``<|0.00|>`` .. ``<|30.00|>`` in steps of 0.02.

Must not import torch.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path
from typing import Iterable

from cosyvino.errors import ModelDirError

__all__ = [
    "LANGUAGES",
    "SPLIT_PATTERN",
    "VOCAB_SHA256",
    "DEFAULT_VOCAB_PATH",
    "TextTokenizer",
    "special_tokens",
]

#: The shipped vocabulary file and its SHA-256.
DEFAULT_VOCAB_PATH = Path(__file__).resolve().parent / "assets" / "multilingual.tiktoken"
VOCAB_SHA256 = "b34b360dbb493e781e479794586d661700670d65564001f23024971d1f2fa126"
N_MERGEABLE = 50257

#: whisper's pre-tokenization regex (GPT-2 style).
SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

#: The 100 language codes of whisper (``num_languages=100``), in token order.
LANGUAGES: tuple[str, ...] = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr",
    "pl", "ca", "nl", "ar", "sv", "it", "id", "hi", "fi", "vi",
    "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk",
    "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk",
    "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc",
    "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)
assert len(LANGUAGES) == 100


def special_tokens() -> list[str]:
    """The 1609 special tokens in id order (first one gets id 50257)."""
    names = ["<|endoftext|>", "<|startoftranscript|>"]
    names += [f"<|{code}|>" for code in LANGUAGES]
    names += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
              "<|nospeech|>", "<|notimestamps|>"]
    # whisper writes f"{i * 0.02:.2f}"; the exact decimal form below is identical for 0..1500.
    names += [f"<|{i // 50}.{(i % 50) * 2:02d}|>" for i in range(1501)]
    return names


_CACHE: dict[tuple[str, bool], object] = {}
_CACHE_LOCK = threading.Lock()


def _load_encoding(path: Path, verify: bool):
    """Build (once per path) the ``tiktoken.Encoding``; raises ModelDirError on a bad file."""
    key = (str(path), verify)
    with _CACHE_LOCK:
        enc = _CACHE.get(key)
        if enc is not None:
            return enc
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelDirError(
                f"cannot read the text tokenizer vocabulary {path}: {exc}; reinstall cosyvino "
                "(the file ships inside the package)", str(path)) from exc
        if verify:
            digest = hashlib.sha256(data).hexdigest()
            if digest != VOCAB_SHA256:
                raise ModelDirError(
                    f"text tokenizer vocabulary {path} has SHA-256 {digest}, expected "
                    f"{VOCAB_SHA256} (whisper 20231117 multilingual.tiktoken); the file is "
                    "corrupt or a different vocabulary, reinstall cosyvino", str(path))
        ranks: dict[bytes, int] = {}
        try:
            for lineno, line in enumerate(data.splitlines(), 1):
                if not line.strip():
                    continue
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64)] = int(rank)
        except ValueError as exc:
            raise ModelDirError(
                f"text tokenizer vocabulary {path} is malformed at line {lineno}: {exc}",
                str(path)) from exc
        if verify and len(ranks) != N_MERGEABLE:  # pragma: no cover - guarded by the checksum
            raise ModelDirError(
                f"text tokenizer vocabulary {path} has {len(ranks)} ranks, expected "
                f"{N_MERGEABLE}", str(path))
        import tiktoken  # local import keeps `import cosyvino.frontend` cheap

        n = len(ranks)
        specials = {name: n + i for i, name in enumerate(special_tokens())}
        enc = tiktoken.Encoding(
            name="multilingual",
            pat_str=SPLIT_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=specials,
            explicit_n_vocab=n + len(specials),
        )
        _CACHE[key] = enc
        return enc


class TextTokenizer:
    """whisper multilingual BPE tokenizer as used by CosyVoice v1 (``allowed_special="all"``).

    ``TextTokenizer()`` loads the vocabulary shipped with cosyvino (checksum verified; a mismatch
    raises :class:`cosyvino.errors.ModelDirError`). ``vocab_path``/``verify`` exist for tests and
    for callers who bring the same file from elsewhere. The underlying encoding is built once per
    process and shared between instances; encoding is thread-safe.
    """

    def __init__(self, vocab_path: str | Path | None = None, *, verify: bool = True):
        path = Path(vocab_path) if vocab_path is not None else DEFAULT_VOCAB_PATH
        self.vocab_path = path
        self._enc = _load_encoding(path, verify)
        self.special_tokens: dict[str, int] = {
            name: self._enc.encode_single_token(name) for name in special_tokens()}

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written literally (``<|en|>``) become one id."""
        if "<|" not in text:
            # every special token starts with "<|": same result, without tiktoken converting its
            # 1609-entry special set on each call (~0.3 ms per call)
            return self._enc.encode_ordinary(text)
        return self._enc.encode(text, allowed_special="all")

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens are written out; invalid UTF-8 is replaced)."""
        return self._enc.decode([int(i) for i in ids], errors="replace")

    # -- vocabulary facts -------------------------------------------------------------------
    @property
    def encoding(self):
        """The underlying ``tiktoken.Encoding``."""
        return self._enc

    @property
    def vocab_size(self) -> int:
        """51866 for the shipped vocabulary (the LLM's ``text_token_size``)."""
        return self._enc.n_vocab

    @property
    def eot(self) -> int:
        return self.special_tokens["<|endoftext|>"]

    def language_token(self, language: str) -> int:
        """Id of the language tag ``<|language|>`` (e.g. ``"zh"`` -> 50260)."""
        try:
            return self.special_tokens[f"<|{language}|>"]
        except KeyError:
            raise KeyError(f"{language!r} is not one of the 100 whisper language codes") from None

    def __repr__(self) -> str:
        return f"TextTokenizer({str(self.vocab_path)!r}, vocab_size={self.vocab_size})"
