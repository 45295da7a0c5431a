"""The fixed CFM noise of CosyVoice2/3: the table this project makes equals the one the
official full-size construction leaves (reference ``cosyvoice23-fixed-buffers.pt``:
``cfm_noise_head`` [1,80,4096], shape, sum; the fixture keeps the shape, the float64 sums of the
whole table and of the head, and the head's first and last 32 columns)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice23.cfm import solve_fixed_noise
from cosyvino.families.cosyvoice23.fixed_noise import (
    CFM_NOISE_SHAPE,
    make_cfm_noise_table,
    noise_columns,
)

torch = pytest.importorskip("torch")

REF = np.load(FIXTURES / "cosyvoice2-cfm-noise.npz")


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return make_cfm_noise_table()


def test_table_equals_official(table):
    assert table.dtype == np.float32
    assert table.shape == tuple(REF["shape"]) == CFM_NOISE_SHAPE
    head = int(REF["head_len"])
    np.testing.assert_array_equal(table[:, :, :32], REF["head_first"])
    np.testing.assert_array_equal(table[:, :, head - 32:head], REF["head_last"])
    assert table[:, :, :head].astype(np.float64).sum() == pytest.approx(float(REF["head_sum"]),
                                                                         abs=1e-6)
    assert table.astype(np.float64).sum() == pytest.approx(float(REF["sum"]), abs=1e-6)
    # sheet v2 §5.4's first values
    np.testing.assert_allclose(table[0, 0, :3], [-1.1258398, -1.1523602, -0.2505786], atol=1e-7)


def test_table_leaves_global_rng_alone(table):
    torch.manual_seed(123)
    want = torch.rand(4)
    torch.manual_seed(123)
    make_cfm_noise_table()
    assert torch.equal(torch.rand(4), want)


def test_noise_columns(table):
    z = noise_columns(table, 7)
    assert z.shape == (1, 80, 7) and z.flags.c_contiguous
    np.testing.assert_array_equal(z, table[:, :, :7])
    assert noise_columns(table, CFM_NOISE_SHAPE[2]).shape == CFM_NOISE_SHAPE
    for bad in (0, CFM_NOISE_SHAPE[2] + 1):
        with pytest.raises(InputError, match="mel frames"):
            noise_columns(table, bad)


def test_solve_starts_from_the_table_columns(table):
    """With a zero velocity the solve returns its start state: the table's first T columns."""
    t = 9
    zeros = np.zeros((1, 80, t), np.float32)

    def still(x, mask, mu, tt, spks, cond):
        assert x.shape == (2, 80, t) and tt.shape == (2,)
        return np.zeros_like(x)

    out = solve_fixed_noise(still, table, zeros, np.ones((1, 1, t), np.float32),
                            np.zeros((1, 80), np.float32), zeros)
    np.testing.assert_array_equal(out, table[:, :, :t])
    with pytest.raises(InputError):
        solve_fixed_noise(still, table[:, :, :5], zeros, np.ones((1, 1, t), np.float32),
                          np.zeros((1, 80), np.float32), zeros)
