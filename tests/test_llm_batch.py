"""Batched LLM decode (issue 17, stage level): rows of different cache lengths decoded together
in one backend call give each row's unbatched logp (fp32 <= 1e-4) and, with RAS sampling and a
fixed seed, the same tokens; rows join and leave between steps; a batch of one equals the
session; the per-session loop (a backend that cannot batch) gives the same rows. Every
built-in backend (torch, OpenVINO, ONNX Runtime) on the golden tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_A
from cosyvino.engine.draws import RandomDraws
from cosyvino.errors import BackendError
from cosyvino.families.cosyvoice1.pipeline import Pipeline
from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages, LLMBatch, LoopLLMBatch
from cosyvino.plugins import get_backend

ATOL = 1e-4
GOLDEN = np.load(TINY_A / "goldens.npz")
#: teacher-forced speech tokens per row (each row its own sequence)
TOKENS = [GOLDEN["llm/forced_speech_tokens"].tolist()[:12],
          GOLDEN["llm/forced_speech_tokens"].tolist()[::-1][:12],
          [(7 * i + 3) % 50 for i in range(12)]]
#: prefill lengths of the rows: all different, so the batch is left-padded
PREFIX = [20, 13, 6]


@pytest.fixture(scope="module",
                params=["torch", "openvino", "onnxruntime", "onnxruntime-io_binding"])
def stages(request, converted_dir, onnx_dir):
    name = request.param
    if name == "torch":
        d, opts = str(TINY_A), {}
    elif name == "openvino":
        pytest.importorskip("openvino")
        d, opts = converted_dir(TINY_A), {"precision": "f32", "kv_cache_precision": "f32"}
    else:
        pytest.importorskip("onnxruntime")
        d, opts = onnx_dir(TINY_A), {"io_binding": name.endswith("io_binding")}
        name = "onnxruntime"
    s = get_backend(name).load(d, num_threads=1, **opts)
    yield s
    s.close()


def _prefix(r: int) -> np.ndarray:
    return np.ascontiguousarray(GOLDEN["llm/lm_input"][:, GOLDEN["llm/lm_input"].shape[1]
                                                       - PREFIX[r]:])


def _emb(stages, tokens) -> np.ndarray:
    return stages.embed_speech_tokens(np.asarray(tokens, np.int64).reshape(-1, 1))


def _alone(stages, r: int, steps: int) -> np.ndarray:
    """[steps + 1, V+1]: row r's prefill logp, then one per teacher-forced token."""
    s = stages.new_llm_session()
    rows = [s.forward(_prefix(r))]
    for tok in TOKENS[r][:steps]:
        rows.append(s.forward(_emb(stages, [tok])))
    s.close()
    return np.stack(rows)


def _prefilled(stages, r: int):
    s = stages.new_llm_session()
    return s, s.forward(_prefix(r))


def _check(got, want, what):
    err = float(np.max(np.abs(got - want)))
    assert err <= ATOL, f"{what}: max abs logp error {err:.2e}"
    assert np.argmax(got) == np.argmax(want), what


