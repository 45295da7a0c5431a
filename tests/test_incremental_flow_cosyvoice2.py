"""The incremental CosyVoice2 streaming flow (cosyvino/families/cosyvoice2/torch/incremental_flow.py)
against the official re-run on tiny-c.

The reference is the official stream's flow computation (sheet v2 §7.2-7.3) re-run here with the
parity-tested torch flow: for every call of the golden ``stream.pt`` schedule (plain, and the
prompt case: 20 prompt tokens / 40 frames), ``flow_inference`` over the prompt plus ALL tokens so
far with chunk masks (``finalize=False``), frames from ``2 * token_offset``. Every hop's new
frames must match within 1e-4. The final hop: ``official`` = upstream's full-attention re-run
(exact); ``incremental`` = the streaming computation of the same frames (matches the streaming
final re-run within 1e-4) and differs from ``official`` by the documented distance
(docs/performance.md). Also: hops off the chunk grid, the left-context cap against upstream's
``num_left_chunks`` mask, the state-size formula, and typed errors.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_C

from cosyvino.errors import ConfigError, InputError
from cosyvino.families.cosyvoice2.official_stream import hop_schedule
from cosyvino.families.cosyvoice2.presets import full_0_5b
from cosyvino.families.cosyvoice2.torch import estimator as estimator_mod
from cosyvino.families.cosyvoice2.torch import upsample_encoder as encoder_mod
from cosyvino.families.cosyvoice2.torch.flow_loading import load_flow
from cosyvino.families.cosyvoice2.torch.incremental_flow import (
    IncrementalFlow,
    commit_unit,
    state_bytes_per_second,
)
from cosyvino.families.cosyvoice23.fixed_noise import make_cfm_noise_table
from cosyvino.families.cosyvoice23.torch.chunk_mask import (
    chunk_mask,
    chunk_window_mask,
)
from cosyvino.families.cosyvoice23.torch.flow_inference import flow_inference
from cosyvino.families.cosyvoice23.torch.kv_window import ChunkKVWindow

TOL = 1e-4
#: max / mean |incremental - official| of the final hop's log-mel on tiny-c (docs/performance.md)
FINAL_DISTANCE = {"plain": (0.1466, 0.0220), "prompt": (0.1529, 0.0269)}


@functools.cache
def _flow():
    return load_flow(TINY_C)


@functools.cache
def _noise() -> np.ndarray:
    return make_cfm_noise_table()


@functools.cache
def _stream() -> dict:
    return torch.load(TINY_C / "stream.pt", weights_only=False)


def _case(case: str) -> tuple[torch.Tensor, dict, int]:
    """(generated tokens [1, N], prompt kwargs, P) of stream.pt's case."""
    g = _stream()
    d = g if case == "plain" else g["prompt"]
    tokens = d["speech_tokens"].reshape(1, -1).long()
    if case == "plain":
        return tokens, {}, 0
    return (tokens, {"prompt_token": d["prompt_speech_token"], "prompt_feat": d["prompt_feat"]},
            int(d["prompt_speech_token"].shape[1]))


def _official(tokens, prompt, n_tokens, offset, *, streaming=True, finalize=False):
    """The official flow call's new frames: the flow over ALL tokens so far."""
    mel = flow_inference(_flow(), tokens[:, :n_tokens], _stream()["embedding"], _noise(),
                         streaming=streaming, finalize=finalize, **prompt)
    return mel[:, :, 2 * offset:]


def _err(a, b) -> float:
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("case", ["plain", "prompt"])
def test_hops_equal_the_official_rerun(case):
    tokens, prompt, p = _case(case)
    calls = hop_schedule(tokens.shape[1], p)
    golden = [(c["token_offset"], c["n_tokens"], c["finalize"])
              for c in (_stream() if case == "plain" else _stream()["prompt"])["chunks"]]
    assert [(c.token_offset, c.n_tokens, c.finalize) for c in calls] == golden
    inc = IncrementalFlow(_flow(), _noise())
    state = inc.start(_stream()["embedding"], **prompt)
    for call in calls[:-1]:
        got = inc.hop(state, tokens[:, :call.n_tokens])
        want = _official(tokens, prompt, call.n_tokens, call.token_offset)
        assert _err(got, want) < TOL, f"hop at token {call.token_offset}"
        # every state sits on the chunk boundary at the hop's end: nothing is recomputed
        assert state.committed == p + call.n_tokens - call.lookahead
        assert state.committed % commit_unit(_flow().cfg) == 0
    last = calls[-1]
    want_official = _official(tokens, prompt, last.n_tokens, last.token_offset,
                              streaming=False, finalize=True)
    want_streaming = _official(tokens, prompt, last.n_tokens, last.token_offset,
                               finalize=True)
    for final in ("official", "incremental"):
        branch = IncrementalFlow(_flow(), _noise())
        s2 = branch.start(_stream()["embedding"], **prompt)
        for call in calls[:-1]:
            branch.hop(s2, tokens[:, :call.n_tokens])
        got = branch.hop(s2, tokens, finalize=True, final=final)
        if final == "official":
            assert _err(got, want_official) < TOL
        else:
            assert _err(got, want_streaming) < TOL
            dist = np.abs(got - want_official)
            want_max, want_mean = FINAL_DISTANCE[case]
            assert abs(float(dist.max()) - want_max) < 5e-3, float(dist.max())
            assert abs(float(dist.mean()) - want_mean) < 1e-3, float(dist.mean())


