"""Build the CosyVoice3 flow for a config and load an official ``flow.pt`` strictly.

Key set and shapes must equal the module's exactly (sheet v3 §5.6: 330 tensors at full size,
the rotary ``decoder.estimator.rotary_embed.inv_freq`` buffer included); float16 storage (the
tiny goldens) is upcast to float32. Errors name the file and the keys.
"""

from __future__ import annotations

import os

import torch

from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice3.flow_config import (
    CONFIG_NAME,
    DiTFlowConfig,
    read_flow_config,
)
from cosyvino.families.cosyvoice3.torch.flow import CausalMaskedDiffWithDiT
from cosyvino.families.cosyvoice23.torch.checkpoint import load_strict

FLOW_FILE = "flow.pt"


def build_flow(cfg: DiTFlowConfig, device: str | torch.device = "cpu"
               ) -> CausalMaskedDiffWithDiT:
    """A randomly initialised flow for ``cfg`` (``device="meta"`` allocates nothing)."""
    with torch.device(device):
        return CausalMaskedDiffWithDiT(cfg)


def expected_flow_shapes(cfg: DiTFlowConfig) -> dict[str, tuple[int, ...]]:
    """``flow.pt`` key -> shape for ``cfg``, in the official file order (meta device)."""
    return {k: tuple(v.shape) for k, v in build_flow(cfg, "meta").state_dict().items()}


def load_flow_checkpoint(flow: CausalMaskedDiffWithDiT, path: str | os.PathLike) -> None:
    """Strictly load ``flow.pt`` into ``flow`` (fp16 -> fp32). Raises ModelDirError /
    CheckpointError (see :func:`cosyvino.families.cosyvoice23.torch.checkpoint.load_strict`)."""
    load_strict(flow, path, config_name=CONFIG_NAME)


def load_flow(model_dir: str | os.PathLike) -> CausalMaskedDiffWithDiT:
    """``cosyvoice3.yaml`` + ``flow.pt`` of an official CosyVoice3 dir -> the flow in eval mode
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
