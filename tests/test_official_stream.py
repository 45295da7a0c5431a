"""The official v1 token-hop streaming (cosyvino/families/cosyvoice1/official_stream.py) against
the official code's ``stream.pt`` of tiny-a and of every dir in COSYVINO_GOLDEN_DIRS (comma or
os.pathsep separated) that has one: the token schedule, every chunk's vocoder source size and
emitted length, and — when the golden's per-chunk ``noise`` is the CFM draw [1, 80, M] — every
emitted sample within 1e-3. Plus properties that need no golden: a single final hop equals the
non-streaming pipeline, and the flow cache pins the overlap noise.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.families.cosyvoice1.official_stream import (  # noqa: E402
    OfficialTokenHopStream, StreamConstants, hop_windows, stream_mel_frames)
from cosyvino.families.cosyvoice1.length_regulation import (  # noqa: E402
    mel_frames_for_tokens)
from conftest import TINY_A, golden_dirs  # noqa: E402

WAV_ATOL = 1e-3


def _stream_dirs() -> list[pathlib.Path]:
    return [d for d in golden_dirs() if (d / "stream.pt").is_file()]


DIRS = [pytest.param(d, id=d.name) for d in _stream_dirs()]
CASES = [pytest.param(d.values[0], case, id=f"{d.id}-{case}")
         for d in DIRS for case in ("plain", "prompt")]


@functools.lru_cache(maxsize=None)
def _golden(src: pathlib.Path) -> dict:
    return torch.load(src / "stream.pt", weights_only=False)


@functools.lru_cache(maxsize=None)
def _tts(src: pathlib.Path) -> Synthesizer:
    return Synthesizer(str(src), backend="torch")


def _case(g: dict, case: str) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """(case dict with speech_tokens/chunks, prompt_token, prompt_feat)."""
    if case == "plain":
        return g, None, None
    p = g.get("prompt")
    if p is None:
        pytest.skip("this stream.pt has no 'prompt' case")
    return p, p["prompt_speech_token"].numpy(), p["prompt_feat"].numpy()


def _stream(src, case) -> tuple[OfficialTokenHopStream, dict]:
    g = _golden(src)
    c, pt, pf = _case(g, case)
    st = OfficialTokenHopStream(_tts(src).stages, g["embedding"].numpy(), prompt_token=pt,
                                prompt_feat=pf, constants=StreamConstants.from_mapping(
                                    g["constants"]))
    return st, c


def _noise_is_flow_draw(st: OfficialTokenHopStream, c: dict) -> bool:
    """Whether the golden's chunk ``noise`` entries have the CFM draw's shape [1, 80, M]."""
    return all(tuple(ch["noise"].shape) == (1, st.config.flow.output_size,
                                            st.flow_frames(len(ch["tokens"])))
               for ch in c["chunks"])


@pytest.mark.parametrize("src,case", CASES)
def test_schedule_matches_golden(src, case):
    st, c = _stream(src, case)
    tokens = c["speech_tokens"].numpy()
    windows = hop_windows(tokens.size, st.constants)
    assert len(windows) == len(c["chunks"])
    for (a, b, fin), ch in zip(windows, c["chunks"]):
        assert a == int(ch["token_start"]) and fin == bool(ch["finalize"])
        np.testing.assert_array_equal(tokens[a:b], ch["tokens"].numpy())


@pytest.mark.parametrize("src,case", CASES)
def test_chunk_lengths_and_sources(src, case):
    """Random flow noise, the golden's NSF sources: same source sizes and emitted lengths, and
    the chunks together are what the hop algorithm emits: ``stream_mel_frames`` x 256 samples.
    That is not always the whole segment's ``mel_frames_for_tokens`` x 256: every window rounds
    its frames down on its own (340 tokens in 4 hops emit 584 frames, the segment has 585)."""
    st, c = _stream(src, case)
    rng = np.random.default_rng(0)
    total = 0
    for ch in c["chunks"]:
        n_tok, fin = len(ch["tokens"]), bool(ch["finalize"])
        assert 256 * st.vocoder_frames(n_tok, fin) == ch["source"].shape[-1]
        wav = st.hop(ch["tokens"].numpy(), fin, rng=rng, source=ch["source"].numpy())
        assert wav.dtype == np.float32 and wav.shape == (ch["speech"].shape[-1],)
        assert np.all(np.isfinite(wav))
        total += wav.size
    assert total == sum(ch["speech"].shape[-1] for ch in c["chunks"])
    assert total == 256 * stream_mel_frames(len(c["speech_tokens"]), st.constants)


@pytest.mark.parametrize("src,case", CASES)
def test_golden_samples(src, case):
    """Replaying the golden's per-chunk CFM noise and NSF source reproduces every chunk."""
    st, c = _stream(src, case)
    if not _noise_is_flow_draw(st, c):
        shapes = [tuple(ch["noise"].shape) for ch in c["chunks"]]
        pytest.skip(f"{src.name}/stream.pt chunk 'noise' has shapes {shapes}, not the CFM "
                    f"draw [1, 80, M] (it is the unused NSF noise-branch draw randn_like(uv), "
                    f"one per vocoder sample); the flow noise is missing, so samples cannot be "
                    f"replayed")
    errs = []
    for ch in c["chunks"]:
        wav = st.hop(ch["tokens"].numpy(), bool(ch["finalize"]), noise=ch["noise"].numpy(),
                     source=ch["source"].numpy())
        ref = ch["speech"].numpy().reshape(-1)
        assert wav.shape == ref.shape
        errs.append(float(np.max(np.abs(wav.astype(np.float64) - ref))))
    assert max(errs) < WAV_ATOL, errs


