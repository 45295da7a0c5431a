"""The CosyVoice3 text tokenizer (sheet v3 §3.3): the shared Qwen2 BPE plus v3's specials, against
the official tokenizer's ids."""

from __future__ import annotations

import pytest

from cosyvino.families.cosyvoice23.tokenizer import COSYVOICE2_ADDED_SPECIALS
from cosyvino.families.cosyvoice3.tokenizer import (
    ARPABET_SPECIALS,
    COSYVOICE3_ADDED_SPECIALS,
    PINYIN_SPECIALS,
    PINYIN_UNITS,
    load_cosyvoice3_tokenizer,
)
from conftest import TINY_C, TINY_E, golden_dirs_of

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok():
    return load_cosyvoice3_tokenizer(TINY_E)


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice3"), ids=lambda p: p.name)
def test_golden_ids_exact(model_dir):
    torch = pytest.importorskip("torch")
    golden = torch.load(model_dir / "golden.pt", weights_only=False)["tokenizer"]
    assert len(golden) >= 10
    tok = load_cosyvoice3_tokenizer(model_dir)
    for text, ids in golden:
        assert tok.encode(text) == [int(i) for i in ids], text


# the sheet's examples (sheet v3 §3.3)
@pytest.mark.parametrize("text, ids", [
    ("对报道[j][ǐ]予好评。", [32664, 86227, 151797, 151913, 99944, 102959, 1773]),
    ("You are a helpful assistant.<|endofprompt|>希望你以后能够做的比我还好呦。",
     [2610, 525, 264, 10950, 17847, 13, 151646, 99880, 56568, 103934, 100006, 100854, 56006,
      107228, 52801, 119024, 1773]),
])
def test_sheet_examples(tok, text, ids):
    assert tok.encode(text) == ids


def test_phone_and_pinyin_tokens_are_plain_bpe_for_v2():
    from cosyvino.families.cosyvoice23.tokenizer import load_qwen_tokenizer

    v2 = load_qwen_tokenizer(TINY_C)
    ids = v2.encode("对报道[j][ǐ]予好评。")
    assert 151797 not in ids and 151913 not in ids and len(ids) > 7


def test_special_id_ranges(tok):
    assert len(COSYVOICE3_ADDED_SPECIALS) == 280  # 278 new + <|im_start|>, <|im_end|>
    assert COSYVOICE3_ADDED_SPECIALS[:19] == COSYVOICE2_ADDED_SPECIALS
    assert len(ARPABET_SPECIALS) == 84 and len(PINYIN_SPECIALS) == 176
    ids = {s: tok.token_to_id(s) for s in COSYVOICE3_ADDED_SPECIALS}
    assert ids["<|endofprompt|>"] == 151646 and ids["[mn]"] == 151662
    assert ids["<|endofsystem|>"] == 151663
    assert [ids[s] for s in ARPABET_SPECIALS] == list(range(151664, 151748))
    assert ARPABET_SPECIALS[0] == "[AA]" and ARPABET_SPECIALS[-1] == "[ZH]"
    assert [ids[s] for s in PINYIN_SPECIALS] == list(range(151748, 151924))
    assert PINYIN_SPECIALS[0] == "[a]" and PINYIN_SPECIALS[-1] == "[ǜ]"
    assert len(tok) == 151924


def test_official_order_is_code_point_order_of_the_names():
    arpabet = [s[1:-1] for s in ARPABET_SPECIALS]
    assert arpabet == sorted(arpabet) and arpabet[:5] == ["AA", "AA0", "AA1", "AA2", "AE"]
    assert list(PINYIN_UNITS) == sorted(PINYIN_UNITS)
    assert len(set(COSYVOICE3_ADDED_SPECIALS)) == len(COSYVOICE3_ADDED_SPECIALS)


def test_phone_tokens_are_matched_whole(tok):
    assert tok.encode("[AH0][B]") == [tok.token_to_id("[AH0]"), tok.token_to_id("[B]")]
    assert tok.encode("[ZZ]") != [tok.token_to_id("[ZH]")]  # not a special: plain BPE
    assert tok.decode(tok.encode("你[h][ǎo]")) == "你"  # specials skipped, as the yaml says
