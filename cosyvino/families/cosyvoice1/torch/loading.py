"""Build our PyTorch modules for a :class:`ModelConfig` and load official checkpoints strictly.

``llm.pt`` -> :class:`TransformerLM`, ``flow.pt`` -> :class:`Flow`, ``hift.pt`` ->
:class:`HiFTGenerator` (weight norm folded, both key spellings accepted, ``generator.`` prefix
stripped as upstream's loader does). Key/shape differences raise
:class:`cosyvino.errors.CheckpointError` naming the file and the keys, in the file's own spelling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cosyvino.families.cosyvoice1.config import ModelConfig
from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice1.checkpoint import check_state_dict, load_spk2info, load_torch_file
from cosyvino.families.cosyvoice1.weight_norm import fold_weight_norm, strip_generator_prefix, unfold_weight_norm
from cosyvino.families.cosyvoice1.yaml_config import read_model_config
from cosyvino.families.cosyvoice1.torch.flow import Flow
from cosyvino.families.cosyvoice1.torch.hift import HiFTGenerator
from cosyvino.families.cosyvoice1.torch.llm import TransformerLM

CHECKPOINT_FILES = ("llm.pt", "flow.pt", "hift.pt")
_SPELLING_HINT = ("hift.pt weight-norm keys may use either 'X.parametrizations.weight."
                  "original0/1' or 'X.weight_g/X.weight_v'")


def build_modules(cfg: ModelConfig, device: str | torch.device = "cpu"
                  ) -> tuple[TransformerLM, Flow, HiFTGenerator]:
    """Randomly initialised modules for ``cfg`` (``device="meta"`` allocates nothing)."""
    with torch.device(device):
        return TransformerLM(cfg.llm), Flow(cfg.flow), HiFTGenerator(cfg.hift)


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def hift_spelling(state_dict) -> str:
    """``"parametrizations"``, ``"weight_g"`` or ``"plain"`` (already folded) for a hift state_dict."""
    keys = list(state_dict)
    if any(".parametrizations.weight.original" in k for k in keys):
        return "parametrizations"
    if any(k.endswith(".weight_g") or k.endswith(".weight_v") for k in keys):
        return "weight_g"
    return "plain"


def _hift_file_shapes(hift: HiFTGenerator, spelling: str) -> dict[str, tuple[int, ...]]:
    sd = hift.state_dict()
    if spelling != "plain":
        sd = unfold_weight_norm(sd, hift.weight_normed_parameters(), spelling)
    return {k: tuple(v.shape) for k, v in sd.items()}


def expected_checkpoint_shapes(cfg: ModelConfig, hift_weight_norm: str = "parametrizations"
                               ) -> dict[str, dict[str, tuple[int, ...]]]:
    """File name -> {key: shape} of the official checkpoint files for ``cfg`` (meta device)."""
    llm, flow, hift = build_modules(cfg, "meta")
    return {"llm.pt": _shapes(llm), "flow.pt": _shapes(flow),
            "hift.pt": _hift_file_shapes(hift, hift_weight_norm)}


def _load_into(module: nn.Module, state_dict: dict, path: str) -> None:
    check_state_dict(state_dict, _shapes(module), path)
    # assign=True adopts the (memory-mapped) checkpoint tensors instead of copying them.
    module.load_state_dict({k: v.float() for k, v in state_dict.items()}, strict=True,
                           assign=True)


def load_hift(hift: HiFTGenerator, path: str) -> None:
    """Strictly load ``hift.pt`` (either weight-norm spelling) into ``hift``."""
    sd = strip_generator_prefix(load_torch_file(path))
    spelling = hift_spelling(sd)
    check_state_dict(sd, _hift_file_shapes(hift, spelling), path, hint=_SPELLING_HINT)
    # upcast before folding: upstream's float32 module copies a half-precision file's g and v,
    # then computes g * v / ||v|| in float32 (folding in float16 moves the weights by ~1e-3)
    sd = {k: v.float() for k, v in sd.items()}
    folded = fold_weight_norm(sd) if spelling != "plain" else sd
    hift.load_state_dict(folded, strict=True, assign=True)


@dataclass
class TorchModel:
    """An official-layout model directory loaded into our PyTorch modules (eval mode)."""

    path: str
    config: ModelConfig
    llm: TransformerLM
    flow: Flow
    hift: HiFTGenerator
    speakers: dict[str, np.ndarray]


def load_torch_model(model_dir: str | os.PathLike) -> TorchModel:
    """Load ``cosyvoice.yaml``, ``llm.pt``, ``flow.pt``, ``hift.pt`` and ``spk2info.pt``.

    Raises:
        ModelDirError: the directory or a file is missing.
        ConfigError: bad ``cosyvoice.yaml``.
        CheckpointError: truncated/corrupt checkpoint or key/shape mismatch (named).
    """
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_model_config(os.path.join(model_dir, "cosyvoice.yaml"))
    for name in CHECKPOINT_FILES + ("spk2info.pt",):
        p = os.path.join(model_dir, name)
        if not os.path.isfile(p):
            raise ModelDirError(f"{p} is missing; a CosyVoice v1 model directory needs "
                                f"cosyvoice.yaml, {', '.join(CHECKPOINT_FILES)} and spk2info.pt",
                                p)
    llm, flow, hift = build_modules(cfg)
    _load_into(llm, load_torch_file(os.path.join(model_dir, "llm.pt")),
               os.path.join(model_dir, "llm.pt"))
    _load_into(flow, load_torch_file(os.path.join(model_dir, "flow.pt")),
               os.path.join(model_dir, "flow.pt"))
    load_hift(hift, os.path.join(model_dir, "hift.pt"))
    speakers = load_spk2info(os.path.join(model_dir, "spk2info.pt"), cfg.llm.spk_embed_dim)
    for m in (llm, flow, hift):
        m.eval().requires_grad_(False)
    return TorchModel(model_dir, cfg, llm, flow, hift, speakers)