@pytest.mark.parametrize("loop", [False, True], ids=["batched", "loop"])
def test_rows_join_and_leave_between_steps(stages, loop):
    """Rows 0 and 1 start together; row 2 joins after 3 steps; row 0 leaves after 6, row 1
    after 9; row 2 runs alone at the end. Every row's logp per step equals its own session's."""
    assert stages.max_llm_batch > 1
    alone = [_alone(stages, r, 12) for r in range(3)]
    batch = CosyVoice1Stages.new_llm_batch(stages) if loop else stages.new_llm_batch()
    assert isinstance(batch, LoopLLMBatch if loop else LLMBatch)
    sessions, ids, done = {}, {}, {0: 0, 1: 0, 2: 0}  # row -> steps done

    def join(r):
        s, logp = _prefilled(stages, r)
        _check(logp, alone[r][0], f"row {r} prefill")
        sessions[r] = s
        ids[r] = batch.add(s)
        assert batch.cache_length(ids[r]) == PREFIX[r]

    join(0)
    join(1)
    for step in range(12):
        if step == 3:
            join(2)
        if step == 6:
            batch.remove(ids.pop(0))
        if step == 9:
            batch.remove(ids.pop(1))
        order = {row: r for r, row in ids.items()}
        rows = [order[row] for row in batch.rows]
        x = np.concatenate([_emb(stages, [TOKENS[r][done[r]]]) for r in rows])
        out = batch.step(x)
        assert out.shape == (len(rows), alone[0].shape[1]) and out.dtype == np.float32
        for b, r in enumerate(rows):
            done[r] += 1
            _check(out[b], alone[r][done[r]], f"row {r} step {done[r]} (batch of {len(rows)})")
            assert batch.cache_length(ids[r]) == PREFIX[r] + done[r]
    assert done == {0: 6, 1: 9, 2: 9}
    batch.close()
    assert len(batch) == 0
    # a removed row's session is empty and usable again
    again = sessions[0]
    np.testing.assert_allclose(again.forward(_prefix(1)), alone[1][0], atol=ATOL)


def test_batch_of_one_equals_the_session(stages):
    alone = _alone(stages, 1, 8)
    s, _ = _prefilled(stages, 1)
    batch = stages.new_llm_batch()
    row = batch.add(s)
    for i, tok in enumerate(TOKENS[1][:8]):
        out = batch.step(_emb(stages, [tok]))
        assert out.shape == (1, alone.shape[1])
        _check(out[0], alone[i + 1], f"step {i + 1}")
    batch.remove(row)
    assert batch.rows == ()


def _sample_alone(stages, pipe, r: int, seed: int, n: int) -> list[int]:
    draws = RandomDraws(seed)
    s, logp = _prefilled(stages, r)
    tokens: list[int] = []
    for i in range(n):
        tokens.append(pipe.sample_token(logp, tokens, draws.sampling(0, i), n))
        logp = s.forward(_emb(stages, [tokens[-1]]))
    s.close()
    return tokens


def test_ras_sampled_tokens_equal_alone_and_batched(stages):
    """Same seed -> same speech tokens with the project's RAS sampling, alone or batched with
    rows of other lengths (EOS masked so every row runs n steps)."""
    pipe = Pipeline(stages)
    n, seeds = 16, [11, 12, 13]
    want = [_sample_alone(stages, pipe, r, seeds[r], n) for r in range(3)]
    batch = stages.new_llm_batch()
    logps, draws, got = [], [RandomDraws(sd) for sd in seeds], [[], [], []]
    for r in range(3):
        s, logp = _prefilled(stages, r)
        batch.add(s)
        logps.append(logp)
    for i in range(n):
        for r in range(3):
            got[r].append(pipe.sample_token(logps[r], got[r], draws[r].sampling(0, i), n))
        out = batch.step(np.concatenate([_emb(stages, [got[r][-1]]) for r in range(3)]))
        logps = list(out)
    batch.close()
    assert got == want
    assert len({tuple(t) for t in got}) == 3  # the rows really differ


def test_bad_batch_use_raises(stages):
    batch = stages.new_llm_batch()
    with pytest.raises(BackendError):
        batch.step(np.zeros((1, 1, _prefix(0).shape[2]), np.float32))  # no rows
    with pytest.raises(BackendError):
        batch.add(stages.new_llm_session())  # nothing prefilled
    s, _ = _prefilled(stages, 2)
    row = batch.add(s)
    with pytest.raises(BackendError):
        batch.add(s)  # already a row
    with pytest.raises(BackendError):
        batch.step(np.zeros((2, 1, _prefix(0).shape[2]), np.float32))  # 1 row, 2 inputs
    with pytest.raises(BackendError):
        batch.remove(row + 1)
    batch.remove(row)
    assert s.cache_length() == 0
