"""The toy family's PyTorch model (imports torch) and its graph modules.

:class:`ToyModel` holds every weight; the ``*Graph`` modules are the graph table's
``torch_module`` s: each ``forward`` takes the spec's inputs in order and returns its outputs
(a tuple when several), with no data-dependent Python control flow and no shape read turned
into a Python int, so tracing (ONNX export) keeps the dynamic dims symbolic.
"""

from __future__ import annotations

import json
import math
import os

import torch
from torch import nn

from cosyvino.errors import CheckpointError

from . import CONFIG_FILE, WEIGHTS_FILE, ToyConfig, read_config_file


class ToyModel(nn.Module):
    """All weights of a toy model for ``config`` (random init; :func:`load_model` loads).

    Attributes: ``config`` and ``path`` (the model dir, None when built in memory) besides the
    modules."""

    def __init__(self, config: ToyConfig, path: str | None = None):
        super().__init__()
        self.config = config
        self.path = path
        d, c = config.dim, config.mels
        self.speaker_table = nn.Embedding(len(config.speakers), d)
        self.lm_embedding = nn.Embedding(config.lm_vocab, d)
        self.norm = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.head = nn.Linear(d, config.speech_vocab + 1)
        self.token_frames = nn.Embedding(config.speech_vocab, c)
        self.speaker_frames = nn.Linear(d, c)
        self.smooth = nn.Conv1d(c, c, kernel_size=3, padding=1)
        self.upsample = nn.ConvTranspose1d(c, 1, kernel_size=config.hop, stride=config.hop)


class SpeakerGraph(nn.Module):
    """speaker_id int64 [1] -> embedding float32 [1, D]."""

    def __init__(self, m: ToyModel):
        super().__init__()
        self.table = m.speaker_table

    def forward(self, speaker_id):
        return self.table(speaker_id)


class EmbedGraph(nn.Module):
    """ids int64 [1, n] (text ids, speech tokens offset by text_vocab) -> rows [1, n, D]."""

    def __init__(self, m: ToyModel):
        super().__init__()
        self.table = m.lm_embedding

    def forward(self, ids):
        return self.table(ids)


class LMGraph(nn.Module):
    """One causal single-head attention step over an explicit KV state.

    rows [1, N, D], past_key / past_value [1, 1, P, D] -> (logp [1, V+1] at the last row,
    present_key / present_value [1, 1, P+N, D]). Row i of the new rows sits at position P+i
    and sees keys 0..P+i.
    """

    def __init__(self, m: ToyModel):
        super().__init__()
        self.norm, self.q, self.k, self.v, self.o, self.head = m.norm, m.q, m.k, m.v, m.o, m.head
        self.scale = 1.0 / math.sqrt(m.config.dim)

    def forward(self, rows, past_key, past_value):
        x = self.norm(rows)
        key = torch.cat([past_key, self.k(x).unsqueeze(1)], dim=2)
        value = torch.cat([past_value, self.v(x).unsqueeze(1)], dim=2)
        scores = (self.q(x).unsqueeze(1) @ key.transpose(-1, -2)) * self.scale  # [1,1,N,T]
        # positions from cumulative sums of ones, not from shapes: stays symbolic when traced
        key_pos = torch.ones_like(key[0, 0, :, 0]).cumsum(0)                     # 1..T
        past = torch.ones_like(past_key[0, 0, :, 0]).sum()                       # P
        query_pos = torch.ones_like(x[0, :, 0]).cumsum(0) + past                 # P+1..P+N
        hidden = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
        attended = (hidden.softmax(-1) @ value).squeeze(1)                       # [1,N,D]
        h = rows + self.o(attended)
        logp = torch.log_softmax(self.head(h[:, -1]), dim=-1)
        return logp, key, value


class AcousticGraph(nn.Module):
    """tokens int64 [1, N], speaker [1, D], noise [1, C, N*R] -> frames [1, C, N*R]: each
    token's frame vector plus the speaker's, repeated R times, smoothed, plus the noise."""

    def __init__(self, m: ToyModel):
        super().__init__()
        self.token_frames, self.speaker_frames, self.smooth = (m.token_frames, m.speaker_frames,
                                                               m.smooth)
        self.r, self.c = m.config.frames_per_token, m.config.mels

    def forward(self, tokens, speaker, noise):
        e = self.token_frames(tokens) + self.speaker_frames(speaker).unsqueeze(1)  # [1,N,C]
        e = e.transpose(1, 2).unsqueeze(-1).repeat(1, 1, 1, self.r).reshape(1, self.c, -1)
        return torch.tanh(self.smooth(e)) + noise


class VocoderGraph(nn.Module):
    """frames [1, C, F] -> samples [1, F*hop] in ±0.99."""

    def __init__(self, m: ToyModel):
        super().__init__()
        self.upsample = m.upsample

    def forward(self, frames):
        return (0.99 * torch.tanh(self.upsample(frames))).reshape(1, -1)


def write_model_dir(out_dir, config: ToyConfig | None = None, seed: int = 0) -> str:
    """Write a random-weight toy model dir (``toyvoice.json`` + ``toyvoice.pt``); returns it."""
    config = config or ToyConfig()
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    model = ToyModel(config)
    with torch.no_grad():
        # sharper LM and louder vocoder than the default init: tokens vary with the seed and
        # the audio is not near silence
        model.head.weight.mul_(4.0)
        model.upsample.weight.mul_(8.0)
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config.to_json(), f, indent=2)
    torch.save(model.state_dict(), os.path.join(out_dir, WEIGHTS_FILE))
    return str(out_dir)


def load_model(model_dir) -> ToyModel:
    """The toy model of ``model_dir``, loaded strictly, in eval mode.

    Raises: ModelDirError / ConfigError (the config), CheckpointError (weights missing,
    unreadable or not matching the config)."""
    model_dir = os.fspath(model_dir)
    config = read_config_file(model_dir)
    model = ToyModel(config, model_dir)
    path = os.path.join(model_dir, WEIGHTS_FILE)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found", path) from None
    except (RuntimeError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}", path) from None
    return model.eval()
