"""Our PyTorch implementation of the CosyVoice v1 architecture.

Module and parameter names follow upstream so official state_dicts load strictly. Modules are
written to export cleanly: explicit cache tensors in and out, no data-dependent Python control
flow inside a forward, random numbers passed in as tensors.
"""
