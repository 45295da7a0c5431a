"""CosyVoice3 speech LM (our Qwen2 + KV cache) against the official goldens, and the strict
``llm.pt`` loader (sheet v3 §4.1-4.3)."""

from __future__ import annotations

import json
import math

import pytest

from cosyvino.errors import CheckpointError, InputError
from conftest import FIXTURES, TINY_C, TINY_E, golden_dirs_of

torch = pytest.importorskip("torch")

from cosyvino.families.cosyvoice23.lm_checkpoint import (  # noqa: E402
    EMBED_TOKENS_KEY,
    LM_HEAD_KEY,
)
from cosyvino.families.cosyvoice23.qwen2_config import QWEN2_0_5B  # noqa: E402
from cosyvino.families.cosyvoice23.tokenizer import END_OF_PROMPT_ID  # noqa: E402
from cosyvino.families.cosyvoice3.config import (  # noqa: E402
    CosyVoice3LLMConfig,
    read_cosyvoice3_config,
)
from cosyvino.families.cosyvoice3.llm_checkpoint import (  # noqa: E402
    llm_state_dict_shapes,
    load_llm_state_dict,
)
from cosyvino.families.cosyvoice3.torch.llm import CosyVoice3LM, load_cosyvoice3_lm  # noqa: E402

TOL = 1e-4
DIRS = golden_dirs_of("cosyvoice3")


@pytest.fixture(scope="module", params=DIRS, ids=lambda p: p.name)
def loaded(request):
    model_dir = request.param
    golden = torch.load(model_dir / "golden.pt", weights_only=False)["llm"]
    return load_cosyvoice3_lm(model_dir), golden


def _max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def _zero_shot_tts_text(g):
    """The golden's zero-shot tts text: its ``text_token`` (cross-lingual layout, the system
    prefix written into the text) after the ``<|endofprompt|>``; the zero-shot prompt text
    carries the prefix instead (sheet v3 §3.4)."""
    ids = g["text_token"][0].tolist()
    return g["text_token"][:, ids.index(END_OF_PROMPT_ID) + 1:]


@torch.no_grad()
def test_lm_input(loaded):
    lm, g = loaded
    x = lm.lm_input(g["text_token"])
    assert x.shape == g["lm_input"].shape == (1, g["text_token"].shape[1] + 2,
                                              lm.cfg.llm_input_size)
    assert _max_diff(x, g["lm_input"]) < TOL
    # SOS / TASK are rows 6561 / 6563 of the speech embedding (no llm_embedding in v3)
    w = lm.speech_embedding.weight
    assert torch.equal(x[0, 0], w[g["sos"]]) and torch.equal(x[0, -1], w[g["task_id"]])


@torch.no_grad()
def test_zero_shot_lm_input(loaded):
    lm, g = loaded
    text = _zero_shot_tts_text(g)
    x = lm.lm_input(text, g["prompt_text_token"], g["prompt_speech_token"])
    assert x.shape == g["zero_shot_lm_input"].shape == (
        1, 1 + g["prompt_text_token"].shape[1] + text.shape[1] + 1
        + g["prompt_speech_token"].shape[1], lm.cfg.llm_input_size)
    assert _max_diff(x, g["zero_shot_lm_input"]) < TOL


@torch.no_grad()
def test_teacher_forced_logp_through_our_kv_cache(loaded):
    """The prefix, then each of the 24 forced tokens fed one step at a time through the cache."""
    lm, g = loaded
    past_k, past_v = lm.empty_cache()
    logp, past_k, past_v = lm(lm.lm_input(g["text_token"]), past_k, past_v)
    rows = [logp[0]]
    for tok in g["forced_speech_tokens"]:
        logp, past_k, past_v = lm(lm.embed_speech(tok.reshape(1, 1)), past_k, past_v)
        rows.append(logp[0])
    got = torch.stack(rows)
    assert got.shape == g["logp"].shape == (25, lm.cfg.vocab_out)
    assert _max_diff(got, g["logp"]) < TOL
    assert past_k.shape[3] == g["lm_input"].shape[1] + 24


@torch.no_grad()
def test_zero_shot_first_logp(loaded):
    lm, g = loaded
    x = lm.lm_input(_zero_shot_tts_text(g), g["prompt_text_token"], g["prompt_speech_token"])
    logp, _, _ = lm(x, *lm.empty_cache())
    assert logp.shape == (1, lm.cfg.vocab_out)
    assert _max_diff(logp[0], g["zero_shot_first_logp"]) < TOL


