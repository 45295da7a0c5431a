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
(temp dir + rename). The speech head is biased towards EOS so random-weight utterances end at a
plausible length. Imports torch (lazily).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable

from cosyvino.errors import InputError, ModelDirError
from cosyvino.families.cosyvoice1.synthetic import SFT_SPEAKERS, SYNTHETIC_EOS_PROB
from cosyvino.families.cosyvoice1.weight_norm import SPELLINGS
from cosyvino.families.cosyvoice2.config import YAML_NAME, CosyVoice2LLMConfig
from cosyvino.families.cosyvoice2.presets import PRESETS, CosyVoice2Preset
from cosyvino.families.cosyvoice2.synthetic_prompt_models import write_prompt_models
from cosyvino.families.cosyvoice2.yaml_writer import render_cosyvoice2_yaml
from cosyvino.families.cosyvoice23.qwen2_config import (
    QWEN_CONFIG_FILE,
    QWEN_DIR,
    Qwen2Config,
)
from cosyvino.fileutil import replace_dir

#: the public Qwen2 BPE files shipped as package data (copied into ``CosyVoice-BlankEN/``)
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
TOKENIZER_DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "cosyvoice23",
                                  "qwen2_tokenizer")
#: logit bias of the two stop ids other than EOS (6562 unused, 6563 FILL): never drawn
_OTHER_STOP_BIAS = -30.0
#: the g key suffix of a weight-norm pair in both spellings
_PAIR_G = (".parametrizations.weight.original0", ".weight_g")
DTYPES = ("float32", "float16")

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


def qwen2_config_json(qwen: Qwen2Config) -> dict:
    """``CosyVoice-BlankEN/config.json`` for ``qwen``, in the layout of the transformers
    4.51.3 ``Qwen2Config`` file (keys of the tiny-c golden's; values not read by cosyvino are
    Qwen2-0.5B's)."""
    data = {
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
        "hidden_act": "silu", "hidden_size": qwen.hidden_size, "initializer_range": 0.02,
        "intermediate_size": qwen.intermediate_size, "max_position_embeddings": 32768,
        "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": qwen.num_attention_heads,
        "num_hidden_layers": qwen.num_hidden_layers,
        "num_key_value_heads": qwen.num_key_value_heads, "rms_norm_eps": qwen.rms_norm_eps,
        "rope_scaling": None, "rope_theta": qwen.rope_theta, "sliding_window": 32768,
        "tie_word_embeddings": qwen.tie_word_embeddings, "torch_dtype": "float32",
        "transformers_version": "4.51.3", "use_cache": True, "use_sliding_window": False,
        "vocab_size": qwen.vocab_size,
    }
    if qwen.head_dim:
        data["head_dim"] = qwen.head_dim
    return data


# ---- module trees -> official state_dicts ----------------------------------------------------

def build_modules(preset: CosyVoice2Preset, device: str = "cpu"):
    """``(llm, flow, hift)``: our torch modules for ``preset``, randomly initialised
    (``device="meta"`` allocates nothing; used for the key/shape manifest)."""
    import torch

    from cosyvino.families.cosyvoice2.torch.flow_loading import build_flow
    from cosyvino.families.cosyvoice2.torch.hift import HiFTGenerator
    from cosyvino.families.cosyvoice2.torch.llm import CosyVoice2LM

    with torch.device(device):
        llm = CosyVoice2LM(llm_config(preset))
        hift = HiFTGenerator(preset.hift)
    return llm, build_flow(preset.flow, device), hift


def official_llm_state_dict(llm, cfg: CosyVoice2LLMConfig) -> dict:
    """``llm.pt`` content of our :class:`~.torch.llm.CosyVoice2LM`: ``qwen.X`` ->
    ``llm.model.model.X``; the text table also as ``llm.model.lm_head.weight`` (the SAME
    tensor, as the tied official module saves it; sheet v2 §4.3); official key order.

    Raises:
        ValueError: the module has a tensor the official file has no key for (a bug)."""
    from cosyvino.families.cosyvoice2.llm_checkpoint import (
        EMBED_TOKENS_KEY,
        LM_HEAD_KEY,
        QWEN_PREFIX,
        llm_state_dict_shapes,
    )

    ours = llm.state_dict()
    prefix = QWEN_PREFIX + "model."
    out, used = {}, set()
    for key in llm_state_dict_shapes(cfg):
        name = "qwen.embed_tokens.weight" if key in (EMBED_TOKENS_KEY, LM_HEAD_KEY) else \
            "qwen." + key[len(prefix):] if key.startswith(prefix) else key
        out[key] = ours[name]
        used.add(name)
    extra = sorted(set(ours) - used)
    if extra:
        raise ValueError(f"CosyVoice2LM tensors with no llm.pt key: {extra}")
    return out


