"""The official CosyVoice3 streaming vocoder logic (re-run over all mel so far, cut what was
emitted) against tests/fixtures/tiny-e/stream.pt, as far as it goes without the v3 flow.

stream.pt holds, per chunk of upstream's ``tts(stream=True)`` over 230 tokens (and 180 with a
20-token flow prompt): ``token_offset``, ``n_tokens`` given to the flow, ``finalize``,
``streaming`` and the ``speech`` emitted. Without the flow there is no per-chunk mel, so this file
checks the schedule, the emitted lengths and the re-run/cut logic on the golden hift mel; speech
parity per chunk (the v3 flow per chunk feeding the re-run vocoder) is
tests/test_cosyvoice3_family.py::test_official_streaming_matches_stream_golden.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from conftest import golden_dirs_of

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice3.official_stream import (
    StreamConstants,
    VocoderRerunStream,
    emitted_samples,
    hop_schedule,
    utterance_frames,
)

torch = pytest.importorskip("torch")

GOLDEN_DIRS = golden_dirs_of("cosyvoice3")


@pytest.fixture(params=GOLDEN_DIRS, ids=[d.name for d in GOLDEN_DIRS])
def golden_dir(request):
    return request.param


@functools.cache
def _stream(model_dir):
    path = model_dir / "stream.pt"
    if not path.is_file():
        pytest.skip(f"{model_dir} has no stream.pt")
    return torch.load(path, map_location="cpu", weights_only=False)


def _cases(stream: dict):
    yield "plain", stream["speech_tokens"].numel(), 0, stream["chunks"]
    if "prompt" in stream:
        p = stream["prompt"]
        yield "prompt", p["speech_tokens"].numel(), p["prompt_speech_token"].shape[1], p["chunks"]


def test_schedule_matches_stream_pt(golden_dir):
    stream = _stream(golden_dir)
    constants = StreamConstants.from_mapping(stream["constants"])
    for name, n_tokens, n_prompt, chunks in _cases(stream):
        calls = hop_schedule(n_tokens, n_prompt, constants)
        got = [(c.token_offset, c.n_tokens, c.finalize, c.streaming) for c in calls]
        want = [(c["token_offset"], c["n_tokens"], c["finalize"], c["streaming"]) for c in chunks]
        assert got == want, name


def test_emitted_lengths_match_stream_pt(golden_dir):
    """A non-final chunk over M accumulated frames has emitted 480 (M − 8) samples in all; the
    final one the rest, 480 × all frames (sheet §7)."""
    stream = _stream(golden_dir)
    constants = StreamConstants.from_mapping(stream["constants"])
    for name, n_tokens, n_prompt, chunks in _cases(stream):
        calls = hop_schedule(n_tokens, n_prompt, constants)
        got = emitted_samples(calls, constants.token_mel_ratio)
        assert got == [c["speech"].shape[-1] for c in chunks], name
        assert sum(got) == 480 * constants.token_mel_ratio * n_tokens
        assert utterance_frames(calls)[-1] == 2 * n_tokens


def test_emitted_lengths_example_of_the_sheet():
    # sheet §7, P = 10: 40 tokens -> 80 frames -> 34 560 samples; +100 frames -> 48 000
    calls = hop_schedule(200, 10)
    assert [c.n_tokens for c in calls[:2]] == [43, 93]
    assert emitted_samples(calls)[:2] == [480 * 72, 480 * 100]


def _golden_vocoder(model_dir):
    from cosyvino.families.cosyvoice3.fixed_tables import (
        make_fixed_tables,
        read_table_recipe,
    )
    from cosyvino.families.cosyvoice3.torch.hift import load_hift

    hift = load_hift(model_dir)
    table = make_fixed_tables(read_table_recipe(model_dir)).sine_waves
    calls = []

    def vocoder(mel: np.ndarray, finalize: bool) -> np.ndarray:
        calls.append((mel.shape[-1], finalize))
        wav, _ = hift.inference(torch.from_numpy(mel), table, finalize)
        return wav.numpy()

    return vocoder, calls


def test_rerun_stream_on_the_golden_mel(golden_dir):
    """Chunks of the golden hift mel through the re-run stream: each call re-vocodes everything
    so far, the lengths follow the rule, and the concatenation is the one-shot final run (equal
    up to float32 convolution rounding, see test_parity_cosyvoice3_hift)."""
    mel = torch.load(golden_dir / "golden.pt", weights_only=False)["hift"]["mel"].numpy()
    vocoder, calls = _golden_vocoder(golden_dir)
    stream = VocoderRerunStream(vocoder)
    cuts = [0, 50, 100, mel.shape[-1]]
    pieces = [stream.hop(mel[:, :, a:b], finalize=(b == mel.shape[-1]))
              for a, b in itertools.pairwise(cuts)]
    assert [p.shape[0] for p in pieces] == [480 * 42, 480 * 50, 480 * (mel.shape[-1] - 92)]
    assert calls == [(50, False), (100, False), (mel.shape[-1], True)]
    whole = vocoder(mel, True)[0]
    out = np.concatenate(pieces)
    assert out.shape == whole.shape
    np.testing.assert_allclose(out, whole, rtol=0, atol=1e-3)
    with pytest.raises(InputError, match="finalized"):
        stream.hop(mel[:, :, :5], True)


def test_rerun_stream_input_errors():
    stream = VocoderRerunStream(lambda mel, fin: np.zeros((1, 480 * mel.shape[-1]), np.float32))
    with pytest.raises(InputError, match="frames > 0"):
        stream.hop(np.zeros((1, 80, 0), np.float32), False)
    with pytest.raises(InputError, match=r"\[1, n_mels"):
        stream.hop(np.zeros((80, 10), np.float32), False)
    stream.hop(np.zeros((1, 80, 10), np.float32), False)
    with pytest.raises(InputError, match="bins"):
        stream.hop(np.zeros((1, 40, 10), np.float32), False)
