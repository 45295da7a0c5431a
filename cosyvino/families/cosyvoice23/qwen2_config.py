"""The Qwen2 architecture of ``CosyVoice-BlankEN/config.json`` (CosyVoice2 and CosyVoice3).

Both families build their speech LM around transformers' ``Qwen2ForCausalLM`` created from
``<model_dir>/CosyVoice-BlankEN`` (sheet v2 §1 "About CosyVoice-BlankEN", §4.1, §4.2). Only
``config.json`` (architecture) and the tokenizer files matter: ``llm.pt`` overwrites every weight.
This module reads the architecture values into :class:`Qwen2Config`; it must not import torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from cosyvino.errors import ConfigError, ModelDirError

#: the Qwen2 HF directory inside an official CosyVoice2/3 model dir (sheet v2 §1)
QWEN_DIR = "CosyVoice-BlankEN"
#: its architecture file
QWEN_CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Qwen2Config:
    """Qwen2 decoder hyperparameters (names as in ``config.json``).

    CosyVoice2-0.5B (Qwen2-0.5B): hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864,
    vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings (sheet v2 §4.1-4.2).
    ``head_dim`` is ``hidden_size // num_attention_heads`` unless the file names one.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    head_dim: int = 0  # 0: hidden_size // num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        """Width of one attention head (64 for the 0.5B size)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_width(self) -> int:
        """Output width of k_proj / v_proj: ``num_key_value_heads * head_dim`` (128 at 0.5B)."""
        return self.num_key_value_heads * self.attention_head_dim

    @property
    def q_width(self) -> int:
        """Output width of q_proj: ``num_attention_heads * head_dim`` (896 at 0.5B)."""
        return self.num_attention_heads * self.attention_head_dim


#: CosyVoice2-0.5B's Qwen2 (sheet v2 source notes: the Qwen2-0.5B values)
QWEN2_0_5B = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)

_INT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")


def qwen2_config_from_dict(data: dict, path: str) -> Qwen2Config:
    """Validate a parsed ``config.json`` (``path`` names the file in errors).

    Raises:
        ConfigError: not a Qwen2 config (``model_type``), a missing or non-positive size, heads
            that do not divide, or a feature this decoder does not implement (non-SiLU
            activation, ``rope_scaling``, sliding-window attention).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object", path)
    model_type = data.get("model_type")
    if model_type != "qwen2":
        raise ConfigError(f"{path}: model_type is {model_type!r}, expected 'qwen2' (the "
                          f"{QWEN_DIR} dir of a CosyVoice2/3 model)", path)
    values = {}
    for key in _INT_KEYS:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{path}: '{key}' must be a positive integer, got {value!r}", path)
        values[key] = value
    for key, default in (("rope_theta", 10000.0), ("rms_norm_eps", 1e-6)):
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{path}: '{key}' must be a positive number, got {value!r}", path)
        values[key] = float(value)
    head_dim = data.get("head_dim") or 0
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 0:
        raise ConfigError(f"{path}: 'head_dim' must be a positive integer, got {head_dim!r}", path)
    if not head_dim and values["hidden_size"] % values["num_attention_heads"]:
        raise ConfigError(f"{path}: hidden_size {values['hidden_size']} is not a multiple of "
                          f"num_attention_heads {values['num_attention_heads']}", path)
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise ConfigError(f"{path}: num_attention_heads {values['num_attention_heads']} is not a "
                          f"multiple of num_key_value_heads {values['num_key_value_heads']}", path)
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{path}: 'hidden_act' is {act!r}; the Qwen2 decoder here implements "
                          "'silu' only", path)
    if data.get("rope_scaling") not in (None, {}):
        raise ConfigError(f"{path}: 'rope_scaling' is set ({data['rope_scaling']!r}); only plain "
                          "RoPE is implemented", path)
    if data.get("use_sliding_window", False):
        raise ConfigError(f"{path}: 'use_sliding_window' is true; only full causal attention "
                          "is implemented", path)
    return Qwen2Config(**values, tie_word_embeddings=bool(data.get("tie_word_embeddings", True)),
                       head_dim=head_dim)


def read_qwen2_config(model_dir: str | os.PathLike) -> Qwen2Config:
    """Read ``<model_dir>/CosyVoice-BlankEN/config.json``.

    Raises:
        ModelDirError: the file is missing or unreadable.
        ConfigError: it is not JSON or not a supported Qwen2 config (:func:`qwen2_config_from_dict`).
    """
    path = os.path.join(os.fspath(model_dir), QWEN_DIR, QWEN_CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ModelDirError(f"Qwen2 config not found: {path} (a CosyVoice2/3 model dir holds "
                            f"{QWEN_DIR}/ with config.json and the tokenizer files)", path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDirError(f"cannot read {path}: {e}", path) from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}", path) from None
    return qwen2_config_from_dict(data, path)
