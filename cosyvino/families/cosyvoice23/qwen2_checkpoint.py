"""The state_dict keys and shapes of a Qwen2 decoder inside a CosyVoice2/3 ``llm.pt``.

Sheet v2 §4.3: ``<prefix>model.embed_tokens.weight``, per layer ``self_attn.{q,k,v}_proj.weight``
and ``.bias``, ``self_attn.o_proj.weight``, ``mlp.{gate,up,down}_proj.weight``,
``{input,post_attention}_layernorm.weight``, then ``model.norm.weight`` and ``lm_head.weight``
(``rotary_emb.inv_freq`` is not stored). Order as the official module creates them. Must not
import torch.
"""

from __future__ import annotations

from .qwen2_config import Qwen2Config


def qwen2_state_dict_shapes(cfg: Qwen2Config, prefix: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a transformers ``Qwen2ForCausalLM`` state_dict under ``prefix``
    (``"llm.model."`` in CosyVoice2/3 ``llm.pt``), ``lm_head.weight`` included."""
    d, inter, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_width, cfg.kv_width
    m = f"{prefix}model."
    shapes: dict[str, tuple[int, ...]] = {f"{m}embed_tokens.weight": (cfg.vocab_size, d)}
    for i in range(cfg.num_hidden_layers):
        layer = f"{m}layers.{i}."
        shapes.update({
            f"{layer}self_attn.q_proj.weight": (q, d), f"{layer}self_attn.q_proj.bias": (q,),
            f"{layer}self_attn.k_proj.weight": (kv, d), f"{layer}self_attn.k_proj.bias": (kv,),
            f"{layer}self_attn.v_proj.weight": (kv, d), f"{layer}self_attn.v_proj.bias": (kv,),
            f"{layer}self_attn.o_proj.weight": (d, q),
            f"{layer}mlp.gate_proj.weight": (inter, d),
            f"{layer}mlp.up_proj.weight": (inter, d),
            f"{layer}mlp.down_proj.weight": (d, inter),
            f"{layer}input_layernorm.weight": (d,),
            f"{layer}post_attention_layernorm.weight": (d,),
        })
    shapes[f"{m}norm.weight"] = (d,)
    shapes[f"{prefix}lm_head.weight"] = (cfg.vocab_size, d)
    return shapes
