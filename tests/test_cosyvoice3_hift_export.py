"""torch.export of the CosyVoice3 vocoder stages with a dynamic frame count (the non-final mode,
whose look-ahead slicing is the harder one for the exporter); the exported graphs equal eager on
a length other than the example's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_E
from torch.export import Dim, export

from cosyvino.families.cosyvoice3.torch.hift import load_hift


def test_stages_export_with_dynamic_length():
    hift = load_hift(TINY_E)
    mel = torch.load(TINY_E / "golden.pt", weights_only=False)["hift"]["mel"]
    table = torch.rand(1, 480 * 200, 9, generator=torch.Generator().manual_seed(0))
    t = Dim("T", min=12, max=4000)
    f0_ep = export(hift.f0_stage(False), (mel[:, :, :60].clone(),), dynamic_shapes=({2: t},))
    f0 = hift.f0_stage(False)(mel[:, :, :60].clone())
    tf = Dim("Tf", min=9, max=4000)
    src_ep = export(hift.source_stage(), (f0, table[:, :480 * 57].clone()),
                    dynamic_shapes=({1: tf}, {1: 480 * tf}))
    src = hift.source_stage()(f0, table[:, :480 * 57].clone())
    tb = Dim("Tb", min=9, max=4000)
    dec_ep = export(hift.decode_stage(False), (mel[:, :, :57].clone(), src),
                    dynamic_shapes=({2: tb}, {2: 480 * tb}))
    # another length through the exported graphs
    m = mel.clone()
    f0_b = f0_ep.module()(m)
    torch.testing.assert_close(f0_b, hift.f0_stage(False)(m), rtol=0, atol=0)
    noise = table[:, :480 * f0_b.shape[-1]].clone()
    src_b = src_ep.module()(f0_b, noise)
    torch.testing.assert_close(src_b, hift.source_stage()(f0_b, noise), rtol=0, atol=0)
    body = m[:, :, :-3].clone()
    wav = dec_ep.module()(body, src_b)
    assert wav.shape[-1] == 480 * (m.shape[-1] - 8)
    torch.testing.assert_close(wav, hift.decode_stage(False)(body, src_b), rtol=0, atol=1e-5)
