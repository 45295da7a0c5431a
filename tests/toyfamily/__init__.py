"""``toyvoice``: a made-up second model family for the tests (not CosyVoice), plugged in the
way a third-party family would be: a :class:`ToyVoice` :class:`cosyvino.families.ModelFamily`
registered through the ``register_families`` hook of this module (register the module into
``cosyvino.plugins.get_plugin_manager()``; tests/test_toy_family.py does it in a fixture).

What it owns, none of it shared with CosyVoice v1:

* its config file ``toyvoice.json`` (:class:`ToyConfig`: sizes, sample rate, speaker names),
  read by :meth:`ToyVoice.read_config` from an official or a converted dir;
* its PyTorch model (:mod:`.model`, weights in ``toyvoice.pt``) and its graph table
  (:func:`graph_table`): ``speaker`` (id -> embedding), ``embed`` (ids -> LM rows), ``lm`` (one
  causal attention step over an explicit KV state), ``acoustic`` (speech tokens + speaker +
  noise -> frames), ``vocoder`` (frames -> samples);
* its stage calls (:mod:`.stages`), built over any backend's graph runner;
* one mode (``speak``), a character frontend and its program (:mod:`.program`): PREFILL ->
  DECODE (sampled with the request's draws) -> FLOW -> VOCODER, one chunk per sentence.

Importing this package does not import torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

import numpy as np

import cosyvino
from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.base import GraphSpec, GraphTable, Mode, ModelFamily, StateSpec, TensorSpec

NAME = "toyvoice"
CONFIG_FILE = "toyvoice.json"
WEIGHTS_FILE = "toyvoice.pt"
SPEAK = Mode("speak", "a built-in toy speaker reads the text", needs_speaker=True)


@dataclass(frozen=True)
class ToyConfig:
    """The toy model's sizes (``toyvoice.json``; every field optional there).

    Attributes:
        sample_rate: output Hz.
        text_vocab: text token ids are ``ord(char) % text_vocab``.
        speech_vocab: speech tokens 0..speech_vocab-1; ``speech_vocab`` itself is EOS.
        dim: LM width D, also the speaker embedding width.
        mels: acoustic frame channels C.
        frames_per_token: acoustic frames per speech token R.
        hop: output samples per frame.
        min_tokens_per_char / max_tokens_per_char: speech-token bounds per text token.
        temperature: sampling temperature of the speech tokens.
        noise_scale: std of the acoustic noise the program draws.
        speakers: built-in speaker names (row order of the speaker table).
    """

    sample_rate: int = 8000
    text_vocab: int = 128
    speech_vocab: int = 24
    dim: int = 16
    mels: int = 6
    frames_per_token: int = 3
    hop: int = 40
    min_tokens_per_char: float = 0.5
    max_tokens_per_char: float = 1.5
    temperature: float = 1.0
    noise_scale: float = 0.1
    speakers: tuple[str, ...] = ("ada", "bo")

    @property
    def eos(self) -> int:
        return self.speech_vocab

    @property
    def lm_vocab(self) -> int:
        """Rows of the joint LM embedding: text ids, then speech tokens (offset text_vocab)."""
        return self.text_vocab + self.speech_vocab

    def to_json(self) -> dict:
        return {"family": NAME, **{k: list(v) if isinstance(v, tuple) else v
                                   for k, v in asdict(self).items()}}


def read_config_file(model_dir: str) -> ToyConfig:
    """:class:`ToyConfig` from ``model_dir/toyvoice.json``.

    Raises: ModelDirError (no such dir or file), ConfigError (not JSON, not a toyvoice config,
    unknown keys or bad values)."""
    path = os.path.join(os.fspath(model_dir), CONFIG_FILE)
    if not os.path.isfile(path):
        raise ModelDirError(f"{path} not found: not a toyvoice model dir", path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable ({e})", path) from None
    if not isinstance(data, dict) or data.get("family") != NAME:
        raise ConfigError(f"{path}: not a toyvoice config (\"family\": \"{NAME}\" missing)",
                          path)
    known = {f.name for f in fields(ToyConfig)}
    unknown = sorted(set(data) - known - {"family"})
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}", path)
    values = {k: (tuple(v) if k == "speakers" else v) for k, v in data.items() if k in known}
    try:
        cfg = ToyConfig(**values)
    except TypeError as e:
        raise ConfigError(f"{path}: {e}", path) from None
    ints = ("sample_rate", "text_vocab", "speech_vocab", "dim", "mels", "frames_per_token",
            "hop")
    if any(isinstance(getattr(cfg, k), bool) or not isinstance(getattr(cfg, k), int)
           or getattr(cfg, k) < 1 for k in ints):
        raise ConfigError(f"{path}: {', '.join(ints)} must be positive integers", path)
    if not cfg.speakers or not all(isinstance(s, str) and s for s in cfg.speakers):
        raise ConfigError(f"{path}: speakers must be a non-empty list of names", path)
    return cfg


# ---- the graph table --------------------------------------------------------------------------

@dataclass(frozen=True)
class ToyGraphSpec(GraphSpec):
    """A :class:`GraphSpec` whose integer inputs are drawn below their vocabulary size
    (``int_high``: input name -> exclusive bound), so the exporters' example inputs index the
    embedding tables in range."""

    int_high: Mapping[str, int] = field(default_factory=dict)

    def example_inputs(self, seed: int = 0, high: int = 100) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [t.example(self.example_sizes, rng, self.int_high.get(t.name, high))
                for t in self.inputs]


def _f(name, *shape):
    return TensorSpec(name, "float32", tuple(shape))


def _i(name, *shape):
    return TensorSpec(name, "int64", tuple(shape))


# torch module factories (called with a .model.ToyModel; they import torch)
def _speaker(m):
    from .model import SpeakerGraph

    return SpeakerGraph(m)


def _embed(m):
    from .model import EmbedGraph

    return EmbedGraph(m)


def _lm(m):
    from .model import LMGraph

    return LMGraph(m)


def _acoustic(m):
    from .model import AcousticGraph

    return AcousticGraph(m)


def _vocoder(m):
    from .model import VocoderGraph

    return VocoderGraph(m)


def graph_table(cfg: ToyConfig) -> GraphTable:
    """The toy graphs for ``cfg``: D = dim, V = speech_vocab (+1 EOS), C = mels."""
    d, c = cfg.dim, cfg.mels
    return GraphTable([
        ToyGraphSpec("speaker", "lm", (_i("speaker_id", 1),), (_f("embedding", 1, d),),
                     torch_module=_speaker, int_high={"speaker_id": len(cfg.speakers)},
                     doc="speaker id -> embedding [1, D]"),
        ToyGraphSpec("embed", "lm", (_i("ids", 1, "n"),), (_f("rows", 1, "n", d),),
                     example_sizes={"n": 5}, torch_module=_embed,
                     int_high={"ids": cfg.lm_vocab},
                     doc="joint text/speech token ids -> LM input rows"),
        GraphSpec("lm", "lm",
                  (_f("rows", 1, "new", d), _f("past_key", 1, 1, "past", d),
                   _f("past_value", 1, 1, "past", d)),
                  (_f("logp", 1, cfg.speech_vocab + 1), _f("present_key", 1, 1, "total", d),
                   _f("present_value", 1, 1, "total", d)),
                  state=(StateSpec("past_key", "present_key", (1, 1, 0, d)),
                         StateSpec("past_value", "present_value", (1, 1, 0, d))),
                  example_sizes={"new": 3, "past": 4, "total": 7}, torch_module=_lm,
                  doc="one causal attention step over the KV state; log-probs of the next "
                      "speech token (last index EOS)"),
        ToyGraphSpec("acoustic", "acoustic",
                     (_i("tokens", 1, "tokens"), _f("speaker", 1, d),
                      _f("noise", 1, c, "frames")),
                     (_f("frames", 1, c, "frames"),),
                     example_sizes={"tokens": 6, "frames": 6 * cfg.frames_per_token},
                     torch_module=_acoustic, int_high={"tokens": cfg.speech_vocab},
                     doc="speech tokens (R frames each) + speaker + noise -> frames"),
        GraphSpec("vocoder", "vocoder", (_f("frames", 1, c, "frames"),),
                  (_f("samples", 1, "samples"),),
                  example_sizes={"frames": 11, "samples": 11 * cfg.hop},
                  torch_module=_vocoder, doc="frames -> samples in ±0.99 (hop per frame)"),
    ])


# ---- the family ------------------------------------------------------------------------------

class ToyVoice(ModelFamily):
    """The toy family (see the module docstring)."""

    name = NAME
    description = "toyvoice: a made-up test family (attention LM -> frames -> samples)"
    config_files = (CONFIG_FILE,)
    modes = {SPEAK.name: SPEAK}

    @classmethod
    def detect(cls, model_dir: str) -> bool:
        try:
            read_config_file(model_dir)
        except (ModelDirError, ConfigError, OSError):
            return False
        return True

    @classmethod
    def read_config(cls, model_dir: str) -> ToyConfig:
        return read_config_file(model_dir)

    @classmethod
    def source_files(cls, model_dir: str) -> tuple[str, ...]:
        return (CONFIG_FILE, WEIGHTS_FILE)

    @classmethod
    def graphs(cls, config: ToyConfig) -> GraphTable:
        return graph_table(config)

    @classmethod
    def load_torch_model(cls, model_dir: str):
        from .model import load_model

        return load_model(model_dir)

    @classmethod
    def speakers(cls, model_dir: str) -> list[str]:
        return list(read_config_file(model_dir).speakers)

    @classmethod
    def stages_from_runner(cls, runner, model_dir: str):
        from .stages import ToyGraphStages

        return ToyGraphStages(runner)

    @classmethod
    def new_program(cls, stages, request, draws, frontend):
        from .program import ToyProgram

        return ToyProgram(stages, request, draws, frontend)

    @classmethod
    def make_frontend(cls, config: ToyConfig):
        from .program import ToyFrontend

        return ToyFrontend(config)


@cosyvino.hookimpl
def register_families(register):
    register(ToyVoice)
