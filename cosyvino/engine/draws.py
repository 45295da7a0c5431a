"""Random draws indexed by (request seed, what, segment, position): the same numbers however a
request is chunked, batched or interleaved with others. Must not import torch.

Every draw comes from its own counter-based stream: a numpy ``PCG64`` seeded with the
``SeedSequence`` of ``(seed, stream id, segment, block)``. Per-position draws (noise along mel
frames or samples) are made in fixed blocks of positions, so any range of positions is a slice
of the same blocks: drawing frames 0..99 at once or as 0..49 and 50..99 gives the same array.
The sampling generator of a speech token depends on its index only, not on how many draws the
tokens before it used (RAS re-draws a variable number).
"""

from __future__ import annotations

import numpy as np

#: stream ids (part of every seed sequence; never renumber: it would change every seeded output)
SAMPLING, FLOW_NOISE, NSF_PHASE, NSF_NOISE = 1, 2, 3, 4
#: positions per block of a per-position draw: mel frames (256 = 2.97 s at 22050 Hz / hop 256)
#: and output samples (16384 = 0.74 s)
FRAME_BLOCK, SAMPLE_BLOCK = 256, 16384


def _generator(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))


class RandomDraws:
    """The random numbers of one request.

    Args:
        seed: the request seed (a non-negative int; :meth:`cosyvino.request.SynthesisRequest
            .validated` fixes one for requests without).
    """

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)

    def sampling(self, segment: int, token_index: int) -> np.random.Generator:
        """Generator for sampling speech token ``token_index`` of ``segment``."""
        return _generator(self.seed, SAMPLING, segment, token_index)

    def normal(self, stream: int, segment: int, rows: int, start: int, stop: int,
               block: int = FRAME_BLOCK) -> np.ndarray:
        """Standard normal float32 [rows, stop - start]: positions ``start..stop-1`` of the
        ``(stream, segment)`` draw (each position a column of ``rows`` values)."""
        if not 0 <= start <= stop:
            raise ValueError(f"bad position range [{start}, {stop})")
        first, last = start // block, -(-stop // block)
        blocks = [_generator(self.seed, stream, segment, rows, b)
                  .standard_normal((rows, block), dtype=np.float32) for b in range(first, last)]
        if not blocks:
            return np.zeros((rows, 0), np.float32)
        whole = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)
        off = first * block
        return np.ascontiguousarray(whole[:, start - off:stop - off])

    def flow_noise(self, segment: int, channels: int, frames: int, start: int = 0) -> np.ndarray:
        """CFM initial noise float32 [1, channels, frames] for mel frames ``start..``."""
        return self.normal(FLOW_NOISE, segment, channels, start, start + frames)[None]

    def nsf(self, segment: int, harmonics: int, samples: int, start: int = 0
            ) -> tuple[np.ndarray, np.ndarray]:
        """NSF source draws (upstream ``SineGen``, see :mod:`cosyvino.families.cosyvoice1.nsf`):
        ``phase`` float32 [1, harmonics] uniform in [-pi, pi) with column 0 (the fundamental)
        exactly 0, one per segment; ``noise`` float32 [1, harmonics, samples], standard normal,
        for output samples ``start..``."""
        phase = _generator(self.seed, NSF_PHASE, segment).uniform(
            -np.pi, np.pi, size=(1, harmonics)).astype(np.float32)
        phase[:, 0] = 0.0
        return phase, self.normal(NSF_NOISE, segment, harmonics, start, start + samples,
                                  SAMPLE_BLOCK)[None]
