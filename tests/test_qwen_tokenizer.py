"""The Qwen2 text tokenizer of CosyVoice2 (sheet v2 §3.3) against the official tokenizer's ids."""

from __future__ import annotations

import shutil

import pytest

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice23.tokenizer import (
    COSYVOICE2_ADDED_SPECIALS,
    QwenTextTokenizer,
    load_qwen_tokenizer,
)
from conftest import TINY_C, golden_dirs_of

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok():
    return load_qwen_tokenizer(TINY_C)


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice2"), ids=lambda p: p.name)
def test_golden_ids_exact(model_dir):
    torch = pytest.importorskip("torch")
    golden = torch.load(model_dir / "golden.pt", weights_only=False)["tokenizer"]
    assert len(golden) >= 10
    tok = load_qwen_tokenizer(model_dir)
    for text, ids in golden:
        assert tok.encode(text) == [int(i) for i in ids], text


# the sheet's examples (sheet v2 §3.3)
@pytest.mark.parametrize("text, ids", [
    ("Hello world.", [9707, 1879, 13]),
    ("You are a helpful assistant.<|endofprompt|>希望你以后能够做的比我还好呦。",
     [2610, 525, 264, 10950, 17847, 13, 151646, 99880, 56568, 103934, 100006, 100854, 56006,
      107228, 52801, 119024, 1773]),
    ("用四川话说这句话<|endofprompt|>", [11622, 102110, 103101, 106599, 151646]),
    ("<strong>勇气</strong>", [151648, 106860, 151649]),
    ("在他讲述那个荒诞故事的过程中，他突然[laughter]停下来。",
     [106314, 102881, 101095, 101293, 100924, 101108, 104915, 3837, 42411, 103961, 151651,
      116238, 1773]),
    ("<|en|>Hello", [27, 91, 268, 91, 29, 9707]),  # language tags are plain BPE in v2
])
def test_sheet_examples(tok, text, ids):
    assert tok.encode(text) == ids


def test_special_ids(tok):
    want = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    want.update({s: 151646 + i for i, s in enumerate(COSYVOICE2_ADDED_SPECIALS[2:])})
    assert want["[mn]"] == 151662 and want["<|endofprompt|>"] == 151646
    assert {s: tok.token_to_id(s) for s in want} == want
    assert len(tok) == 151663


def test_no_bos_eos_and_nfc(tok):
    assert tok.encode("") == []
    # NFC: a decomposed "é" (e + combining acute) tokenizes like the composed one
    assert tok.encode("caf\u0065\u0301") == tok.encode("caf\u00e9")


def test_decode_round_trip(tok):
    text = "[breath]你好, world!"
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "你好, world!"


def _copy(tmp_path):
    dst = tmp_path / "CosyVoice-BlankEN"
    shutil.copytree(TINY_C / "CosyVoice-BlankEN", dst)
    return dst


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt", "tokenizer_config.json"])
def test_missing_file(tmp_path, name):
    d = _copy(tmp_path)
    (d / name).unlink()
    with pytest.raises(ModelDirError, match=name) as e:
        QwenTextTokenizer(d)
    assert e.value.path == str(d / name)


def test_bad_tokenizer_config(tmp_path):
    d = _copy(tmp_path)
    (d / "tokenizer_config.json").write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match="tokenizer_config.json is not valid JSON"):
        QwenTextTokenizer(d)


def test_endofprompt_id_is_checked(tmp_path):
    # one extra base special shifts every CosyVoice special by one: the official LLM code's
    # hard-coded <|endofprompt|> = 151646 would then be wrong, so this is refused
    import json

    d = _copy(tmp_path)
    path = d / "tokenizer_config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens_decoder"]["151646"] = {"content": "<|extra|>", "special": True}
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="151646"):
        QwenTextTokenizer(d)
