"""Chunked vocoder decode (cosyvino.families.cosyvoice1.pipeline.vocoder_chunks): the windows tile the segment, and
a chunked decode gives the samples of one whole decode, for the tiny fixture and for the full
CosyVoice-300M HiFT configuration (random weights: the receptive field depends only on it)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_A  # noqa: E402

import cosyvino.families.cosyvoice1.pipeline as pipeline_module  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.families.cosyvoice1.presets import full_300m  # noqa: E402
from cosyvino.families.cosyvoice1.torch.hift import HiFTGenerator  # noqa: E402
from cosyvino.families.cosyvoice1.pipeline import (  # noqa: E402
    Pipeline,
    vocoder_chunks,
)


def test_windows_tile_the_segment_with_context():
    assert vocoder_chunks(100, 256) == [(0, 0, 100, 100)]
    assert vocoder_chunks(100, None) == [(0, 0, 100, 100)]
    assert vocoder_chunks(288, 256, context=16) == [(0, 0, 288, 288)]  # a part + its context
    # 430 frames: two parts of 215, windows 215 + 2 x 16 -> 256 frames
    assert vocoder_chunks(430, 256, context=16) == [(0, 0, 240, 256), (174, 240, 430, 430)]
    for n, chunk, step in ((1000, 256, 32), (300, 256, 32), (13, 2, 1), (999, 100, 32),
                           (5000, 64, 32), (861, 256, 32)):
        w = vocoder_chunks(n, chunk, context=5, step=step)
        kept = [(a, b) for _, a, b, _ in w]
        assert len(w) > 1
        assert kept[0][0] == 0 and kept[-1][1] == n
        assert all(b1 == a2 for (_, b1), (a2, _) in zip(kept, kept[1:]))
        widths = {hi - lo for lo, _, _, hi in w}
        assert len(widths) == 1 and widths.pop() % step == 0  # one input shape per segment
        for lo, a, b, hi in w:
            assert 0 <= lo and hi <= n
            assert a - lo >= 5 or lo == 0
            assert hi - b >= 5 or hi == n
    # segments of many lengths share a few window lengths (backend input shapes)
    shapes = {hi - lo for n in range(300, 3000, 7) for lo, _, _, hi in vocoder_chunks(n, 256)}
    assert shapes <= {192, 224, 256, 288}


class _DecodeOnly:
    """The vocoder stages of a torch HiFT, counting decode calls and their lengths."""

    def __init__(self, hift: HiFTGenerator, config):
        self.config = config
        self._decode = hift.decode_stage().eval()
        self.calls: list[int] = []

    def llm_special_embeddings(self):
        return None, None

    def vocoder_decode(self, mel, source):
        self.calls.append(mel.shape[-1])
        with torch.no_grad():
            return self._decode(torch.from_numpy(mel), torch.from_numpy(source)).numpy()


class _Config:
    def __init__(self, hift):
        self.hift = hift


def _inputs(hift_cfg, frames: int, seed: int = 0):
    torch.manual_seed(seed)
    stages = _DecodeOnly(HiFTGenerator(hift_cfg).eval(), _Config(hift_cfg))
    rng = np.random.default_rng(seed)
    mel = rng.standard_normal((1, 80, frames)).astype(np.float32) - 4.0
    source = (0.1 * rng.standard_normal((1, 1, hift_cfg.hop_length * frames))).astype(np.float32)
    return stages, mel, source


def _chunked_vs_whole(hift_cfg, frames: int, chunk: int):
    stages, mel, source = _inputs(hift_cfg, frames)
    whole = Pipeline(stages, vocoder_chunk_frames=None).mel_to_wav(mel, source=source)
    chunked = Pipeline(stages, vocoder_chunk_frames=chunk).mel_to_wav(mel, source=source)
    return whole, chunked, stages.calls


@pytest.mark.parametrize("frames,chunk", [(200, 40), (150, 60)])
def test_chunked_decode_equals_whole_tiny(frames, chunk):
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    cfg = read_model_config(TINY_A / "cosyvoice.yaml").hift
    whole, chunked, calls = _chunked_vs_whole(cfg, frames, chunk)
    assert chunked.shape == whole.shape == (cfg.hop_length * frames,)
    assert len(calls) > 2 and len(set(calls[1:])) == 1 and calls[1] < frames
    np.testing.assert_allclose(chunked, whole, atol=1e-5, rtol=0)


def test_chunked_decode_equals_whole_300m_config(monkeypatch):
    cfg = full_300m().hift
    whole, chunked, calls = _chunked_vs_whole(cfg, 100, 34)
    assert calls[1:] == [96, 96]  # parts of 34 + 2 x 16 -> 66 -> 96 frames: kept [0, 80), [80, 100)
    assert np.abs(whole).max() > 1e-3  # a real signal, not an all-zero comparison
    np.testing.assert_allclose(chunked, whole, atol=1e-5, rtol=0)
    # the context is what makes it exact: the same windows without context differ at the seams
    monkeypatch.setattr(pipeline_module, "vocoder_chunks",
                        lambda n, c: [(a, a, b, b) for _, a, b, _ in vocoder_chunks(n, c)])
    stages, mel, source = _inputs(cfg, 100)
    seams = Pipeline(stages, vocoder_chunk_frames=34).mel_to_wav(mel, source=source)
    assert np.abs(seams - whole).max() > 1e-3


def test_bad_chunk_and_source_length_are_typed_errors():
    stages, _, _ = _inputs(read_tiny_hift(), 10)
    with pytest.raises(InputError):
        Pipeline(stages, vocoder_chunk_frames=0)
    mel = np.zeros((1, 80, 10), np.float32)
    with pytest.raises(InputError, match="source"):
        Pipeline(stages).mel_to_wav(mel, source=np.zeros((1, 1, 7), np.float32))


def read_tiny_hift():
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    return read_model_config(TINY_A / "cosyvoice.yaml").hift
