"""The CosyVoice2 flow's torch stages export with a dynamic length (what a converter will
trace): ``torch.export`` of the estimator in both attention modes with a dynamic frame count,
and of the encoder (non-final streaming call, look-ahead tokens as their own input) with a
dynamic token count; the exported programs equal eager at another length."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
from conftest import TINY_C
from torch.export import Dim, export

from cosyvino.families.cosyvoice2.torch.flow_loading import load_flow


@functools.cache
def _flow():
    return load_flow(TINY_C)


class _Estimator(torch.nn.Module):
    def __init__(self, est, streaming: bool):
        super().__init__()
        self.est, self.streaming = est, streaming

    def forward(self, x, mask, mu, t, spks, cond):
        return self.est(x, mask, mu, t, spks, cond, streaming=self.streaming)


def _estimator_args(frames: int, gen: torch.Generator):
    cfg = _flow().cfg
    c = cfg.output_size

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return (r(2, c, frames), torch.ones(2, 1, frames), r(2, c, frames),
            torch.rand(2, generator=gen), r(2, c), r(2, c, frames))


@pytest.mark.parametrize("streaming", [False, True], ids=["full", "chunk"])
def test_estimator_exports_with_dynamic_frames(streaming):
    gen = torch.Generator().manual_seed(1)
    model = _Estimator(_flow().decoder.estimator, streaming)
    frames = Dim("T", min=4, max=3000)
    dyn = {"x": {2: frames}, "mask": {2: frames}, "mu": {2: frames}, "t": None, "spks": None,
           "cond": {2: frames}}
    ep = export(model, _estimator_args(120, gen), dynamic_shapes=dyn)
    other = _estimator_args(77, gen)
    with torch.inference_mode():
        assert torch.allclose(ep.module()(*other), model(*other), atol=1e-5)


class _Encoder(torch.nn.Module):
    def __init__(self, flow):
        super().__init__()
        self.flow = flow

    def forward(self, token, context_token):
        return self.flow.encode(token, context_token, streaming=True)


def test_encoder_exports_with_dynamic_tokens():
    flow = _flow()
    gen = torch.Generator().manual_seed(2)
    k, vocab = flow.cfg.pre_lookahead_len, flow.cfg.vocab_size
    model = _Encoder(flow)
    ep = export(model, (torch.randint(0, vocab, (1, 57), generator=gen),
                        torch.randint(0, vocab, (1, k), generator=gen)),
                dynamic_shapes={"token": {1: Dim("L", min=2, max=4000)}, "context_token": None})
    tok = torch.randint(0, vocab, (1, 41 + k), generator=gen)
    with torch.inference_mode():
        assert torch.allclose(ep.module()(tok[:, :-k], tok[:, -k:]),
                              model(tok[:, :-k], tok[:, -k:]), atol=1e-5)
