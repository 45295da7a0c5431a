"""The fixed NSF tables of the CosyVoice3 vocoder, made by replaying upstream's construction.

Upstream's causal NSF source (``SineGen2(causal=True)``, ``SourceModuleHnNSF(causal=True)``)
draws three tables from torch's GLOBAL RNG while the model is constructed, and every inference
slices them: ``rand_ini`` [1, 9] (element 0 zeroed; no effect on the output), ``sine_waves``
[1, 7 200 000, 9] (300 s at 24 kHz, uniform [0, 1): the additive noise, the only table that
reaches the waveform) and ``uv`` [1, 7 200 000, 1] (feeds an unused branch). Their values depend on
every draw made since the last reseed, which the CFM makes (``torch.manual_seed(0)`` before its
own noise table): CosyVoice3 architecture sheet §6.2 gives the order, which follows the
hyperpyyaml construction order of ``cosyvoice3.yaml``::

    seed 0; CFM noise randn [1, 80, 15000]
    flow: Embedding(vocab_size, input_size) (normal), Linear(spk_embed_dim, output_size)
    hift f0 predictor: Conv1d(in, C, 4), 4 × Conv1d(C, C, 3), Linear(C, num_class)
    rand_ini = rand [1, 9]; sine_waves = rand [1, 7 200 000, 9]
    m_source.l_linear: Linear(9, 1)
    uv = rand [1, 7 200 000, 1]

(each Linear/Conv1d default init draws its weight then its bias uniformly; weight norm draws
nothing). :func:`make_fixed_tables` replays exactly those draws (same shapes, same torch
primitives, CPU generator, float32) on a private generator, so the caller's global RNG is left
alone; :func:`table_recipe_from_data` takes the sizes from the yaml and refuses one whose
construction order differs. Checked bit-exact against the official construction (tiny-e golden
slices; full-size shapes, sums and heads).

Conversion needs torch (imported lazily); serving only slices the numpy tables
(:func:`sine_wave_rows`). Must not import torch at module level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from cosyvino.errors import ConfigError, InputError
from cosyvino.families.cosyvoice1.yaml_config import Tagged, load_inert_yaml
from cosyvino.families.cosyvoice3.hift_config import (
    F0_LOOK_RIGHT,
    FIXED_TABLE_HARMONICS,
    hift_config_from_data,
)
from cosyvino.families.cosyvoice23.fixed_noise import CFM_NOISE_SEED, CFM_NOISE_SHAPE
from cosyvino.families.cosyvoice23.yaml_sections import YamlSection

__all__ = ["TABLE_SAMPLES", "FixedTables", "TableRecipe", "make_fixed_tables", "read_table_recipe",
           "sine_wave_rows", "table_recipe_from_data"]

#: rows of ``sine_waves`` and ``uv``: upstream's ``300 * 24000`` (hard-coded, sheet §6.2)
TABLE_SAMPLES = 300 * 24000
#: the f0 predictor's hidden convolutions after ``condnet.0`` (kernel 3 each; sheet §6.1)
_F0_HIDDEN_CONVS = 4


@dataclass(frozen=True)
class TableRecipe:
    """The sizes of the modules whose default initialization draws from the RNG between the CFM's
    reseed and the tables (sheet §6.2); defaults are the full-size Fun-CosyVoice3-0.5B values.

    Attributes:
        flow_vocab_size, flow_input_size: the flow's ``input_embedding`` Embedding.
        spk_embed_dim, flow_output_size: the flow's ``spk_embed_affine_layer`` Linear.
        f0_in_channels, f0_cond_channels, f0_num_class: the hift's f0 predictor.
        nb_harmonics: the source's ``l_linear`` is Linear(nb_harmonics + 1, 1).

    Raises:
        ConfigError: a non-positive size.
    """

    flow_vocab_size: int = 6561
    flow_input_size: int = 80
    spk_embed_dim: int = 192
    flow_output_size: int = 80
    f0_in_channels: int = 80
    f0_cond_channels: int = 512
    f0_num_class: int = 1
    nb_harmonics: int = 8

    def __post_init__(self) -> None:
        bad = [k for k, v in vars(self).items() if int(v) <= 0 and k != "nb_harmonics"]
        if bad or self.nb_harmonics < 0:
            raise ConfigError(f"fixed-table recipe sizes must be positive: {bad or 'nb_harmonics'}")


@dataclass(frozen=True)
class FixedTables:
    """Upstream's three tables, float32 numpy arrays in upstream's layout: ``rand_ini`` [1, 9],
    ``sine_waves`` [1, 7 200 000, 9], ``uv`` [1, 7 200 000, 1]."""

    rand_ini: np.ndarray
    sine_waves: np.ndarray
    uv: np.ndarray


def _new_args(node: Tagged) -> list[tuple[str, object]]:
    return list(node.args.items()) if isinstance(node.args, dict) else []


def _constructs(value: object) -> bool:
    """Whether a yaml value builds something when hyperpyyaml loads it (a ``!new:`` object or an
    ``!apply:`` call, possibly nested), which may draw from the RNG."""
    if isinstance(value, Tagged):
        return value.kind in ("new", "apply") or any(_constructs(v) for _, v in _new_args(value))
    if isinstance(value, dict):
        return any(_constructs(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_constructs(v) for v in value)
    return False


def table_recipe_from_data(data: dict, path: str) -> TableRecipe:
    """The recipe's sizes from inert ``cosyvoice3.yaml`` data, after checking that the yaml
    builds the modules in the order the recipe replays (sheet §6.2 and its open question 1).

    Checked: ``flow`` is a ``CausalMaskedDiffWithDiT`` whose ``decoder`` is a
    ``CausalConditionalCFM`` (the reseed) and no argument after ``decoder`` constructs anything;
    ``hift`` (a ``CausalHiFTGenerator``) is the next top-level entry that constructs anything
    after ``flow``, and within ``hift`` only the f0 predictor does.

    Raises:
        ConfigError: a missing or malformed section or size, or a construction order the recipe
            does not reproduce.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a yaml mapping", path)
    for key in ("flow", "hift"):
        if key not in data:
            raise ConfigError(f"{path}: no '{key}:' section (the fixed-table recipe needs both)",
                              path)
    flow = YamlSection(data["flow"], "flow", path)
    flow.expect_class(("CausalMaskedDiffWithDiT",))
    flow.sub("decoder").expect_class(("CausalConditionalCFM",))
    args = list(flow.node.args)
    after = [k for k in args[args.index("decoder") + 1:] if _constructs(flow.node.args[k])]
    keys = list(data)
    between = [k for k in keys[keys.index("flow") + 1:keys.index("hift")] if _constructs(data[k])]
    hift_node = YamlSection(data["hift"], "hift", path)
    inner = [k for k, v in hift_node.node.args.items() if k != "f0_predictor" and _constructs(v)]
    if keys.index("hift") < keys.index("flow") or after or between or inner:
        what = after or between or inner or ["hift before flow"]
        raise ConfigError(f"{path}: the yaml constructs {what} between the CFM's reseed and the "
                          "vocoder's noise tables; the fixed-table recipe (CosyVoice3 sheet §6.2) "
                          "would not reproduce upstream's tables", path)
    cfg = hift_config_from_data(data, path)
    return TableRecipe(
        flow_vocab_size=flow.num("vocab_size"),
        flow_input_size=flow.num("input_size"),
        spk_embed_dim=flow.num("spk_embed_dim"),
        flow_output_size=flow.num("output_size"),
        f0_in_channels=cfg.f0_in_channels,
        f0_cond_channels=cfg.f0_cond_channels,
        f0_num_class=cfg.f0_num_class,
        nb_harmonics=cfg.nb_harmonics,
    )