def official_state_dicts(llm, flow, hift, cfg: CosyVoice2LLMConfig,
                         hift_weight_norm: str = "parametrizations") -> dict[str, dict]:
    """``{"llm.pt": ..., "flow.pt": ..., "hift.pt": ...}``: what :func:`make_model` saves for
    these modules (hift weight-norm pairs in the ``hift_weight_norm`` spelling:
    ``parametrizations`` as the released file, sheet v2 §6.4, or ``weight_g``)."""
    from cosyvino.families.cosyvoice1.weight_norm import unfold_weight_norm

    hift_sd = unfold_weight_norm(hift.state_dict(), hift.weight_normed_parameters(),
                                 hift_weight_norm)
    return {"llm.pt": official_llm_state_dict(llm, cfg), "flow.pt": flow.state_dict(),
            "hift.pt": _bias_before_pair(hift_sd)}


def _bias_before_pair(sd: dict) -> dict:
    """The official key order of a weight-normed module: torch's weight norm replaces the
    weight after the bias was registered (``parametrizations`` moves it into a submodule), so
    ``X.bias`` comes before the (g, v) pair."""
    out = {}
    for key, value in sd.items():
        for g_suffix in _PAIR_G:
            if key.endswith(g_suffix) and key[: -len(g_suffix)] + ".bias" in sd:
                bias = key[: -len(g_suffix)] + ".bias"
                out[bias] = sd[bias]
        out.setdefault(key, value)
    return out


def checkpoint_shapes(preset: str | CosyVoice2Preset) -> dict[str, dict[str, tuple[int, ...]]]:
    """File -> key -> shape of the three checkpoints :func:`make_model` writes for ``preset``,
    in file order, computed on the meta device (no memory, no weights written).

    Raises: InputError for an unknown preset name."""
    p = _preset(preset)
    llm, flow, hift = build_modules(p, "meta")
    return {name: {k: tuple(v.shape) for k, v in sd.items()}
            for name, sd in official_state_dicts(llm, flow, hift, llm_config(p)).items()}


def _preset(preset: str | CosyVoice2Preset) -> CosyVoice2Preset:
    if isinstance(preset, CosyVoice2Preset):
        return preset
    if preset not in PRESETS:
        raise InputError(f"unknown CosyVoice2 preset {preset!r}; choose one of "
                         f"{', '.join(PRESETS)}")
    return PRESETS[preset]()


def _randomize(preset: CosyVoice2Preset, seed: int):
    import torch

    torch.manual_seed(seed)
    llm, flow, hift = build_modules(preset)
    with torch.no_grad():
        # Near-uniform speech-token logits, then an EOS bias giving SYNTHETIC_EOS_PROB per step
        # once EOS is allowed; the other two stop ids (6562, 6563) practically never drawn.
        llm.llm_decoder.weight.mul_(0.05)
        llm.llm_decoder.bias.zero_()
        v = preset.speech_token_size
        llm.llm_decoder.bias[v] = math.log(SYNTHETIC_EOS_PROB * v / (1 - SYNTHETIC_EOS_PROB))
        llm.llm_decoder.bias[v + 1:] = _OTHER_STOP_BIAS
    return llm, flow, hift


def _save(state_dict: dict, path: str, dtype: str) -> None:
    import torch

    if dtype != "float32":  # keeps shared storages shared (the tied text table)
        cast = {}
        state_dict = {k: cast.setdefault(id(v), v.to(getattr(torch, dtype)))
                      for k, v in state_dict.items()}
    torch.save(state_dict, path)


