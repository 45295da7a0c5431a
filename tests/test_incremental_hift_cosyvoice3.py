"""The incremental CosyVoice3 vocoder (issue 36) against the official re-run stream.

The reference is :class:`VocoderRerunStream` over :meth:`CausalHiFTGenerator.inference` (upstream's
``token2wav``: re-vocode all mel so far, cut what was emitted), itself checked against the tiny-e
goldens in test_parity_cosyvoice3_hift.py / test_official_stream_cosyvoice3.py. Equal lengths per
hop; samples within 1e-3 (float32 convolution rounding differs with the input length and tiny-e's
random weights amplify it, as for a non-final run vs a longer final one).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_E

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice3.hift_config import CausalHiFTConfig
from cosyvino.families.cosyvoice3.official_stream import VocoderRerunStream
from cosyvino.families.cosyvoice3.torch.hift import load_hift
from cosyvino.families.cosyvoice3.torch.incremental_hift import (
    F0_LEFT_FRAMES,
    IncrementalCausalHiFT,
    decode_left_context_frames,
)

SPLITS = {"official_like": [0, 50, 100, 120], "small_hops": [0, 12, 20, 31, 45, 60, 90, 120],
          "one_shot": [0, 120]}


@functools.cache
def _setup():
    golden = torch.load(TINY_E / "golden.pt", weights_only=False)["hift"]
    return load_hift(TINY_E), golden["mel"].numpy(), golden["sine_waves_head"]


def _run(stream, mel, cuts):
    return [stream.hop(mel[:, :, a:b], finalize=(b == cuts[-1]))
            for a, b in itertools.pairwise(cuts)]


@functools.cache
def _rerun(split: str):
    hift, mel, table = _setup()
    stream = VocoderRerunStream(
        lambda m, fin: hift.inference(torch.from_numpy(m), table, fin)[0].numpy())
    return _run(stream, mel, SPLITS[split])


@pytest.mark.parametrize("split", list(SPLITS))
def test_incremental_equals_rerun(split):
    hift, mel, table = _setup()
    inc = IncrementalCausalHiFT(hift, table)
    got = _run(inc, mel, SPLITS[split])
    want = _rerun(split)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-3)
    # bounded work: each decode window is the new frames plus at most the context (and the
    # 3 f0 look-ahead frames), each f0 window the new frames plus F0_LEFT_FRAMES + 3
    cuts = SPLITS[split]
    for (f0_win, dec_win), a, b in zip(inc.windows, cuts, cuts[1:]):
        assert dec_win <= (b - a) + inc.context + 8
        assert f0_win <= (b - a) + F0_LEFT_FRAMES + 3 + 8
    assert inc.mel.shape[-1] <= inc.context + F0_LEFT_FRAMES


def test_context_frames_cover_the_receptive_field():
    """The computed reach (29 frames + 1 of margin at v3's layer sizes) keeps parity; a window
    far short of it does not (so the parity test above can see a wrong window)."""
    assert decode_left_context_frames(CausalHiFTConfig()) == 30
    hift, mel, table = _setup()
    short = _run(IncrementalCausalHiFT(hift, table, context_frames=14), mel,
                 SPLITS["official_like"])
    worst = max(np.abs(g - w).max() for g, w in zip(short, _rerun("official_like")))
    assert worst > 0.1


def test_incremental_input_errors():
    hift, mel, table = _setup()
    inc = IncrementalCausalHiFT(hift, table)
    with pytest.raises(InputError, match="frames > 0"):
        inc.hop(mel[:, :, :0], False)
    with pytest.raises(InputError, match=r"\[1, 80"):
        inc.hop(mel[0], False)
    assert inc.hop(mel[:, :, :5], False).shape == (0,)  # all 5 frames are held back
    inc.hop(mel[:, :, 5:20], True)
    with pytest.raises(InputError, match="finalized"):
        inc.hop(mel[:, :, 20:30], True)
    short = IncrementalCausalHiFT(hift, table[:, :480 * 10])
    with pytest.raises(InputError, match="noise table"):
        short.hop(mel[:, :, :20], True)
