"""Synthetic checkpoints: random weights in the exact official CosyVoice v1 directory layout.

No machine here can download real weights, and compute cost depends only on shapes, so tests use
``tiny`` and benchmarks use ``300m`` directories made by :func:`make_model`. Written atomically
(temp dir + rename). The LLM head is biased towards EOS so random-weight utterances end at a
plausible length instead of always running to the 20x-text-tokens cap.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Callable

from cosyvino.errors import InputError
from cosyvino.families import synthetic_dir
from cosyvino.families.cosyvoice1.config import ModelConfig
from cosyvino.families.cosyvoice1.presets import PRESETS
from cosyvino.families.cosyvoice1.synthetic_prompt_models import write_prompt_models
from cosyvino.families.cosyvoice1.yaml_writer import render_cosyvoice_yaml

#: the 7 built-in speakers of CosyVoice-300M-SFT (upstream spk2info.pt)
SFT_SPEAKERS = ("中文女", "中文男", "日语男", "粤语女", "英文女", "英文男", "韩语女")
#: per-step EOS probability of the synthetic LLM once EOS is allowed (mean +1/0.03 ~ 33 tokens)
SYNTHETIC_EOS_PROB = 0.03

README = """This directory holds a SYNTHETIC CosyVoice v1 ({preset}) checkpoint made by
`cosyvino make-model`: random weights in the official file layout. It produces noise, not
speech; it exists for tests and benchmarks (compute cost depends only on shapes).
For real speech download CosyVoice-300M-SFT (ModelScope iic/CosyVoice-300M-SFT or
Hugging Face FunAudioLLM/CosyVoice-300M-SFT) and pass its directory with --model-dir.
"""


NO_PROMPT_MODELS = """
campplus.onnx and speech_tokenizer_v1.onnx (the prompt models of voice cloning) are missing:
`onnx` was not installed when this dir was made (pip install onnx, then make it again).
"""


def _randomize(cfg: ModelConfig, seed: int):
    import torch

    from cosyvino.families.cosyvoice1.torch.loading import build_modules

    torch.manual_seed(seed)
    llm, flow, hift = build_modules(cfg)
    with torch.no_grad():
        # Near-uniform speech-token logits, then an EOS bias giving SYNTHETIC_EOS_PROB.
        llm.llm_decoder.weight.mul_(0.05)
        llm.llm_decoder.bias.zero_()
        v = cfg.llm.speech_token_size
        llm.llm_decoder.bias[v] = math.log(SYNTHETIC_EOS_PROB * v / (1 - SYNTHETIC_EOS_PROB))
    return llm, flow, hift


def make_model(preset: str, out_dir: str | os.PathLike, *, seed: int = 0,
               hift_weight_norm: str = "parametrizations", overwrite: bool = False,
               progress: Callable[[str], None] | None = None) -> str:
    """Write a synthetic model directory: cosyvoice.yaml, llm.pt, flow.pt, hift.pt, spk2info.pt
    and (when ``onnx`` is installed) the prompt models campplus.onnx and
    speech_tokenizer_v1.onnx of the same preset
    (:mod:`cosyvino.families.cosyvoice1.synthetic_prompt_models`).

    Args:
        preset: ``"tiny"`` or ``"300m"`` (see :mod:`cosyvino.families.cosyvoice1.presets`).
        out_dir: target directory; must not exist unless ``overwrite``.
        seed: torch seed for the random weights and speaker embeddings.
        hift_weight_norm: ``"parametrizations"`` or ``"weight_g"`` key spelling in hift.pt.
        progress: called with a short message before each file.

    Returns:
        ``out_dir``.

    Raises:
        InputError: unknown preset.
        ModelDirError: ``out_dir`` exists (and not ``overwrite``) or cannot be written.
    """
    import torch

    from cosyvino.families.cosyvoice1.weight_norm import unfold_weight_norm

    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    out_dir = synthetic_dir.new_model_dir(out_dir, overwrite)
    say = progress or (lambda msg: None)
    cfg = PRESETS[preset]()
    with synthetic_dir.atomic_model_dir(out_dir) as tmp:
        say("initialising random weights")
        llm, flow, hift = _randomize(cfg, seed)
        with open(os.path.join(tmp, "cosyvoice.yaml"), "w", encoding="utf-8") as f:
            f.write(render_cosyvoice_yaml(cfg, comment=synthetic_dir.synthetic_comment(preset,
                                                                                       seed)))
        say("writing llm.pt")
        torch.save(llm.state_dict(), os.path.join(tmp, "llm.pt"))
        say("writing flow.pt")
        torch.save(flow.state_dict(), os.path.join(tmp, "flow.pt"))
        say("writing hift.pt")
        torch.save(unfold_weight_norm(hift.state_dict(), hift.weight_normed_parameters(),
                                      hift_weight_norm), os.path.join(tmp, "hift.pt"))
        gen = torch.Generator().manual_seed(seed + 1)
        spk = {name: {"embedding": torch.randn(1, cfg.llm.spk_embed_dim, generator=gen) * 10}
               for name in SFT_SPEAKERS}
        torch.save(spk, os.path.join(tmp, "spk2info.pt"))
        readme = README.format(preset=preset)
        if importlib.util.find_spec("onnx") is not None:
            say("writing campplus.onnx, speech_tokenizer_v1.onnx")
            write_prompt_models(tmp, preset, seed=seed)
        else:  # the SFT model works without them; voice cloning needs them
            say("onnx not installed: no synthetic campplus.onnx / speech_tokenizer_v1.onnx")
            readme += NO_PROMPT_MODELS
        with open(os.path.join(tmp, "README.txt"), "w", encoding="utf-8") as f:
            f.write(readme)
        del llm, flow, hift
    return out_dir


def is_synthetic(model_dir: str | os.PathLike) -> bool:
    """True when ``model_dir`` was made by :func:`make_model` (its yaml says SYNTHETIC)."""
    return synthetic_dir.is_synthetic(model_dir, "cosyvoice.yaml")