def test_hops_off_the_chunk_grid_recompute_the_open_chunk():
    """Non-final hops that end inside a chunk: the state stays at the last boundary, the open
    chunk's tokens are computed again by the next hop, and every hop still equals the official
    re-run of the same call."""
    tokens, prompt, p = _case("prompt")
    inc = IncrementalFlow(_flow(), _noise())
    state = inc.start(_stream()["embedding"], **prompt)
    offset = 0
    for n in (12, 20, 41, 97):
        got = inc.hop(state, tokens[:, :n])
        assert _err(got, _official(tokens, prompt, n, offset)) < TOL, f"call over {n} tokens"
        end = p + n - 3
        assert state.committed == end // 25 * 25
        offset = n - 3
    got = inc.hop(state, tokens[:, :130], finalize=True)
    assert _err(got, _official(tokens, prompt, 130, offset, finalize=True)) < TOL


def test_left_chunks_is_upstreams_num_left_chunks(monkeypatch):
    """``left_chunks = 1`` keeps one finished chunk per layer and equals the re-run with
    upstream's ``subsequent_chunk_mask(num_left_chunks=1)`` in every attention layer."""
    tokens, prompt, p = _case("plain")
    inc = IncrementalFlow(_flow(), _noise(), left_chunks=1)
    state = inc.start(_stream()["embedding"], **prompt)
    calls = hop_schedule(tokens.shape[1], p)[:-1]
    got = [inc.hop(state, tokens[:, :c.n_tokens]) for c in calls]
    assert state.encoder.encoders.end - state.encoder.encoders.start == 25
    assert state.encoder.up_encoders.end - state.encoder.up_encoders.start == 50
    assert all(s.window.end - s.window.start == 50 for s in state.steps)

    def left_masked(length, chunk, device=None):
        return chunk_window_mask(0, length, 0, length, chunk, 1, device)

    monkeypatch.setattr(encoder_mod, "chunk_mask", left_masked)
    monkeypatch.setattr(estimator_mod, "chunk_mask", left_masked)
    for call, mel in zip(calls, got):
        assert _err(mel, _official(tokens, prompt, call.n_tokens, call.token_offset)) < TOL
    # the cap matters from the third chunk on (otherwise this test proves nothing)
    monkeypatch.undo()
    assert _err(got[-1], _official(tokens, prompt, calls[-1].n_tokens,
                                   calls[-1].token_offset)) > 1e-3


def test_state_size_formula():
    """The state holds what :func:`state_bytes_per_second` says per second of committed audio
    (plus the few conv frames), and the 0.5b figure of the module docstring."""
    tokens, _, _ = _case("plain")
    inc = IncrementalFlow(_flow(), _noise(), n_timesteps=3)
    state = inc.start(_stream()["embedding"])
    inc.hop(state, tokens[:, :78])  # commits 75 tokens = 3 s
    kv = (state.encoder.encoders.nbytes() + state.encoder.up_encoders.nbytes()
          + sum(s.window.nbytes() for s in state.steps))
    assert kv == state_bytes_per_second(_flow().cfg, 3) * 3
    assert state.nbytes() > kv
    assert state_bytes_per_second(full_0_5b().flow) == 230_809_600


def test_chunk_window_mask():
    full = chunk_mask(130, 25)
    assert torch.equal(chunk_window_mask(50, 40, 0, 90, 25), full[50:90, :90])
    m = chunk_window_mask(50, 30, 25, 55, 25, left_chunks=1)  # queries 50..79, keys 25..79
    i, j = torch.arange(50, 80)[:, None], torch.arange(25, 80)[None, :]
    want = (j < (i // 25 + 1) * 25) & (j >= (i // 25 - 1) * 25)
    assert torch.equal(m, want)
    with pytest.raises(ValueError):
        chunk_window_mask(0, 4, 0, 4, 0)
    w = ChunkKVWindow(1, 1, 2, 4, 25)
    with pytest.raises(ValueError, match="multiple"):
        w.advance(30)


def test_errors():
    tokens, prompt, _ = _case("prompt")
    inc = IncrementalFlow(_flow(), _noise())
    emb = _stream()["embedding"]
    with pytest.raises(InputError, match="embedding"):
        inc.start(emb[:, :5])
    with pytest.raises(InputError, match="together"):
        inc.start(emb, prompt_token=prompt["prompt_token"])
    with pytest.raises(InputError, match="prompt_feat"):
        inc.start(emb, prompt_token=prompt["prompt_token"],
                  prompt_feat=prompt["prompt_feat"][:, :7])
    with pytest.raises(InputError, match="left_chunks"):
        IncrementalFlow(_flow(), _noise(), left_chunks=-1)
    state = inc.start(emb, **prompt)
    with pytest.raises(InputError, match="final must be"):
        inc.hop(state, tokens[:, :40], finalize=True, final="fast")
    with pytest.raises(InputError, match="vocabulary"):
        inc.hop(state, torch.full((1, 40), 10**6))
    inc.hop(state, tokens[:, :33])
    changed = tokens[:, :83].clone()
    changed[0, 31] = (changed[0, 31] + 1) % 6561  # a look-ahead token of the previous call
    with pytest.raises(InputError, match="extend"):
        inc.hop(state, changed)
    with pytest.raises(InputError, match="no new frames"):
        inc.hop(state, tokens[:, :33])
    inc.hop(state, tokens[:, :50], finalize=True)
    with pytest.raises(InputError, match="already"):
        inc.hop(state, tokens[:, :60], finalize=True)
    with pytest.raises(InputError, match="mel frames"):  # past the 15000-frame noise table
        inc.hop(inc.start(emb), torch.zeros(1, 7600, dtype=torch.long), finalize=True)


def test_config_without_chunk_masks_is_rejected():
    import dataclasses

    cfg = _flow().cfg
    no_chunks = dataclasses.replace(
        cfg, encoder=dataclasses.replace(cfg.encoder, static_chunk_size=0))
    with pytest.raises(ConfigError, match="chunk"):
        commit_unit(no_chunks)
