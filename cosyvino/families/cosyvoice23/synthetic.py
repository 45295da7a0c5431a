"""What the CosyVoice2 and CosyVoice3 synthetic-dir makers share: the ``CosyVoice-BlankEN/``
dir (``config.json`` + the shipped Qwen2 tokenizer files), the ``llm.pt`` key mapping of a
Qwen2 speech LM, the official key order of ``hift.pt``, the dtype cast that keeps the tied text
table one storage, and :class:`SyntheticFamily`: module building, checkpoint shapes and the
file-writing sequence both families run with their own values and hooks. Each family's
``synthetic`` module owns its presets, torch modules, yaml, extra files and the stop trick of
its random speech head. Imports torch (lazily).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cosyvino.errors import InputError, ModelDirError
from cosyvino.families.cosyvoice1.synthetic import SFT_SPEAKERS
from cosyvino.families.cosyvoice1.weight_norm import SPELLINGS
from cosyvino.families.cosyvoice23.lm_checkpoint import EMBED_TOKENS_KEY, LM_HEAD_KEY, QWEN_PREFIX
from cosyvino.families.cosyvoice23.qwen2_config import QWEN_CONFIG_FILE, QWEN_DIR, Qwen2Config
from cosyvino.families.synthetic_dir import (
    atomic_model_dir,
    is_synthetic,
    new_model_dir,
    synthetic_comment,
)

#: the public Qwen2 BPE files shipped as package data (copied into ``CosyVoice-BlankEN/``)
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
TOKENIZER_DATA_DIR = os.path.join(os.path.dirname(__file__), "qwen2_tokenizer")
#: the g key suffix of a weight-norm pair in both spellings
_PAIR_G = (".parametrizations.weight.original0", ".weight_g")
DTYPES = ("float32", "float16")
#: the checkpoint files, in the order they are written
CHECKPOINTS = ("llm.pt", "flow.pt", "hift.pt")


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


def official_llm_state_dict(llm, official_keys: Iterable[str], module: str) -> dict:
    """``llm.pt`` content of our Qwen2 speech LM ``llm`` (class name ``module``, for the
    error): ``qwen.X`` -> ``llm.model.model.X``; the text table also as
    ``llm.model.lm_head.weight`` (the SAME tensor, as the tied official module saves it; sheet
    v2 §4.3); keys in the order of ``official_keys`` (the family's ``llm_state_dict_shapes``).

    Raises:
        ValueError: the module has a tensor the official file has no key for (a bug)."""
    ours = llm.state_dict()
    prefix = QWEN_PREFIX + "model."
    out, used = {}, set()
    for key in official_keys:
        name = "qwen.embed_tokens.weight" if key in (EMBED_TOKENS_KEY, LM_HEAD_KEY) else \
            "qwen." + key[len(prefix):] if key.startswith(prefix) else key
        out[key] = ours[name]
        used.add(name)
    extra = sorted(set(ours) - used)
    if extra:
        raise ValueError(f"{module} tensors with no llm.pt key: {extra}")
    return out


def official_state_dicts(llm_sd: dict, flow, hift,
                         hift_weight_norm: str = "parametrizations") -> dict[str, dict]:
    """``{"llm.pt": llm_sd, "flow.pt": ..., "hift.pt": ...}``: hift weight-norm pairs in the
    ``hift_weight_norm`` spelling (``parametrizations`` as the released files, sheet v2 §6.4,
    or ``weight_g``), bias before the pair."""
    from cosyvino.families.cosyvoice1.weight_norm import unfold_weight_norm

    hift_sd = unfold_weight_norm(hift.state_dict(), hift.weight_normed_parameters(),
                                 hift_weight_norm)
    return {"llm.pt": llm_sd, "flow.pt": flow.state_dict(), "hift.pt": bias_before_pair(hift_sd)}


def bias_before_pair(sd: dict) -> dict:
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


def shapes_of(state_dicts: dict[str, dict]) -> dict[str, dict[str, tuple[int, ...]]]:
    """File -> key -> shape of ``state_dicts`` (as :func:`official_state_dicts` returns)."""
    return {name: {k: tuple(v.shape) for k, v in sd.items()} for name, sd in state_dicts.items()}


def save_state_dict(state_dict: dict, path: str, dtype: str) -> None:
    """``torch.save`` of ``state_dict`` cast to ``dtype`` (a :data:`DTYPES` name); tensors
    that share a storage (the tied text table) stay shared."""
    import torch

    if dtype != "float32":  # keeps shared storages shared (the tied text table)
        cast = {}
        state_dict = {k: cast.setdefault(id(v), v.to(getattr(torch, dtype)))
                      for k, v in state_dict.items()}
    torch.save(state_dict, path)


@dataclass(frozen=True)
class SyntheticFamily:
    """One family's side of a synthetic CosyVoice2/3 dir: what differs, as values and hooks.

    ``modules()`` returns ``(lm_class, hift_class, build_flow, llm_state_dict_shapes)`` (a hook
    so torch is imported only when weights are built); ``llm_config(preset)`` the LM config
    the rendered yaml + config.json read back as; ``stop_trick(llm, preset)`` biases the
    random speech head so utterances end (run under ``torch.no_grad``);
    ``write_extras(tmp_dir, say, preset, seed)`` writes the family's other files and returns
    the ``README.txt`` text."""

    name: str
    presets: dict
    preset_type: type
    yaml_name: str
    render_yaml: Callable[..., str]
    llm_config: Callable
    modules: Callable[[], tuple]
    stop_trick: Callable
    write_extras: Callable[[str, Callable[[str], None], object, int], str]

    def preset(self, preset):
        """``preset`` itself when it is a preset object, else ``presets[preset]()``.

        Raises:
            InputError: an unknown preset name (naming the family and the choices)."""
        if isinstance(preset, self.preset_type):
            return preset
        if preset not in self.presets:
            raise InputError(f"unknown {self.name} preset {preset!r}; choose one of "
                             f"{', '.join(self.presets)}")
        return self.presets[preset]()

    def build_modules(self, preset, device: str = "cpu"):
        """``(llm, flow, hift)``: our torch modules for ``preset``, randomly initialised
        (``device="meta"`` allocates nothing; used for the key/shape manifest)."""
        import torch

        lm_class, hift_class, build_flow, _ = self.modules()
        with torch.device(device):
            llm = lm_class(self.llm_config(preset))
            hift = hift_class(preset.hift)
        return llm, build_flow(preset.flow, device), hift

    def official_state_dicts(self, llm, flow, hift, preset,
                             hift_weight_norm: str = "parametrizations") -> dict[str, dict]:
        """``{"llm.pt": ..., "flow.pt": ..., "hift.pt": ...}`` of these modules in the official
        key order (:func:`official_llm_state_dict`, :func:`official_state_dicts`).

        Raises:
            ValueError: the LM has a tensor the official file has no key for (a bug)."""
        llm_keys = self.modules()[3](self.llm_config(preset))
        return official_state_dicts(official_llm_state_dict(llm, llm_keys, type(llm).__name__),
                                    flow, hift, hift_weight_norm)

    def checkpoint_shapes(self, preset) -> dict[str, dict[str, tuple[int, ...]]]:
        """File -> key -> shape of the three checkpoints :meth:`make_model` writes for
        ``preset``, in file order, computed on the meta device (no memory, no weights).

        Raises:
            InputError: an unknown preset name."""
        p = self.preset(preset)
        return shapes_of(self.official_state_dicts(*self.build_modules(p, "meta"), p))

    def randomize(self, preset, seed: int):
        """``(llm, flow, hift)`` with torch seed ``seed``, the stop trick applied."""
        import torch

        torch.manual_seed(seed)
        llm, flow, hift = self.build_modules(preset)
        with torch.no_grad():
            self.stop_trick(llm, preset)
        return llm, flow, hift

    def make_model(self, preset, out_dir: str | os.PathLike, *, seed: int = 0,
                   dtype: str = "float32", hift_weight_norm: str = "parametrizations",
                   overwrite: bool = False,
                   progress: Callable[[str], None] | None = None) -> str:
        """Write a synthetic model dir of this family: the yaml, ``CosyVoice-BlankEN/``,
        ``llm.pt``, ``flow.pt``, ``hift.pt``, ``spk2info.pt``, the family's extras (v2: the
        prompt models when ``onnx`` is installed) and ``README.txt``; atomically.

        Args:
            preset: a preset name (``"tiny"``, ``"0.5b"``: the family's ``presets``) or object.
            out_dir: target directory; must not exist unless ``overwrite``.
            seed: torch seed of the random weights; the SFT speaker embeddings use
                ``seed + 1`` (v2 prompt models: numpy seed ``seed`` / ``seed + 1``).
            dtype: ``"float32"`` (as released checkpoints) or ``"float16"`` (as the tiny
                goldens; half the size; loaders upcast). Tied tensors stay one storage.
            hift_weight_norm: ``"parametrizations"`` (the released file) or ``"weight_g"`` key
                spelling in hift.pt.
            overwrite: replace an existing ``out_dir``.
            progress: called with a short message before each file.

        Returns:
            ``out_dir`` (absolute).

        Raises:
            InputError: unknown preset, dtype or weight-norm spelling.
            ModelDirError: ``out_dir`` exists (and not ``overwrite``) or cannot be written."""
        import torch

        p = self.preset(preset)
        if dtype not in DTYPES:
            raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        if hift_weight_norm not in SPELLINGS:
            raise InputError(f"unknown weight-norm spelling {hift_weight_norm!r}; choose one of "
                             f"{', '.join(SPELLINGS)}")
        out_dir = new_model_dir(out_dir, overwrite)
        say = progress or (lambda msg: None)
        with atomic_model_dir(out_dir) as tmp:
            say("initialising random weights")
            llm, flow, hift = self.randomize(p, seed)
            with open(os.path.join(tmp, self.yaml_name), "w", encoding="utf-8") as f:
                f.write(self.render_yaml(p, comment=synthetic_comment(p.name, seed)))
            write_qwen_dir(tmp, p.qwen)
            sds = self.official_state_dicts(llm, flow, hift, p, hift_weight_norm)
            del llm, flow, hift
            for name in CHECKPOINTS:
                say(f"writing {name}")
                save_state_dict(sds.pop(name), os.path.join(tmp, name), dtype)
            gen = torch.Generator().manual_seed(seed + 1)
            spk = {name: {"embedding": torch.randn(1, p.spk_embed_dim, generator=gen) * 10}
                   for name in SFT_SPEAKERS}
            torch.save(spk, os.path.join(tmp, "spk2info.pt"))
            readme = self.write_extras(tmp, say, p, seed)
            with open(os.path.join(tmp, "README.txt"), "w", encoding="utf-8") as f:
                f.write(readme)
        return out_dir

    def is_synthetic(self, model_dir: str | os.PathLike) -> bool:
        """True when ``model_dir`` was made by :meth:`make_model` (its yaml says SYNTHETIC)."""
        return is_synthetic(model_dir, self.yaml_name)


__all__ = ["CHECKPOINTS", "DTYPES", "TOKENIZER_DATA_DIR", "TOKENIZER_FILES", "SyntheticFamily",
           "bias_before_pair", "official_llm_state_dict", "official_state_dicts",
           "qwen2_config_json", "save_state_dict", "shapes_of", "write_qwen_dir"]