def write_qwen_dir(out_dir: str, qwen: Qwen2Config) -> str:
    """Write ``<out_dir>/CosyVoice-BlankEN/``: ``config.json`` for ``qwen`` and the shipped
    tokenizer files. Returns the dir. Raises ModelDirError when the package data is missing."""
    qdir = os.path.join(out_dir, QWEN_DIR)
    os.makedirs(qdir, exist_ok=True)
    with open(os.path.join(qdir, QWEN_CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(qwen2_config_json(qwen), f, indent=2)
        f.write("\n")
    for name in TOKENIZER_FILES:
        src = os.path.join(TOKENIZER_DATA_DIR, name)
        if not os.path.isfile(src):
            raise ModelDirError(f"the packaged Qwen2 tokenizer file {src} is missing (a broken "
                                "cosyvino install?)", src)
        shutil.copyfile(src, os.path.join(qdir, name))
    return qdir


def make_model(preset: str, out_dir: str | os.PathLike, *, seed: int = 0,
               dtype: str = "float32", hift_weight_norm: str = "parametrizations",
               overwrite: bool = False,
               progress: Callable[[str], None] | None = None) -> str:
    """Write a synthetic CosyVoice2 model dir (module docstring lists the files).

    Args:
        preset: ``"tiny"`` or ``"0.5b"`` (:mod:`.presets`).
        out_dir: target directory; must not exist unless ``overwrite``.
        seed: torch seed of the random weights and speaker embeddings (prompt models: numpy
            seed ``seed`` / ``seed + 1``).
        dtype: ``"float32"`` (as released checkpoints) or ``"float16"`` (as the tiny goldens;
            half the size; loaders upcast).
        hift_weight_norm: ``"parametrizations"`` (the released file) or ``"weight_g"`` key
            spelling in hift.pt.
        progress: called with a short message before each file.

    Returns:
        ``out_dir`` (absolute).

    Raises:
        InputError: unknown preset, dtype or weight-norm spelling.
        ModelDirError: ``out_dir`` exists (and not ``overwrite``) or cannot be written.
    """
    import torch

    p = _preset(preset)
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if hift_weight_norm not in SPELLINGS:
        raise InputError(f"unknown weight-norm spelling {hift_weight_norm!r}; choose one of "
                         f"{', '.join(SPELLINGS)}")
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out_dir) and not overwrite:
        raise ModelDirError(f"{out_dir} already exists; pick a new directory or use "
                            "--overwrite (overwrite=True)", out_dir)
    say = progress or (lambda msg: None)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        say("initialising random weights")
        llm, flow, hift = _randomize(p, seed)
        with open(os.path.join(tmp, YAML_NAME), "w", encoding="utf-8") as f:
            f.write(render_cosyvoice2_yaml(
                p, comment=f"SYNTHETIC random-weight checkpoint (preset {p.name}, seed {seed}) "
                           "made by cosyvino make-model"))
        write_qwen_dir(tmp, p.qwen)
        sds = official_state_dicts(llm, flow, hift, llm_config(p), hift_weight_norm)
        del llm, flow, hift
        for name in ("llm.pt", "flow.pt", "hift.pt"):
            say(f"writing {name}")
            _save(sds.pop(name), os.path.join(tmp, name), dtype)
        gen = torch.Generator().manual_seed(seed + 1)
        spk = {name: {"embedding": torch.randn(1, p.spk_embed_dim, generator=gen) * 10}
               for name in SFT_SPEAKERS}
        torch.save(spk, os.path.join(tmp, "spk2info.pt"))
        readme = README.format(preset=p.name)
        if importlib.util.find_spec("onnx") is not None:
            say("writing campplus.onnx, speech_tokenizer_v2.onnx")
            write_prompt_models(tmp, p.name, seed=seed)
        else:  # SFT works without them; voice cloning needs them
            say("onnx not installed: no synthetic campplus.onnx / speech_tokenizer_v2.onnx")
            readme += NO_PROMPT_MODELS
        with open(os.path.join(tmp, "README.txt"), "w", encoding="utf-8") as f:
            f.write(readme)
        replace_dir(tmp, out_dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelDirError(f"cannot write model directory {out_dir}: {e}", out_dir) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def is_synthetic(model_dir: str | os.PathLike) -> bool:
    """True when ``model_dir`` was made by :func:`make_model` (its yaml says SYNTHETIC)."""
    try:
        with open(os.path.join(os.fspath(model_dir), YAML_NAME), encoding="utf-8") as f:
            return "SYNTHETIC" in f.read(512)
    except OSError:
        return False
