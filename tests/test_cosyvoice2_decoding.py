"""CosyVoice2's decoding rule (sheet v2 §4.5): length bounds from the text length, the stop ids,
only the EOS masked below min_len, RAS draws.

The golden ``sampled_tokens`` came from torch's seeded sampler inside the official generator;
our sampler draws from numpy, so its draws are not comparable: only the length rules are checked
against the golden (and against scripted distributions here)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice2.config import read_cosyvoice2_config
from cosyvino.families.cosyvoice2.decoding import decoding_rule
from cosyvino.families.cosyvoice23.decoding import DecodingRule, decode_speech_tokens
from conftest import TINY_C, golden_dirs_of

V = 6564
EOS, UNUSED_STOP, FILL = 6561, 6562, 6563


@pytest.fixture(scope="module")
def rule() -> DecodingRule:
    return decoding_rule(read_cosyvoice2_config(TINY_C).llm)


def test_rule_constants(rule):
    assert rule.stop_token_ids == {EOS, UNUSED_STOP, FILL}
    assert rule.masked_below_min_len == (EOS,)
    assert (rule.min_token_text_ratio, rule.max_token_text_ratio) == (2.0, 20.0)


@pytest.mark.parametrize("n, limits", [(1, (2, 20)), (8, (16, 160)), (37, (74, 740))])
def test_length_limits(rule, n, limits):
    assert rule.length_limits(n) == limits


def test_length_limits_truncate_like_int():
    r = DecodingRule(frozenset({9}), (9,), min_token_text_ratio=2.5, max_token_text_ratio=7.9)
    assert r.length_limits(3) == (7, 23)  # int(7.5), int(23.7)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_length_limits_refuse_no_text(rule, n):
    with pytest.raises(InputError, match="tokens"):
        rule.length_limits(n)


def test_only_eos_is_masked_below_min_len(rule):
    logp = np.full(V, -9.0, dtype=np.float32)
    masked = rule.masked(logp, step=3, min_len=4)
    assert masked[EOS] == -np.inf
    assert masked[UNUSED_STOP] == masked[FILL] == -9.0 and np.isfinite(masked[:EOS]).all()
    assert np.isfinite(logp).all()  # the caller's array is untouched
    assert rule.masked(logp, step=4, min_len=4) is logp


def _scripted(favourite: int | None):
    """``next_logp`` that makes ``favourite`` near-certain (if given) among 10 ordinary tokens;
    every other id impossible. Counts its calls."""
    calls = []

    def next_logp(previous):
        calls.append(previous)
        logp = np.full(V, -1e9, dtype=np.float32)
        logp[:10] = -12.0
        if favourite is not None:
            logp[favourite] = 0.0
        return logp

    return next_logp, calls


def test_eos_ends_at_min_len(rule):
    next_logp, calls = _scripted(EOS)
    tokens = list(decode_speech_tokens(next_logp, 8, rule, SamplingConfig(),
                                       np.random.default_rng(0)))
    assert len(tokens) == 16  # masked for steps 0..15, drawn at step 16
    assert all(0 <= t < 10 for t in tokens)
    assert len(calls) == 17 and calls[0] is None and calls[1:] == tokens


def test_no_eos_runs_to_max_len(rule):
    next_logp, calls = _scripted(None)
    tokens = list(decode_speech_tokens(next_logp, 3, rule, SamplingConfig(),
                                       np.random.default_rng(1)))
    assert len(tokens) == 60 and len(calls) == 60  # no model call after the last token


@pytest.mark.parametrize("stop", [UNUSED_STOP, FILL])
def test_other_stop_ids_are_not_masked_below_min_len(rule, stop):
    # upstream HEAD: only 6561 is masked, so 6562 / 6563 end the utterance even at step 0
    next_logp, calls = _scripted(stop)
    assert list(decode_speech_tokens(next_logp, 8, rule, SamplingConfig(),
                                     np.random.default_rng(0))) == []
    assert calls == [None]


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice2"), ids=lambda p: p.name)
def test_golden_sampled_length_obeys_the_rule(model_dir):
    torch = pytest.importorskip("torch")
    g = torch.load(model_dir / "golden.pt", weights_only=False)["llm"]
    rule = decoding_rule(read_cosyvoice2_config(model_dir).llm)
    min_len, max_len = rule.length_limits(g["text_token"].shape[1])
    tokens = list(g["sampled_tokens"])
    assert len(tokens) == g["sampled_tokens_len"]
    assert min_len <= len(tokens) <= max_len
    assert not set(tokens) & rule.stop_token_ids


def test_our_model_and_sampler_obey_the_rule(rule):
    torch = pytest.importorskip("torch")
    from cosyvino.families.cosyvoice2.torch.llm import load_cosyvoice2_lm

    g = torch.load(TINY_C / "golden.pt", weights_only=False)["llm"]
    lm = load_cosyvoice2_lm(TINY_C)
    state = {"cache": lm.empty_cache()}

    @torch.no_grad()
    def next_logp(previous):
        x = lm.lm_input(g["text_token"]) if previous is None else lm.embed_speech(
            torch.tensor([[previous]]))
        logp, *state["cache"] = lm(x, *state["cache"])
        return logp[0].numpy()

    n = g["text_token"].shape[1]
    tokens = list(decode_speech_tokens(next_logp, n, rule, lm.cfg.sampling,
                                       np.random.default_rng(0)))
    min_len, max_len = rule.length_limits(n)
    assert min_len <= len(tokens) <= max_len
    assert all(0 <= t < EOS for t in tokens)