def test_shipped_stream_golden_replays_samples():
    """The shipped tiny-a stream.pt carries the CFM draw per chunk (an earlier copy held the
    NSF noise-branch draw), so its sample-parity cases run instead of skipping."""
    for case in ("plain", "prompt"):
        st, c = _stream(TINY_A, case)
        assert len(c["chunks"]) >= 2
        assert _noise_is_flow_draw(st, c), [tuple(ch["noise"].shape) for ch in c["chunks"]]


# ---- properties (no golden samples needed) -------------------------------------------------

@pytest.mark.parametrize("case", ["plain", "prompt"])
def test_single_final_hop_equals_non_streaming(case):
    """Fewer than hop + overlap tokens: one final hop, no caches: the non-streaming path."""
    tts = _tts(TINY_A)
    st, c = _stream(TINY_A, case)
    tokens = c["speech_tokens"].numpy()[:90]
    rng = np.random.default_rng(5)
    noise = rng.standard_normal((1, 80, st.flow_frames(tokens.size)), dtype=np.float32)
    source = rng.standard_normal((1, 1, 256 * st.vocoder_frames(tokens.size, True)),
                                 dtype=np.float32) * np.float32(0.03)
    wav = st.hop(tokens, True, noise=noise, source=source)
    mel = tts.pipeline.tokens_to_mel(tokens, _golden(TINY_A)["embedding"].numpy(), noise=noise,
                                     prompt_token=st.prompt_token if st.prompt_token.size
                                     else None,
                                     prompt_feat=st.prompt_feat if st.prompt_feat.size else None)
    ref = tts.pipeline.mel_to_wav(mel, source=source)
    assert wav.shape == ref.shape
    assert float(np.max(np.abs(wav - ref))) < 1e-5
    with pytest.raises(Exception):
        st.hop(tokens, True, noise=noise, source=source)


