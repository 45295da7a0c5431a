"""The LLM's positional keys on the host (cosyvino.families.cosyvoice1.positional): the numpy
sinusoid equals the torch table, a window equals ``linear_pos`` of that table by head, the
tables grow both ways without changing rows already handed out, and a decode fed from them
equals the in-graph table (golden sequence of the tiny model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosyvino.families.cosyvoice1.positional import GROWTH, PositionalKeys, sinusoid_rows
from cosyvino.families.cosyvoice1.torch.transformer import rel_position_table

from conftest import TINY_A


def _maxabs(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


@pytest.mark.parametrize("first,count", [(0, 1), (9, 19), (300, 64), (-5, 3)])
def test_sinusoid_rows_equal_the_torch_table(first, count):
    got = sinusoid_rows(first, count, 32)
    want = rel_position_table(first, count, 32).numpy()
    assert got.shape == want.shape == (count, 32)
    assert _maxabs(got, want) < 1e-5


def _keys(layers=2, heads=4, dk=8, bucket=1, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((layers, heads * dk, heads * dk)).astype(np.float32)
    return w, PositionalKeys(w, heads, bucket)


def _want(w, heads, first, count):
    pe = sinusoid_rows(first, count, w.shape[1])
    dk = w.shape[1] // heads
    return [(pe @ w[i].T).reshape(count, heads, dk).transpose(1, 0, 2) for i in range(len(w))]


@pytest.mark.parametrize("bucket", [1, 16])
def test_a_window_is_linear_pos_of_its_distances_by_head(bucket):
    w, pk = _keys(bucket=bucket)
    for past, new in ((0, 7), (7, 1), (8, 1), (40, 1), (41, 3)):
        count = pk.count(past, new)
        assert count >= past + 2 * new - 1 and count % bucket == 0
        offset, tables = pk.rows(past, new)
        assert offset.dtype == np.int64 and offset.shape == (1,)
        o = int(offset[0])
        want = _want(w, 4, past + new - 1, count)
        assert len(tables) == 2
        for t, ref in zip(tables, want):
            assert t.shape[0] == 4 and t.shape[2] == 8 and t.flags.c_contiguous
            assert t.shape[1] >= o + count
            assert _maxabs(t[:, o:o + count], ref) < 1e-4


def test_growth_both_ways_keeps_rows_handed_out():
    """Growing (a long decode above, a long prefill's negative distances below, and a
    reallocation) never changes a row inside a window handed out, in the arrays handed out or
    in the new ones."""
    w, pk = _keys()
    off0, t0 = pk.rows(5, 1)
    count0 = pk.count(5, 1)
    o0 = int(off0[0])
    before = [t[:, o0:o0 + count0].copy() for t in t0]
    # beyond the top (a long decode) and below the bottom (a long prefill's negative distances)
    pk.rows(5 + 3 * GROWTH, 1)
    off2, t2 = pk.rows(0, 2 * GROWTH)
    for a, b in zip(t0, before):
        assert np.array_equal(a[:, o0:o0 + count0], b)  # the window given out is unchanged
    o = int(off2[0])
    count = pk.count(0, 2 * GROWTH)
    for t, ref in zip(t2, _want(w, 4, 2 * GROWTH - 1, count)):
        assert _maxabs(t[:, o:o + count], ref) < 1e-3
    # the earlier window is still where the new tables say it is, with the same values
    o5, t5 = pk.rows(5, 1)
    for t, ref in zip(t5, before):
        assert np.array_equal(t[:, int(o5[0]):int(o5[0]) + count0], ref)


def test_growth_within_capacity_writes_in_place_and_projects_only_new_distances():
    """Once the tables have room, an extension adds the new distances to the same arrays (no
    copy of the tables) and projects only those; every window still equals the definition."""
    w, pk = _keys()
    _, t0 = pk.rows(0, 3)
    projected = []
    real = pk._project_into
    pk._project_into = lambda tables, anchor, first, count: (projected.append(count),
                                                             real(tables, anchor, first, count))
    p = 3
    while pk.rows(p, 1)[1][0] is t0[0]:  # decode until the tables must be reallocated
        off, tabs = pk.rows(p, 1)
        o, count = int(off[0]), pk.count(p, 1)
        for t, ref in zip(tabs, _want(w, 4, p, count)):
            assert _maxabs(t[:, o:o + count], ref) < 1e-3
        p += 1
    assert p > 2 * GROWTH  # the first tables had room for more than one extension
    assert projected and set(projected[:-1]) == {GROWTH}  # only new distances, GROWTH at a time


def test_bad_arguments_are_value_errors():
    w, pk = _keys()
    with pytest.raises(ValueError, match="past >= 0"):
        pk.rows(-1, 1)
    with pytest.raises(ValueError, match="new >= 1"):
        pk.rows(3, 0)
    with pytest.raises(ValueError, match="divisible"):
        PositionalKeys(w, 5)
    with pytest.raises(ValueError, match="layers, d, d"):
        PositionalKeys(w[0], 4)


@torch.no_grad()
@pytest.mark.parametrize("bucket", [1, 4])
def test_decode_from_positional_keys_equals_the_in_graph_table(bucket):
    """The tiny golden model's prefill and decode steps (across bucket boundaries) through
    ``forward_cached(pos_keys=...)`` equal the sinusoid table built in the step."""
    from cosyvino.families.cosyvoice1.torch.loading import load_torch_model

    enc = load_torch_model(TINY_A).llm.llm
    w = np.stack([layer.self_attn.linear_pos.weight.numpy() for layer in enc.encoders])
    pk = PositionalKeys(w, enc.num_heads, bucket)
    torch.manual_seed(0)
    x = torch.randn(1, 40, enc.cfg.input_size)
    ks, vs = enc.empty_cache()
    ks2, vs2 = enc.empty_cache()
    past = 0
    for start, end in ((0, 9), (9, 10), (10, 11), (11, 15), *((i, i + 1) for i in range(15, 40))):
        xs = x[:, start:end]
        want, ks, vs = enc.forward_cached(xs, ks, vs)
        offset, tables = pk.rows(past, end - start)
        got, ks2, vs2 = enc.forward_cached(xs, ks2, vs2, pos_bucket=bucket,
                                           pos_keys=[torch.from_numpy(t) for t in tables],
                                           pos_offset=torch.from_numpy(offset))
        assert got.shape == want.shape
        assert float((got - want).abs().max()) < 1e-5, (start, end)
        past = end


@pytest.mark.parametrize("t, keys, extra", [(1, 1, 0), (1, 37, 27), (1, 64, 63), (4, 9, 0),
                                            (4, 9, 50), (60, 60, 4), (5, 205, 64)])
def test_rel_shift_reads_only_the_distances_it_needs(t, keys, extra):
    """``out[..., i, j] = raw[..., i, T-1-i+j]`` whatever the table's extra (bucketed) columns:
    the exported step no longer slices them off before the pad/reshape trick."""
    import torch

    from cosyvino.families.cosyvoice1.torch.transformer import _rel_shift

    n = keys + t - 1
    raw = torch.randn(2, 3, t, n + extra)
    raw[..., n:] = float("nan")  # columns that must never be read
    out = _rel_shift(raw, keys)
    assert out.shape == (2, 3, t, keys)
    i = torch.arange(t).unsqueeze(1)
    j = torch.arange(keys).unsqueeze(0)
    want = torch.gather(raw, -1, (t - 1 - i + j).expand(2, 3, t, keys))
    assert torch.equal(out, want) and not out.isnan().any()