def read_table_recipe(path: str | os.PathLike) -> TableRecipe:
    """:func:`table_recipe_from_data` of ``cosyvoice3.yaml`` (a file or a model directory).

    Raises:
        ModelDirError: the file is missing or unreadable; ConfigError: as
            :func:`table_recipe_from_data`.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "cosyvoice3.yaml")
    return table_recipe_from_data(load_inert_yaml(path), path)


def make_fixed_tables(recipe: TableRecipe = TableRecipe()) -> FixedTables:
    """Replay upstream's draws (module docstring) and return the three tables.

    Takes ~2 s and ~300 MB (the tables themselves) on a CPU.

    Raises:
        ImportError: torch is not installed (conversion-time dependency).
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(CFM_NOISE_SEED)

    def linear_like(*weight_shape: int) -> None:
        # nn.Linear / nn.Conv1d reset_parameters: kaiming_uniform_ on the weight, then the bias
        torch.empty(weight_shape).uniform_(generator=gen)
        torch.empty(weight_shape[0]).uniform_(generator=gen)

    r = recipe
    torch.randn(CFM_NOISE_SHAPE, generator=gen)
    torch.empty(r.flow_vocab_size, r.flow_input_size).normal_(generator=gen)  # nn.Embedding
    linear_like(r.flow_output_size, r.spk_embed_dim)
    linear_like(r.f0_cond_channels, r.f0_in_channels, F0_LOOK_RIGHT + 1)
    for _ in range(_F0_HIDDEN_CONVS):
        linear_like(r.f0_cond_channels, r.f0_cond_channels, 3)
    linear_like(r.f0_num_class, r.f0_cond_channels)
    rand_ini = torch.rand(1, FIXED_TABLE_HARMONICS, generator=gen)
    rand_ini[:, 0] = 0
    sine_waves = torch.rand(1, TABLE_SAMPLES, FIXED_TABLE_HARMONICS, generator=gen)
    linear_like(1, r.nb_harmonics + 1)
    uv = torch.rand(1, TABLE_SAMPLES, 1, generator=gen)
    return FixedTables(rand_ini.numpy(), sine_waves.numpy(), uv.numpy())


def sine_wave_rows(sine_waves: np.ndarray, n_samples: int) -> np.ndarray:
    """The noise a vocoder call over ``n_samples`` output samples adds: rows ``0 ..
    n_samples − 1`` of the table (upstream slices from 0 on every call), float32
    [1, n_samples, 9], a view when the table is float32.

    Raises:
        InputError: ``n_samples`` is not positive or exceeds the table (upstream's vocoder does
            not support more than 300 s in one call).
    """
    rows = sine_waves.shape[1]
    if n_samples <= 0 or n_samples > rows:
        raise InputError(f"the CosyVoice3 vocoder supports 1..{rows} samples per call "
                         f"({rows // 24000} s at 24 kHz), got {n_samples}")
    return np.asarray(sine_waves[:, :n_samples], dtype=np.float32)
