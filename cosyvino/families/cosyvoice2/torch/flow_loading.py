"""Build the CosyVoice2 flow for a config and load an official ``flow.pt`` strictly.

Key set and shapes must equal the module's exactly (sheet §5.8: 1121 tensors at full size);
float16 storage (the tiny goldens) is upcast to float32. Errors name the file and the keys.
"""

from __future__ import annotations

import os

import torch

from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice2.flow_config import CausalFlowConfig, read_flow_config
from cosyvino.families.cosyvoice2.torch.flow import CausalMaskedDiffWithXvec
from cosyvino.families.cosyvoice23.torch.checkpoint import load_strict

CONFIG_NAME = "cosyvoice2.yaml"
FLOW_FILE = "flow.pt"


def build_flow(cfg: CausalFlowConfig, device: str | torch.device = "cpu"
               ) -> CausalMaskedDiffWithXvec:
    """A randomly initialised flow for ``cfg`` (``device="meta"`` allocates nothing)."""
    with torch.device(device):
        return CausalMaskedDiffWithXvec(cfg)


def expected_flow_shapes(cfg: CausalFlowConfig) -> dict[str, tuple[int, ...]]:
    """``flow.pt`` key -> shape for ``cfg``, in the official file order (meta device)."""
    return {k: tuple(v.shape) for k, v in build_flow(cfg, "meta").state_dict().items()}


def load_flow_checkpoint(flow: CausalMaskedDiffWithXvec, path: str | os.PathLike) -> None:
    """Strictly load ``flow.pt`` into ``flow`` (fp16 -> fp32). Raises ModelDirError /
    CheckpointError (see :func:`cosyvino.families.cosyvoice23.torch.checkpoint.load_strict`)."""
    load_strict(flow, path, config_name=CONFIG_NAME)


def load_flow(model_dir: str | os.PathLike) -> CausalMaskedDiffWithXvec:
    """``cosyvoice2.yaml`` + ``flow.pt`` of an official CosyVoice2 dir -> the flow in eval mode
    without gradients.

    Raises:
        ModelDirError: the directory or a file is missing.
        ConfigError: a bad ``flow:`` section.
        CheckpointError: a corrupt ``flow.pt`` or a key/shape mismatch.
    """
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_flow_config(os.path.join(model_dir, CONFIG_NAME))
    flow = build_flow(cfg)
    load_flow_checkpoint(flow, os.path.join(model_dir, FLOW_FILE))
    return flow.eval().requires_grad_(False)