def test_flow_cache_pins_overlap_noise():
    """After the first chunk, the first prompt + 34 noise frames of a chunk are replaced by the
    cache (changing them changes nothing); the frames after them matter."""
    outs = []
    for variant in ("base", "pinned", "free"):
        st, c = _stream(TINY_A, "prompt")
        rng = np.random.default_rng(1)
        chunks = c["chunks"][:2]
        for i, ch in enumerate(chunks):
            n = st.flow_frames(len(ch["tokens"]))
            noise = rng.standard_normal((1, 80, n), dtype=np.float32)
            if i == 1 and variant != "base":
                cut = st.prompt_feat.shape[0] + st.constants.mel_overlap_len
                sl = slice(0, cut) if variant == "pinned" else slice(cut, cut + 10)
                noise[..., sl] += 1.0
            wav = st.hop(ch["tokens"].numpy(), False, noise=noise, source=ch["source"].numpy())
        outs.append(wav)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert float(np.max(np.abs(outs[0] - outs[2]))) > 1e-3


def test_first_hop_steps_apply_to_a_first_hop_that_is_not_the_last():
    """``first_hop_n_timesteps``: the first non-final hop solves the CFM with that many Euler
    steps, later hops and a lone final hop with the utterance's; never more than those."""
    tts = _tts(TINY_A)
    g = _golden(TINY_A)
    tokens = g["speech_tokens"].numpy()
    seen = []
    real = tts.pipeline.solve_flow

    def spy(*a, n_timesteps=None, **k):
        seen.append(n_timesteps)
        return real(*a, n_timesteps=n_timesteps, **k)

    def run(constants, windows, n_timesteps=None):
        seen.clear()
        st = OfficialTokenHopStream(tts.stages, g["embedding"].numpy(), constants=constants,
                                    pipeline=tts.pipeline, n_timesteps=n_timesteps)
        st.pipeline.solve_flow = spy
        rng = np.random.default_rng(0)
        try:
            return [st.hop(tokens[a:b], fin, rng=rng) for a, b, fin in windows], list(seen)
        finally:
            del st.pipeline.solve_flow

    import dataclasses

    from cosyvino.families.cosyvoice1.streaming import LATENCY

    few = dataclasses.replace(LATENCY, first_hop_n_timesteps=3)
    windows = [(0, 21, False), (15, 51, True)]
    wav_few, steps = run(few, windows)
    assert steps == [3, None]                       # None = the model's 10
    wav_full, steps = run(dataclasses.replace(LATENCY, first_hop_n_timesteps=None), windows)
    assert steps == [None, None]
    assert wav_few[0].shape == wav_full[0].shape and not np.allclose(wav_few[0], wav_full[0])
    assert run(few, [(0, 30, True)])[1] == [None]   # a lone final hop keeps full quality
    assert run(few, windows, n_timesteps=2)[1] == [2, 2]   # never more than asked


@pytest.mark.parametrize("n", [14, 30, 57, 130, 340])
def test_stream_mel_frames_is_what_a_stream_emits(n):
    """``stream_mel_frames`` x 256 = the samples a token-hop stream emits, for both token-hop
    schedules (it may differ from the whole segment's frames by the windows' rounding)."""
    from cosyvino.families.cosyvoice1.streaming import LATENCY

    tts = _tts(TINY_A)
    g = _golden(TINY_A)
    tokens = np.resize(g["speech_tokens"].numpy(), n)
    for constants in (StreamConstants(), LATENCY):
        st = OfficialTokenHopStream(tts.stages, g["embedding"].numpy(), constants=constants,
                                    pipeline=tts.pipeline)
        rng = np.random.default_rng(0)
        total = sum(st.hop(tokens[a:b], fin, rng=rng).size
                    for a, b, fin in hop_windows(n, constants))
        assert total == stream_mel_frames(n, constants) * 256
    # 30 tokens in the latency hops (14, then 20) round to one frame more than the segment;
    # 340 tokens in the official hops (120, 120, 120, 40) to one frame less
    assert (stream_mel_frames(30, LATENCY), mel_frames_for_tokens(30)) == (52, 51)
    assert (stream_mel_frames(340), mel_frames_for_tokens(340)) == (584, 585)
