"""CosyVoice2 spk2info.pt: the SFT layout and the official add_zero_shot_spk bundle (sheet v2 §3.7)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvino.errors import CheckpointError, ModelDirError
from cosyvino.families.cosyvoice1.checkpoint import read_speaker_names
from cosyvino.families.cosyvoice2.speakers import load_cosyvoice2_spk2info
from conftest import TINY_C

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def raw():
    return torch.load(TINY_C / "spk2info.pt", weights_only=True)


def test_tiny_c_speakers(raw):
    speakers = load_cosyvoice2_spk2info(TINY_C / "spk2info.pt")
    assert list(speakers) == ["中文女", "alice", "bob"] == read_speaker_names(
        TINY_C / "spk2info.pt")
    sft = speakers["中文女"]
    assert sft.bundle is None and sft.embedding.shape == (1, 192)
    np.testing.assert_array_equal(sft.embedding, raw["中文女"]["embedding"].numpy())
    assert sft.flow_embedding is sft.embedding
    for name, n_text, n_tokens in (("alice", 10, 20), ("bob", 8, 31)):
        v = speakers[name]
        assert v.embedding is None
        b = v.bundle
        assert b.prompt_text_token.shape == (n_text,) and b.prompt_text_token.dtype == np.int64
        assert b.llm_prompt_speech_token.shape == b.flow_prompt_speech_token.shape == (n_tokens,)
        assert b.prompt_speech_feat.shape == (2 * n_tokens, 80)  # aligned: 2 frames per token
        assert b.prompt_speech_feat.dtype == np.float32
        np.testing.assert_array_equal(b.prompt_speech_feat,
                                      raw[name]["prompt_speech_feat"][0].numpy())
        np.testing.assert_array_equal(b.llm_prompt_speech_token,
                                      raw[name]["llm_prompt_speech_token"][0].numpy())
        assert b.llm_embedding.shape == b.flow_embedding.shape == (1, 192)
        assert v.flow_embedding is b.flow_embedding


def test_bundle_prompt_text_is_qwen_ids():
    pytest.importorskip("tokenizers")
    from cosyvino.families.cosyvoice23.tokenizer import load_qwen_tokenizer

    tok = load_qwen_tokenizer(TINY_C)
    alice = load_cosyvoice2_spk2info(TINY_C / "spk2info.pt")["alice"].bundle
    assert tok.encode(tok.decode(alice.prompt_text_token)) == alice.prompt_text_token.tolist()


def _write(tmp_path, data):
    path = tmp_path / "spk2info.pt"
    torch.save(data, path)
    return path


def _alice(raw):
    return {k: v.clone() for k, v in raw["alice"].items()}


def test_entry_with_both_layouts(tmp_path, raw):
    entry = _alice(raw)
    entry["embedding"] = raw["中文女"]["embedding"]
    v = load_cosyvoice2_spk2info(_write(tmp_path, {"x": entry}))["x"]
    assert v.embedding is not None and v.bundle is not None
    assert v.flow_embedding is v.embedding  # SFT uses `embedding` for the flow


def test_lengths_are_optional(tmp_path, raw):
    entry = {k: v for k, v in _alice(raw).items() if not k.endswith("_len")}
    v = load_cosyvoice2_spk2info(_write(tmp_path, {"a": entry}))["a"]
    assert v.bundle.llm_prompt_speech_token.size == 20


@pytest.mark.parametrize("edit, match", [
    (lambda e: e.pop("prompt_speech_feat"), "without prompt_speech_feat"),
    (lambda e: e.update(llm_prompt_speech_token_len=torch.tensor([19], dtype=torch.int32)),
     "llm_prompt_speech_token_len is \\[19\\] but llm_prompt_speech_token holds 20"),
    (lambda e: e.update(flow_prompt_speech_token=torch.full((1, 20), 6561, dtype=torch.int32)),
     "outside 0..6560"),
    (lambda e: e.update(prompt_speech_feat=torch.zeros(1, 40, 81)), "\\[1, M, 80\\]"),
    (lambda e: e.update(flow_embedding=torch.zeros(1, 80)), "flow_embedding must be finite"),
    (lambda e: e.update(prompt_text=torch.zeros(1, 10)), "prompt_text must be int"),
])
def test_malformed_bundle(tmp_path, raw, edit, match):
    entry = _alice(raw)
    edit(entry)
    with pytest.raises(CheckpointError, match=match) as e:
        load_cosyvoice2_spk2info(_write(tmp_path, {"alice": entry}))
    assert "'alice'" in str(e.value) and e.value.path.endswith("spk2info.pt")


def test_entry_of_neither_layout(tmp_path):
    with pytest.raises(CheckpointError, match="neither 'embedding'"):
        load_cosyvoice2_spk2info(_write(tmp_path, {"x": {"foo": torch.zeros(1)}}))


def test_bad_sft_embedding(tmp_path):
    with pytest.raises(CheckpointError, match="embedding must be finite float \\[1, 192\\]"):
        load_cosyvoice2_spk2info(_write(tmp_path, {"x": {"embedding": torch.zeros(1, 80)}}))


def test_empty_and_not_a_dict(tmp_path):
    with pytest.raises(CheckpointError, match="no speakers"):
        load_cosyvoice2_spk2info(_write(tmp_path, {}))
    with pytest.raises(CheckpointError, match="expected a dict"):
        load_cosyvoice2_spk2info(_write(tmp_path, [1, 2]))


def test_missing_file(tmp_path):
    with pytest.raises(ModelDirError, match="not found"):
        load_cosyvoice2_spk2info(tmp_path / "spk2info.pt")
