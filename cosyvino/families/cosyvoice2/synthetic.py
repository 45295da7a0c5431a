"""Synthetic CosyVoice2 checkpoints: random weights in the exact official directory layout.

No machine here can download CosyVoice2-0.5B, and compute cost depends only on shapes, so tests
use ``tiny`` dirs and benchmarks ``0.5b`` dirs made by :func:`make_model` (presets:
:mod:`.presets`). The layout is the official one (sheet v2 §1): ``cosyvoice2.yaml`` (the recipe
format, :mod:`.yaml_writer`), ``llm.pt`` (the tied text table stored under both
``llm.model.model.embed_tokens.weight`` and ``llm.model.lm_head.weight``, one storage),
``flow.pt``, ``hift.pt`` (weight-norm pairs in the ``parametrizations`` spelling),
``spk2info.pt`` (SFT speakers ``{"embedding": [1, 192]}``), ``CosyVoice-BlankEN/``
(``config.json`` of the preset's Qwen2 size and the public Qwen2 tokenizer files shipped in
:mod:`cosyvino.families.cosyvoice23`) and, when ``onnx`` is installed, ``campplus.onnx`` +
``speech_tokenizer_v2.onnx`` stand-ins (:mod:`.synthetic_prompt_models`). Written atomically
(temp dir + rename). The file sequence and the pieces shared with v3 are in
:mod:`cosyvino.families.cosyvoice23.synthetic`. The speech head is biased towards EOS so
random-weight utterances end at a plausible length. Imports torch (lazily).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

from cosyvino.families.cosyvoice1.synthetic import SYNTHETIC_EOS_PROB
from cosyvino.families.cosyvoice2.config import YAML_NAME, CosyVoice2LLMConfig
from cosyvino.families.cosyvoice2.presets import PRESETS, CosyVoice2Preset
from cosyvino.families.cosyvoice2.synthetic_prompt_models import write_prompt_models
from cosyvino.families.cosyvoice2.yaml_writer import render_cosyvoice2_yaml
from cosyvino.families.cosyvoice23.synthetic import (
    DTYPES,
    TOKENIZER_DATA_DIR,
    TOKENIZER_FILES,
    SyntheticFamily,
    qwen2_config_json,
    write_qwen_dir,
)

#: logit bias of the two stop ids other than EOS (6562 unused, 6563 FILL): never drawn
_OTHER_STOP_BIAS = -30.0

README = """This directory holds a SYNTHETIC CosyVoice2 ({preset}) checkpoint made by
`cosyvino make-model --family cosyvoice2`: random weights in the official file layout. It
produces noise, not speech; it exists for tests and benchmarks (compute cost depends only on
shapes). For real speech download CosyVoice2-0.5B (ModelScope iic/CosyVoice2-0.5B or Hugging Face
FunAudioLLM/CosyVoice2-0.5B) and pass its directory with --model-dir.
"""

NO_PROMPT_MODELS = """
campplus.onnx and speech_tokenizer_v2.onnx (the prompt models of voice cloning) are missing:
`onnx` was not installed when this dir was made (pip install onnx, then make it again).
"""


def llm_config(preset: CosyVoice2Preset) -> CosyVoice2LLMConfig:
    """The ``Qwen2LM`` config the rendered yaml + config.json of ``preset`` read back as."""
    d = preset.qwen.hidden_size
    return CosyVoice2LLMConfig(llm_input_size=d, llm_output_size=d,
                               speech_token_size=preset.speech_token_size, qwen=preset.qwen,
                               sampling=preset.sampling)


def _stop_bias(llm, preset: CosyVoice2Preset) -> None:
    # Near-uniform speech-token logits, then an EOS bias giving SYNTHETIC_EOS_PROB per step
    # once EOS is allowed; the other two stop ids (6562, 6563) practically never drawn.
    llm.llm_decoder.weight.mul_(0.05)
    llm.llm_decoder.bias.zero_()
    v = preset.speech_token_size
    llm.llm_decoder.bias[v] = math.log(SYNTHETIC_EOS_PROB * v / (1 - SYNTHETIC_EOS_PROB))
    llm.llm_decoder.bias[v + 1:] = _OTHER_STOP_BIAS


def _modules():
    from cosyvino.families.cosyvoice2.llm_checkpoint import llm_state_dict_shapes
    from cosyvino.families.cosyvoice2.torch.flow_loading import build_flow
    from cosyvino.families.cosyvoice2.torch.hift import HiFTGenerator
    from cosyvino.families.cosyvoice2.torch.llm import CosyVoice2LM

    return CosyVoice2LM, HiFTGenerator, build_flow, llm_state_dict_shapes


def _prompt_models(tmp: str, say: Callable[[str], None], p: CosyVoice2Preset, seed: int) -> str:
    readme = README.format(preset=p.name)
    if importlib.util.find_spec("onnx") is not None:
        say("writing campplus.onnx, speech_tokenizer_v2.onnx")
        write_prompt_models(tmp, p.name, seed=seed)
    else:  # SFT works without them; voice cloning needs them
        say("onnx not installed: no synthetic campplus.onnx / speech_tokenizer_v2.onnx")
        readme += NO_PROMPT_MODELS
    return readme


FAMILY = SyntheticFamily(
    name="CosyVoice2", presets=PRESETS, preset_type=CosyVoice2Preset, yaml_name=YAML_NAME,
    render_yaml=render_cosyvoice2_yaml, llm_config=llm_config, modules=_modules,
    stop_trick=_stop_bias, write_extras=_prompt_models)


#: the public API: :meth:`SyntheticFamily.make_model` (arguments, errors),
#: :meth:`~SyntheticFamily.is_synthetic`, :meth:`~SyntheticFamily.checkpoint_shapes`
make_model = FAMILY.make_model
is_synthetic = FAMILY.is_synthetic
checkpoint_shapes = FAMILY.checkpoint_shapes


__all__ = ["DTYPES", "FAMILY", "TOKENIZER_DATA_DIR", "TOKENIZER_FILES", "checkpoint_shapes",
           "is_synthetic", "llm_config", "make_model", "qwen2_config_json", "write_qwen_dir"]