@torch.no_grad()
def test_text_ids_outside_the_vocabulary_are_an_input_error(loaded):
    lm, _ = loaded
    vocab = lm.cfg.qwen.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(InputError, match=f"0..{vocab - 1}"):
            lm.lm_input(torch.tensor([[5, bad]]))


# ---- the strict loader ---------------------------------------------------------------------

def test_full_size_key_set_is_the_manifest():
    manifest = json.loads((FIXTURES / "cosyvoice3-0.5b-llm-keys.json").read_text())
    cfg = CosyVoice3LLMConfig(llm_input_size=896, llm_output_size=896, speech_token_size=6561,
                              qwen=QWEN2_0_5B)
    shapes = llm_state_dict_shapes(cfg)
    assert list(shapes) == list(manifest["llm.pt"])  # same keys, the official order
    assert {k: list(v) for k, v in shapes.items()} == manifest["llm.pt"]
    assert len(shapes) == 293
    total = sum(math.prod(shape) for shape in shapes.values())
    assert total == manifest["llm.pt:params"] == 642_283_136
    # the module at full size has the same tensors (the tied copy loads into embed_tokens)
    with torch.device("meta"):
        lm = CosyVoice3LM(cfg)
    got = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    want = {("qwen." + k[len("llm.model.model."):] if k.startswith("llm.model.model.") else k): s
            for k, s in shapes.items() if k != LM_HEAD_KEY}
    assert got == want
    assert lm.llm_decoder.bias is None


def test_tiny_e_stores_fp16_and_loads_as_fp32():
    raw = torch.load(TINY_E / "llm.pt", weights_only=True)
    assert raw["llm_decoder.weight"].dtype == torch.float16
    lm = load_cosyvoice3_lm(TINY_E)
    assert all(p.dtype == torch.float32 for p in lm.state_dict().values())
    assert torch.equal(lm.qwen.embed_tokens.weight, raw[LM_HEAD_KEY].float())
    assert torch.equal(lm.speech_embedding.weight, raw["speech_embedding.weight"].float())
    assert not any("lm_head" in k or "llm_embedding" in k for k in lm.state_dict())


def test_a_v2_llm_pt_is_refused_with_the_keys_named(tmp_path):
    """tiny-c's llm.pt against the tiny-e config: v2 has llm_embedding and a decoder bias, and
    6564 speech rows instead of 6761."""
    cfg = read_cosyvoice3_config(TINY_E).llm
    with pytest.raises(CheckpointError) as e:
        load_llm_state_dict(TINY_C / "llm.pt", cfg)
    err = e.value
    assert set(err.unexpected) == {"llm_embedding.weight", "llm_decoder.bias"}
    assert ("speech_embedding.weight", (6761, 32), (6564, 32)) in err.mismatched
    assert "cosyvoice3.yaml" in str(err) and "CosyVoice3" in str(err)


def _small_cfg():
    from cosyvino.families.cosyvoice23.qwen2_config import Qwen2Config

    return CosyVoice3LLMConfig(
        llm_input_size=8, llm_output_size=8, speech_token_size=5,
        qwen=Qwen2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=16, vocab_size=40))


def _small_file(tmp_path, edit=None):
    cfg = _small_cfg()
    gen = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(s, generator=gen).half() for k, s in llm_state_dict_shapes(cfg).items()}
    sd[LM_HEAD_KEY] = sd[EMBED_TOKENS_KEY].clone()
    if edit:
        edit(sd)
    path = tmp_path / "llm.pt"
    torch.save(sd, path)
    return path, sd, cfg


def test_small_file_loads_into_the_module(tmp_path):
    path, sd, cfg = _small_file(tmp_path)
    assert cfg.vocab_out == 205 and sd["llm_decoder.weight"].shape == (205, 8)
    lm = CosyVoice3LM(cfg)
    lm.load_state_dict(load_llm_state_dict(path, cfg), strict=True)
    assert torch.equal(lm.llm_decoder.weight, sd["llm_decoder.weight"].float())


def test_missing_and_added_bias(tmp_path):
    path, _, cfg = _small_file(tmp_path, lambda sd: sd.pop("speech_embedding.weight"))
    with pytest.raises(CheckpointError, match="speech_embedding.weight") as e:
        load_llm_state_dict(path, cfg)
    assert e.value.missing == ["speech_embedding.weight"] and str(path) in str(e.value)
    path, _, cfg = _small_file(tmp_path, lambda sd: sd.update(
        {"llm_decoder.bias": torch.zeros(205)}))
    with pytest.raises(CheckpointError, match="unexpected") as e:
        load_llm_state_dict(path, cfg)
    assert e.value.unexpected == ["llm_decoder.bias"]
