"""The CosyVoice3 text tokenizer: the shared Qwen2 BPE with v3's 278 added specials (sheet v3 §3.3).

Upstream ``CosyVoice3Tokenizer`` (``get_qwen_tokenizer(..., version: cosyvoice3)``) registers, in
this order: the 19 v2 specials (``<|endofprompt|>`` = 151646 ... ``[mn]`` = 151662), then
``<|endofsystem|>`` (151663, registered but unused by the inference code), then 84 CMU/ARPAbet
phone tokens ``[AA]`` (151664) .. ``[ZH]`` (151747), then 176 pinyin initial/final tokens with
tone marks ``[a]`` (151748) .. ``[ǜ]`` (151923); tokenizer length 151924 (<= the 151936 rows of
the text table). The phone / pinyin tokens are single specials only with this tokenizer, which
is what the "pronunciation inpainting" input relies on (``报道[j][ǐ]予好评``). Both lists are in
the code-point order of the names inside the brackets (checked by the tests). The tokenizer itself is
:class:`cosyvino.families.cosyvoice23.tokenizer.QwenTextTokenizer`. Must not import torch.
"""

from __future__ import annotations

import os

from cosyvino.families.cosyvoice23.tokenizer import (
    COSYVOICE2_ADDED_SPECIALS,
    QwenTextTokenizer,
    load_qwen_tokenizer,
)

#: the one v3 special that is not a phone: registered, never used at inference (sheet v3 §3.3)
END_OF_SYSTEM = "<|endofsystem|>"

#: CMU/ARPAbet vowels: each appears bare and with stress 0, 1, 2 (sheet v3 §3.3)
ARPABET_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY",
                  "UH", "UW")
#: CMU/ARPAbet consonants: bare only
ARPABET_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P",
                      "R", "S", "SH", "T", "TH", "V", "W", "Y", "Z", "ZH")

#: the 84 phone tokens in the official order: code-point order of the phone names (``AA`` before
#: ``AA0``), each in brackets
ARPABET_SPECIALS: tuple[str, ...] = tuple(f"[{p}]" for p in sorted(
    [v + s for v in ARPABET_VOWELS for s in ("", "0", "1", "2")] + list(ARPABET_CONSONANTS)))

#: the 176 pinyin initials and toned finals of upstream ``CosyVoice3Tokenizer``, in its order
#: (code-point order; written without brackets here)
PINYIN_UNITS: tuple[str, ...] = tuple("""
a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu
ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng iù iú iā iān iāng iāo iē iě iōng iū
iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo
uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō
uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh
à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng
ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng
ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ
""".split())

#: the pinyin tokens as registered
PINYIN_SPECIALS: tuple[str, ...] = tuple(f"[{u}]" for u in PINYIN_UNITS)

#: every special upstream ``CosyVoice3Tokenizer`` adds, in its order (280 entries; the first two
#: are Qwen2's own ``<|im_start|>`` / ``<|im_end|>`` and keep their ids, so 278 are new)
COSYVOICE3_ADDED_SPECIALS: tuple[str, ...] = (
    *COSYVOICE2_ADDED_SPECIALS, END_OF_SYSTEM, *ARPABET_SPECIALS, *PINYIN_SPECIALS)


def load_cosyvoice3_tokenizer(model_dir: str | os.PathLike) -> QwenTextTokenizer:
    """The text tokenizer of a CosyVoice3 dir (``<model_dir>/CosyVoice-BlankEN`` + the v3
    specials).

    Raises:
        ModelDirError: a tokenizer file is missing or unreadable (names the file).
        ConfigError: a malformed file, or ids other than the ones the official code relies on
            (:class:`~cosyvino.families.cosyvoice23.tokenizer.QwenTextTokenizer`).
    """
    return load_qwen_tokenizer(model_dir, COSYVOICE3_ADDED_SPECIALS)
