"""Synthetic CosyVoice3 checkpoints: random weights in the exact official directory layout.

No machine here can download Fun-CosyVoice3-0.5B, and compute cost depends only on shapes, so
tests use ``tiny`` dirs and benchmarks ``0.5b`` dirs made by :func:`make_model` (presets:
:mod:`.presets`). The layout is the official one (sheet v3 §1): ``cosyvoice3.yaml`` (the recipe
format, :mod:`.yaml_writer`), ``llm.pt`` (the tied text table under both
``llm.model.model.embed_tokens.weight`` and ``llm.model.lm_head.weight``, one storage),
``flow.pt`` (with the rotary ``inv_freq`` buffer), ``hift.pt`` (weight-norm pairs in the
``parametrizations`` spelling, bias before the pair), ``spk2info.pt`` (SFT speakers
``{"embedding": [1, 192]}``) and ``CosyVoice-BlankEN/`` (config.json + the shipped Qwen2
tokenizer files). Key sets, order and shapes are the reference manifest's (tested). No prompt
models are written: cosyvino does not run the v3 ones yet (recordings are refused). Written
atomically (temp dir + rename); the file sequence and the pieces shared with v2 are in
:mod:`cosyvino.families.cosyvoice23.synthetic`.

The v3 speech head has no bias and HEAD's decoding lets a stop id through from the first
step (:mod:`.decoding`), so the v2 trick (an EOS bias, EOS masked until min_len) is
unavailable: here the last hidden feature is made a constant of the residual stream (the same
value in that column of every embedding row, no layer writes to it) and serves as the bias; the
EOS row switches on when another feature passes a threshold, about
:data:`SYNTHETIC_EOS_PROB` of the steps (:func:`_stop_after_a_few_seconds`); the other stop
rows read the constant negatively (never drawn).
Imports torch (lazily).
"""

from __future__ import annotations

from cosyvino.families.cosyvoice3.config import YAML_NAME, CosyVoice3LLMConfig
from cosyvino.families.cosyvoice3.presets import PRESETS, CosyVoice3Preset
from cosyvino.families.cosyvoice3.yaml_writer import render_cosyvoice3_yaml
from cosyvino.families.cosyvoice23.synthetic import DTYPES, SyntheticFamily, write_qwen_dir

#: per-step probability of EOS (mean utterance ~100 tokens, 4 s at 25 Hz; v3 decoding lets it
#: through from the first step, so v1/v2's 0.03 would give ~1.3 s)
SYNTHETIC_EOS_PROB = 0.01
#: EOS logit per standard deviation of the switch feature past its threshold (module docstring)
_EOS_MARGIN = 40.0
#: logit of the stop rows other than EOS (never drawn)
_OTHER_STOP_LOGIT = -30.0
#: the constant the residual stream carries in its last feature (about the rms of the rest)
_CARRIER_SCALE = 1.0

README = """This directory holds a SYNTHETIC CosyVoice3 ({preset}) checkpoint made by
`cosyvino make-model --family cosyvoice3`: random weights in the official file layout. It
produces noise, not speech; it exists for tests and benchmarks (compute cost depends only on
shapes). For real speech download Fun-CosyVoice3-0.5B-2512 and pass its directory with
--model-dir.
"""


def llm_config(preset: CosyVoice3Preset) -> CosyVoice3LLMConfig:
    """The ``CosyVoice3LM`` config the rendered yaml + config.json of ``preset`` read back as."""
    d = preset.qwen.hidden_size
    return CosyVoice3LLMConfig(llm_input_size=d, llm_output_size=d,
                               speech_token_size=preset.speech_token_size, qwen=preset.qwen)


def _stop_after_a_few_seconds(llm, preset: CosyVoice3Preset) -> None:
    """The EOS switch (module docstring): feature ``j`` (the last) is a constant of the
    residual stream, feature ``k`` (the one before) varies with the history; the EOS row's
    logit ``A (h_k - t h_j / c)`` is far above every other logit when ``h_k`` passes its
    ``1 - SYNTHETIC_EOS_PROB`` quantile ``t`` (measured over the positions of one random
    prefix) and far below otherwise. The nucleus draw keeps its most likely tokens, so an EOS
    with a small steady probability would never be kept; a rare dominant one stops with about
    that probability per step."""
    import torch

    qwen, j = llm.qwen, llm.cfg.llm_input_size - 1
    k = j - 1
    carrier = _CARRIER_SCALE * float(qwen.embed_tokens.weight[:, :j].std())
    qwen.embed_tokens.weight[:, j] = carrier
    llm.speech_embedding.weight[:, j] = carrier
    for layer in qwen.layers:  # nothing writes into the carrier
        layer.self_attn.o_proj.weight[j] = 0
        layer.mlp.down_proj.weight[j] = 0
    gen = torch.Generator().manual_seed(0)
    rows = llm.speech_embedding.weight[torch.randint(0, preset.speech_token_size, (1, 256),
                                                     generator=gen)]
    cfg = qwen.cfg
    empty = torch.zeros(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, 0,
                        cfg.attention_head_dim)
    h = qwen(rows, empty, empty)[0][0, 32:]  # past the first positions
    seen_j = float(h[:, j].mean())
    t = float(torch.quantile(h[:, k], 1 - SYNTHETIC_EOS_PROB))
    gain = _EOS_MARGIN / float(h[:, k].std())
    head = llm.llm_decoder.weight
    head.mul_(0.05)  # near-uniform speech-token logits
    head[:, j] = 0
    head[llm.cfg.eos_token, :] = 0
    head[llm.cfg.eos_token, k] = gain
    head[llm.cfg.eos_token, j] = -gain * t / seen_j
    others = [i for i in llm.cfg.stop_token_ids if i != llm.cfg.eos_token]
    head[others, :] = 0
    head[others, j] = _OTHER_STOP_LOGIT / seen_j


def _modules():
    from cosyvino.families.cosyvoice3.llm_checkpoint import llm_state_dict_shapes
    from cosyvino.families.cosyvoice3.torch.flow_loading import build_flow
    from cosyvino.families.cosyvoice3.torch.hift import CausalHiFTGenerator
    from cosyvino.families.cosyvoice3.torch.llm import CosyVoice3LM

    return CosyVoice3LM, CausalHiFTGenerator, build_flow, llm_state_dict_shapes


FAMILY = SyntheticFamily(
    name="CosyVoice3", presets=PRESETS, preset_type=CosyVoice3Preset, yaml_name=YAML_NAME,
    render_yaml=render_cosyvoice3_yaml, llm_config=llm_config, modules=_modules,
    stop_trick=_stop_after_a_few_seconds,
    write_extras=lambda tmp, say, p, seed: README.format(preset=p.name))


#: the public API: :meth:`SyntheticFamily.make_model` (arguments, errors),
#: :meth:`~SyntheticFamily.is_synthetic`, :meth:`~SyntheticFamily.checkpoint_shapes`
make_model = FAMILY.make_model
is_synthetic = FAMILY.is_synthetic
checkpoint_shapes = FAMILY.checkpoint_shapes


__all__ = ["DTYPES", "FAMILY", "SYNTHETIC_EOS_PROB", "checkpoint_shapes", "is_synthetic",
           "llm_config", "make_model", "write_qwen_dir"]
