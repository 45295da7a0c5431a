"""CosyVoice2 speech LM (our Qwen2 + KV cache) against the official goldens, and the strict
``llm.pt`` loader (sheet v2 §4.1-4.5)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from cosyvino.errors import CheckpointError, ModelDirError
from conftest import FIXTURES, TINY_C, golden_dirs_of

torch = pytest.importorskip("torch")

from cosyvino.families.cosyvoice2.config import (  # noqa: E402
    CosyVoice2LLMConfig,
    read_cosyvoice2_config,
)
from cosyvino.families.cosyvoice2.llm_checkpoint import (  # noqa: E402
    EMBED_TOKENS_KEY,
    LM_HEAD_KEY,
    llm_state_dict_shapes,
    load_llm_state_dict,
)
from cosyvino.families.cosyvoice2.torch.llm import CosyVoice2LM, load_cosyvoice2_lm  # noqa: E402
from cosyvino.families.cosyvoice23.qwen2_config import QWEN2_0_5B, Qwen2Config  # noqa: E402

TOL = 1e-4
DIRS = golden_dirs_of("cosyvoice2")


@pytest.fixture(scope="module", params=DIRS, ids=lambda p: p.name)
def loaded(request):
    model_dir = request.param
    golden = torch.load(model_dir / "golden.pt", weights_only=False)["llm"]
    return load_cosyvoice2_lm(model_dir), golden


def _max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def test_lm_input(loaded):
    lm, g = loaded
    x = lm.lm_input(g["text_token"])
    assert x.shape == g["lm_input"].shape == (1, g["text_token"].shape[1] + 2,
                                              lm.cfg.llm_input_size)
    assert _max_diff(x, g["lm_input"]) < TOL


@torch.no_grad()
def test_zero_shot_lm_input(loaded):
    lm, g = loaded
    x = lm.lm_input(g["text_token"], g["prompt_text_token"], g["prompt_speech_token"])
    assert x.shape == g["zero_shot_lm_input"].shape
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
    x = lm.lm_input(g["text_token"], g["prompt_text_token"], g["prompt_speech_token"])
    logp, _, _ = lm(x, *lm.empty_cache())
    assert _max_diff(logp[0], g["zero_shot_first_logp"]) < TOL


@torch.no_grad()
def test_prefill_at_once_equals_one_step_at_a_time(loaded):
    lm, g = loaded
    forced = g["forced_speech_tokens"][:8].reshape(1, -1)
    x = torch.cat([lm.lm_input(g["text_token"]), lm.embed_speech(forced)], dim=1)
    h_all, k_all, v_all = lm.qwen(x, *lm.empty_cache())
    past_k, past_v = lm.empty_cache()
    hs = []
    for t in range(x.shape[1]):
        h, past_k, past_v = lm.qwen(x[:, t:t + 1], past_k, past_v)
        hs.append(h)
    assert _max_diff(torch.cat(hs, dim=1), h_all) < 1e-5
    assert _max_diff(past_k, k_all) < 1e-5 and _max_diff(past_v, v_all) < 1e-5
    # a split prefill (two chunks) gives the same as well
    cut = x.shape[1] // 2
    _, k1, v1 = lm.qwen(x[:, :cut], *lm.empty_cache())
    h2, _, _ = lm.qwen(x[:, cut:], k1, v1)
    assert _max_diff(h2, h_all[:, cut:]) < 1e-5


# ---- the strict loader ---------------------------------------------------------------------

def test_full_size_key_set_is_the_manifest():
    manifest = json.loads((FIXTURES / "cosyvoice2-0.5b-state-dict-keys.json").read_text())
    cfg = CosyVoice2LLMConfig(llm_input_size=896, llm_output_size=896, speech_token_size=6561,
                              qwen=QWEN2_0_5B)
    shapes = llm_state_dict_shapes(cfg)
    assert list(shapes) == list(manifest["llm.pt"])  # same keys, the official order
    assert {k: list(v) for k, v in shapes.items()} == manifest["llm.pt"]
    total = sum(math.prod(shape) for shape in shapes.values())
    assert total == manifest["llm.pt:params"] == 641_938_468


def test_tiny_c_stores_fp16_and_loads_as_fp32():
    raw = torch.load(TINY_C / "llm.pt", weights_only=True)
    assert raw["llm_decoder.weight"].dtype == torch.float16
    lm = load_cosyvoice2_lm(TINY_C)
    assert all(p.dtype == torch.float32 for p in lm.state_dict().values())
    # tied: the text table is the file's lm_head entry
    assert torch.equal(lm.qwen.embed_tokens.weight, raw[LM_HEAD_KEY].float())
    # no Qwen text head is built
    assert not any("lm_head" in k for k in lm.state_dict())


_SMALL = CosyVoice2LLMConfig(
    llm_input_size=8, llm_output_size=8, speech_token_size=5,
    qwen=Qwen2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, intermediate_size=16, vocab_size=40))


def _small_file(tmp_path, edit=None, cfg=_SMALL):
    gen = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(s, generator=gen).half() for k, s in llm_state_dict_shapes(cfg).items()}
    sd[LM_HEAD_KEY] = sd[EMBED_TOKENS_KEY].clone()
    if edit:
        edit(sd)
    path = tmp_path / "llm.pt"
    torch.save(sd, path)
    return path, sd


def test_small_file_loads_into_the_module(tmp_path):
    path, sd = _small_file(tmp_path)
    lm = CosyVoice2LM(_SMALL)
    lm.load_state_dict(load_llm_state_dict(path, _SMALL), strict=True)
    assert torch.equal(lm.speech_embedding.weight, sd["speech_embedding.weight"].float())
    assert torch.equal(lm.qwen.layers[0].self_attn.k_proj.bias,
                       sd["llm.model.model.layers.0.self_attn.k_proj.bias"].float())


def test_missing_key_names_file_and_key(tmp_path):
    path, _ = _small_file(tmp_path, lambda sd: sd.pop("llm_decoder.bias"))
    with pytest.raises(CheckpointError, match="llm_decoder.bias") as e:
        load_llm_state_dict(path, _SMALL)
    assert e.value.missing == ["llm_decoder.bias"] and str(path) in str(e.value)
    assert "cosyvoice2.yaml" in str(e.value)


def test_unexpected_key(tmp_path):
    path, _ = _small_file(tmp_path, lambda sd: sd.update({"spk_embed_affine_layer.weight":
                                                          torch.zeros(8, 192)}))
    with pytest.raises(CheckpointError, match="unexpected") as e:
        load_llm_state_dict(path, _SMALL)
    assert e.value.unexpected == ["spk_embed_affine_layer.weight"]


def test_wrong_shape(tmp_path):
    key = "llm.model.model.layers.0.self_attn.k_proj.weight"
    path, _ = _small_file(tmp_path, lambda sd: sd.update({key: torch.zeros(8, 8)}))
    with pytest.raises(CheckpointError, match="expected \\[4, 8\\] found \\[8, 8\\]") as e:
        load_llm_state_dict(path, _SMALL)
    assert e.value.mismatched == [(key, (4, 8), (8, 8))]


def test_integer_tensor_is_refused(tmp_path):
    path, _ = _small_file(tmp_path, lambda sd: sd.update(
        {"llm_decoder.bias": torch.zeros(8, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match="'llm_decoder.bias' must be a floating"):
        load_llm_state_dict(path, _SMALL)


def test_differing_tied_copies_take_lm_head(tmp_path):
    path, sd = _small_file(tmp_path, lambda sd: sd[LM_HEAD_KEY].mul_(2))
    with pytest.warns(UserWarning, match="lm_head"):
        weights = load_llm_state_dict(path, _SMALL)
    assert torch.equal(weights["qwen.embed_tokens.weight"], sd[LM_HEAD_KEY].float())


def test_untied_config_takes_embed_tokens(tmp_path):
    cfg = dataclasses.replace(_SMALL, qwen=dataclasses.replace(_SMALL.qwen,
                                                               tie_word_embeddings=False))
    path, sd = _small_file(tmp_path, lambda sd: sd[LM_HEAD_KEY].mul_(2), cfg=cfg)
    weights = load_llm_state_dict(path, cfg)
    assert torch.equal(weights["qwen.embed_tokens.weight"], sd[EMBED_TOKENS_KEY].float())


def test_missing_and_corrupt_file(tmp_path):
    with pytest.raises(ModelDirError, match="not found"):
        load_llm_state_dict(tmp_path / "llm.pt", _SMALL)
    (tmp_path / "llm.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="llm.pt"):
        load_llm_state_dict(tmp_path / "llm.pt", _SMALL)


def test_config_of_tiny_c_is_read_from_its_files():
    cfg = read_cosyvoice2_config(TINY_C).llm
    assert CosyVoice2LM(cfg).llm_decoder.out_features == 6564
