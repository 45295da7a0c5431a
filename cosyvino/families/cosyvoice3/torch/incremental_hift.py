"""An incremental CosyVoice3 vocoder: per streaming hop, work on a bounded window instead of the
whole utterance (issue 36).

Upstream's v3 stream re-runs the causal HiFT over ALL mel so far at every chunk and cuts the
samples it already emitted (sheet §7; :class:`cosyvino.families.cosyvoice3.official_stream.
VocoderRerunStream`): quadratic in the utterance length. Every part of the vocoder is causal with
a finite reach into the past, except two running quantities, so the same samples come from:

* f0 of the new frames only, from a mel window reaching :data:`F0_LEFT_FRAMES` frames back (the
  f0 predictor's left-causal layers; its 3 look-ahead frames as upstream);
* the source of the new frames only: the harmonic phase is a running sum, carried here as the
  float64 accumulator torch's CPU ``cumsum`` keeps (so the float32 sums equal the whole-utterance
  ones bit for bit), and the noise rows are taken at the frames' absolute sample positions;
* the decoder over mel frames ``[e − C, M)`` (e: frames already emitted, C:
  :func:`decode_left_context_frames`), keeping the samples from frame e on: every output sample
  depends on at most C frames of input before it, so the zero padding at the window's start (and
  the STFT/reflection padding there) cannot reach them.

So the state carried between hops is the last C (+ f0 reach) mel frames and source samples, the
phase accumulator and the counts; the work per hop is O(new frames + C). The emitted samples
equal the re-run's up to float32 convolution rounding (the CPU kernels round differently for
different input lengths, exactly as a non-final run vs a longer final run does).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice3.hift_config import F0_LOOK_RIGHT, CausalHiFTConfig
from cosyvino.families.cosyvoice3.torch.hift import CausalHiFTGenerator

__all__ = ["F0_LEFT_FRAMES", "IncrementalCausalHiFT", "decode_left_context_frames"]

#: mel frames of the past the f0 predictor reads: four kernel-3 left-causal layers, 2 each
F0_LEFT_FRAMES = 8


def _resblock_reach(kernels, dilations) -> int:
    """Left reach (frames at the block's rate) of the widest residual block: per dilation d,
    conv1 d·(k−1) and conv2 k−1, chained."""
    return max(sum(d * (k - 1) + (k - 1) for d in ds) for k, ds in zip(kernels, dilations))


def decode_left_context_frames(cfg: CausalHiFTConfig) -> int:
    """Mel frames before an output sample that the decode stage can read (its left receptive
    field), rounded up, plus one frame of margin.

    Walks the decoder backwards from the output (sheet §6.1/§6.3 layer sizes): the iSTFT overlap
    (n_fft/2 samples), conv_post (6 STFT frames), then per stage from the last: its residual
    blocks, where the source joins (source resblock, the downsampler's u − 1 STFT frames, the
    STFT's n_fft/2 samples), the reflection pad (1 frame, last stage), the upsampling conv
    (k − 1 frames) and the nearest-neighbour hold (1 input frame). The longest path wins.
    """
    rates = np.cumprod(cfg.upsample_rates)                  # frames per mel frame after ups.i
    stft_rate = float(rates[-1])
    half_window = cfg.istft_n_fft / 2 / cfg.hop_length      # in mel frames
    down = np.cumprod([1] + list(cfg.upsample_rates[::-1][:-1]))[::-1]
    main = _resblock_reach(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
    reach = half_window + 6 / stft_rate
    longest = 0.0
    for i in reversed(range(len(cfg.upsample_rates))):
        reach += main / rates[i]
        source = (_resblock_reach([cfg.source_resblock_kernel_sizes[i]],
                                  [cfg.source_resblock_dilation_sizes[i]]) / rates[i]
                  + (int(down[i]) - 1) / stft_rate + half_window)
        longest = max(longest, reach + source)
        if i == len(cfg.upsample_rates) - 1:
            reach += 1 / rates[i]
        reach += (cfg.upsample_kernel_sizes[i] - 1) / rates[i]
        reach += 1 / (rates[i - 1] if i else 1)
    return math.ceil(max(longest, reach)) + 1


class IncrementalCausalHiFT:
    """The vocoder half of a v3 stream that emits the same samples as the official re-run
    (:class:`~cosyvino.families.cosyvoice3.official_stream.VocoderRerunStream` over
    :meth:`CausalHiFTGenerator.inference`) while computing only a bounded window per hop.

    Args:
        hift: a loaded :class:`CausalHiFTGenerator` (f0 predictor in float64).
        sine_waves: upstream's fixed noise table [1, N, 9] (numpy or torch, float32).
        context_frames: the decoder window's reach into the past; None:
            :func:`decode_left_context_frames` (smaller values change the output; for tests).

    Call :meth:`hop` once per flow call, in order, with that call's new mel frames. Not
    thread-safe. ``windows`` records the (f0, decode) window lengths in frames per hop.
    """

    def __init__(self, hift: CausalHiFTGenerator, sine_waves, context_frames: int | None = None):
        self.hift = hift
        self.cfg = hift.cfg
        self.hop_length = int(self.cfg.hop_length)
        self.table = torch.as_tensor(sine_waves, dtype=torch.float32)
        self.context = (decode_left_context_frames(self.cfg) if context_frames is None
                        else int(context_frames))
        self.source_stage = hift.source_stage()
        self.mel = torch.zeros(1, self.cfg.in_channels, 0)   # frames [mel_start, M)
        self.mel_start = 0
        self.source = torch.zeros(1, 1, 0)                   # samples of frames [src_start, f0_done)
        self.src_start = 0
        self.f0_done = 0                                     # frames with f0 and source
        n_h = self.cfg.nb_harmonics + 1
        self.cycles = torch.zeros(1, 1, n_h, dtype=torch.float64)  # cumsum accumulator
        self.emitted = 0                                     # frames whose samples were emitted
        self.finished = False
        self.windows: list[tuple[int, int]] = []

    @property
    def n_frames(self) -> int:
        """Mel frames received so far."""
        return self.mel_start + self.mel.shape[-1]

    def _mel(self, start: int, stop: int) -> torch.Tensor:
        return self.mel[:, :, start - self.mel_start:stop - self.mel_start]

    def _extend_source(self, stop: int, finalize: bool) -> int:
        """f0 and source for frames [f0_done, stop); returns the f0 window length."""
        start = self.f0_done
        if stop <= start:
            return 0
        w = max(0, start - F0_LEFT_FRAMES)
        mel_stop = stop if finalize else stop + F0_LOOK_RIGHT
        f0 = self.hift.f0_stage(finalize)(self._mel(w, mel_stop))[:, start - w:]
        stage = self.source_stage
        rad = stage.phase_increments(f0).double()
        summed = torch.cumsum(torch.cat([self.cycles, rad], dim=1), dim=1)[:, 1:]
        self.cycles = summed[:, -1:]
        a, b = start * self.hop_length, stop * self.hop_length
        if self.table.shape[1] < b:
            raise InputError(f"the fixed noise table has {self.table.shape[1]} samples; the "
                             f"utterance needs {b} ({b / self.cfg.sampling_rate:.1f} s)")
        new = stage.excite(summed.float(), f0, self.table[:, a:b])
        self.source = torch.cat([self.source, new], dim=-1)
        self.f0_done = stop
        return mel_stop - w

    @torch.inference_mode()
    def hop(self, new_mel, finalize: bool) -> np.ndarray:
        """Append ``new_mel`` (float32 [1, 80, m]) and return the samples the official re-run
        would emit now (float32 [n], 24 kHz).

        Raises:
            InputError: after the final hop; a mel of the wrong shape or without frames; an
                utterance longer than the noise table.
        """
        if self.finished:
            raise InputError("the stream has already been finalized")
        mel = torch.as_tensor(np.asarray(new_mel, np.float32))
        if mel.dim() != 3 or mel.shape[0] != 1 or mel.shape[1] != self.cfg.in_channels \
                or mel.shape[-1] == 0:
            raise InputError(f"new mel must be [1, {self.cfg.in_channels}, frames > 0], got "
                             f"{tuple(mel.shape)}")
        self.mel = torch.cat([self.mel, mel], dim=-1)
        m = self.n_frames
        # upstream's decode gets the frames with f0: all when finalizing, else all but 3
        body = m if finalize else m - F0_LOOK_RIGHT
        done = m if finalize else body - self.cfg.conv_pre_look_right - 1
        self.finished = bool(finalize)
        if done <= self.emitted:
            self.windows.append((0, 0))
            return np.zeros(0, np.float32)
        f0_window = self._extend_source(body, finalize)
        w = max(0, self.emitted - self.context)
        source = self.source[:, :, (w - self.src_start) * self.hop_length:]
        wav = self.hift.decode_stage(finalize)(self._mel(w, body), source)
        out = wav[0, (self.emitted - w) * self.hop_length:]
        self.windows.append((f0_window, body - w))
        self.emitted = done
        self._trim()
        return np.ascontiguousarray(out.numpy())

    def _trim(self) -> None:
        """Drop mel frames and source samples no later window can read."""
        keep_mel = max(0, min(self.f0_done - F0_LEFT_FRAMES, self.emitted - self.context))
        if keep_mel > self.mel_start:
            self.mel = self.mel[:, :, keep_mel - self.mel_start:]
            self.mel_start = keep_mel
        keep_src = max(0, self.emitted - self.context)
        if keep_src > self.src_start:
            self.source = self.source[:, :, (keep_src - self.src_start) * self.hop_length:]
            self.src_start = keep_src
