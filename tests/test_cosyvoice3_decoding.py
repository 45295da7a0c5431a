"""CosyVoice3's decoding rule (sheet v3 §4.3, §10.2) and the ``<|endofprompt|>`` rule (§3.4).

Under the official rule only index 6561 (v3's SOS) is masked below min_len, so the EOS 6562 and
every other stop id end the utterance at any step: min length is not enforced; the
``min_length="enforced"`` option masks all 200 stop ids below min_len. The golden
``sampled_tokens`` came from torch's seeded sampler in the official generator (our sampler draws
from numpy), so only their length is checked: 19 tokens for 15 text tokens, below min_len 30."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice23.decoding import decode_speech_tokens
from cosyvino.families.cosyvoice3.config import read_cosyvoice3_config
from cosyvino.families.cosyvoice3.decoding import decoding_rule
from cosyvino.families.cosyvoice3.prompt import (
    DEFAULT_PREFIX,
    instruct_prompt,
    llm_text_ids,
)
from conftest import TINY_E, golden_dirs_of

V = 6761
SOS, EOS, TASK, FILL, LAST_STOP = 6561, 6562, 6563, 6564, 6760
PREFIX_IDS = [2610, 525, 264, 10950, 17847, 13, 151646]  # DEFAULT_PREFIX, sheet v3 §3.3


@pytest.fixture(scope="module")
def cfg():
    return read_cosyvoice3_config(TINY_E).llm


@pytest.fixture(scope="module")
def official(cfg):
    return decoding_rule(cfg)


@pytest.fixture(scope="module")
def enforced(cfg):
    return decoding_rule(cfg, min_length="enforced")


def test_rule_constants(official, enforced):
    for rule in (official, enforced):
        assert rule.stop_token_ids == set(range(SOS, LAST_STOP + 1))
        assert (rule.min_token_text_ratio, rule.max_token_text_ratio) == (2.0, 20.0)
        assert rule.length_limits(15) == (30, 300)
    assert official.masked_below_min_len == (SOS,)  # upstream masks speech_token_size
    assert enforced.masked_below_min_len == tuple(range(SOS, LAST_STOP + 1))


def test_unknown_min_length_option(cfg):
    with pytest.raises(InputError, match="official, enforced"):
        decoding_rule(cfg, min_length="strict")


def _scripted(favourite: int | None):
    """``next_logp`` making ``favourite`` near-certain (if given) among 10 ordinary tokens."""
    calls = []

    def next_logp(previous):
        calls.append(previous)
        logp = np.full(V, -1e9, dtype=np.float32)
        logp[:10] = -12.0
        if favourite is not None:
            logp[favourite] = 0.0
        return logp

    return next_logp, calls


def _decode(rule, favourite, n_text=8, seed=0):
    next_logp, calls = _scripted(favourite)
    tokens = list(decode_speech_tokens(next_logp, n_text, rule, SamplingConfig(),
                                       np.random.default_rng(seed)))
    return tokens, calls


@pytest.mark.parametrize("stop", [EOS, TASK, FILL, 6600, LAST_STOP])
def test_official_rule_lets_any_stop_id_but_sos_end_at_step_0(official, stop):
    tokens, calls = _decode(official, stop)
    assert tokens == [] and calls == [None]


def test_official_rule_masks_sos_below_min_len(official):
    tokens, calls = _decode(official, SOS)
    assert len(tokens) == 16  # masked for steps 0..15, drawn (and stops) at step 16
    assert all(0 <= t < 10 for t in tokens) and calls[1:] == tokens


@pytest.mark.parametrize("stop", [SOS, EOS, FILL, LAST_STOP])
def test_enforced_rule_reaches_min_len(enforced, stop):
    tokens, calls = _decode(enforced, stop)
    assert len(tokens) == 16 and all(0 <= t < 10 for t in tokens)
    assert len(calls) == 17


def test_no_stop_runs_to_max_len(official):
    tokens, calls = _decode(official, None, n_text=3, seed=1)
    assert len(tokens) == 60 and len(calls) == 60


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice3"), ids=lambda p: p.name)
def test_golden_sampled_length_obeys_the_official_rule_only(model_dir):
    torch = pytest.importorskip("torch")
    g = torch.load(model_dir / "golden.pt", weights_only=False)["llm"]
    llm = read_cosyvoice3_config(model_dir).llm
    min_len, max_len = decoding_rule(llm).length_limits(g["text_token"].shape[1])
    tokens = list(g["sampled_tokens"])
    assert len(tokens) == g["sampled_tokens_len"] <= max_len
    assert all(0 <= t < llm.speech_token_size for t in tokens)
    if model_dir == TINY_E:  # the fact the official rule implies: min_len was not enforced
        assert (len(tokens), min_len) == (19, 30)


def test_our_model_and_sampler_obey_both_rules(cfg):
    torch = pytest.importorskip("torch")
    from cosyvino.families.cosyvoice3.torch.llm import load_cosyvoice3_lm

    g = torch.load(TINY_E / "golden.pt", weights_only=False)["llm"]
    lm = load_cosyvoice3_lm(TINY_E)
    n = g["text_token"].shape[1]
    for option in ("official", "enforced"):
        rule = decoding_rule(cfg, option)
        state = {"cache": lm.empty_cache()}

        @torch.no_grad()
        def next_logp(previous, state=state):
            x = lm.lm_input(g["text_token"]) if previous is None else lm.embed_speech(
                torch.tensor([[previous]]))
            logp, *state["cache"] = lm(x, *state["cache"])
            return logp[0].numpy()

        tokens = list(decode_speech_tokens(next_logp, n, rule, cfg.sampling,
                                           np.random.default_rng(0)))
        min_len, max_len = rule.length_limits(n)
        assert len(tokens) <= max_len
        assert all(0 <= t < SOS for t in tokens)
        if option == "enforced":
            assert len(tokens) >= min_len


# ---- <|endofprompt|> ------------------------------------------------------------------------

def test_prefix_ids_are_the_tokenizers():
    pytest.importorskip("tokenizers")
    from cosyvino.families.cosyvoice3.tokenizer import load_cosyvoice3_tokenizer

    assert load_cosyvoice3_tokenizer(TINY_E).encode(DEFAULT_PREFIX) == PREFIX_IDS


def test_marker_present_on_either_side_leaves_both_unchanged():
    text = [1, 2, 3]
    assert llm_text_ids(text, [9, 151646, 8], prefix_ids=PREFIX_IDS) == ([9, 151646, 8], text)
    with_marker = [*PREFIX_IDS, 4, 5]
    for policy in ("add", "require"):
        assert llm_text_ids(with_marker, [], prefix_ids=PREFIX_IDS, policy=policy) == (
            [], with_marker)


def test_add_puts_the_prefix_in_front_of_the_prompt_not_the_text():
    prompt, text = llm_text_ids([1, 2, 3], [7, 8], prefix_ids=PREFIX_IDS)
    assert prompt == [*PREFIX_IDS, 7, 8] and text == [1, 2, 3]  # min/max len count 3 tokens
    prompt, text = llm_text_ids(np.array([1, 2]), prefix_ids=PREFIX_IDS)
    assert prompt == PREFIX_IDS and text == [1, 2]


def test_require_raises_a_clear_input_error():
    with pytest.raises(InputError, match=r"needs <\|endofprompt\|> in the prompt text or the "
                                         r"text.*You are a helpful assistant"):
        llm_text_ids([1, 2, 3], [7, 8], prefix_ids=PREFIX_IDS, policy="require")
    with pytest.raises(InputError, match="policy must be one of add, require"):
        llm_text_ids([1], prefix_ids=PREFIX_IDS, policy="maybe")
    with pytest.raises(InputError, match="lack <\\|endofprompt\\|>"):
        llm_text_ids([1], prefix_ids=[1, 2])


def test_added_prefix_builds_the_official_cross_lingual_lm_input():
    """Plain text with the added prefix gives exactly the golden lm_input, which the official
    code built from the text with the prefix written in (the cross-lingual convention)."""
    torch = pytest.importorskip("torch")
    from cosyvino.families.cosyvoice3.torch.llm import load_cosyvoice3_lm

    g = torch.load(TINY_E / "golden.pt", weights_only=False)["llm"]
    full = g["text_token"][0].tolist()
    assert full[:7] == PREFIX_IDS
    prompt, text = llm_text_ids(full[7:], prefix_ids=PREFIX_IDS)
    lm = load_cosyvoice3_lm(TINY_E)
    with torch.no_grad():
        x = lm.lm_input(torch.tensor([text]), torch.tensor([prompt]))
    assert torch.equal(x, lm.lm_input(g["text_token"]))
    assert float((x - g["lm_input"]).abs().max()) < 1e-4


def test_registered_voice_without_the_marker_gets_it():
    """tiny-e's registered voices hold transcripts without <|endofprompt|>; upstream would
    assert on them with plain text, cosyvino adds the prefix."""
    pytest.importorskip("torch")
    from cosyvino.families.cosyvoice23.speakers import load_spk2info

    alice = load_spk2info(TINY_E / "spk2info.pt")["alice"].bundle
    assert 151646 not in alice.prompt_text_token.tolist()
    prompt, _ = llm_text_ids([5, 6], alice.prompt_text_token, prefix_ids=PREFIX_IDS)
    assert prompt == PREFIX_IDS + alice.prompt_text_token.tolist()


@pytest.mark.parametrize("instruction, want", [
    ("请用广东话表达。", "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"),
    ("  Speak slowly. ", "You are a helpful assistant. Speak slowly.<|endofprompt|>"),
    ("You are a helpful assistant. 请用四川话表达。<|endofprompt|>",
     "You are a helpful assistant. 请用四川话表达。<|endofprompt|>"),
])
def test_instruct_prompt_official_form(instruction, want):
    assert instruct_prompt(instruction) == want


def test_instruct_prompt_tokens_match_the_golden():
    pytest.importorskip("tokenizers")
    torch = pytest.importorskip("torch")
    from cosyvino.families.cosyvoice3.tokenizer import load_cosyvoice3_tokenizer

    golden = dict(torch.load(TINY_E / "golden.pt", weights_only=False)["tokenizer"])
    text = instruct_prompt("请用广东话表达。")
    assert load_cosyvoice3_tokenizer(TINY_E).encode(text) == [int(i) for i in golden[text]]


def test_empty_instruction():
    with pytest.raises(InputError, match="instruction is empty"):
        instruct_prompt("   ")
