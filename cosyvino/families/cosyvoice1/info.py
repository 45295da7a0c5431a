"""``cosyvino info``: a model directory summary without loading the weights into modules."""

from __future__ import annotations

import dataclasses
import os

from cosyvino.converted import is_converted_dir, manifest_runtime, read_manifest, read_speaker_names
from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice1.yaml_config import read_model_config

FILES = ("cosyvoice.yaml", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt", "campplus.onnx",
         "speech_tokenizer_v1.onnx")


def model_info(model_dir: str) -> dict:
    """Config highlights, file sizes (MB), parameter counts and speakers of ``model_dir``.

    A converted dir (``cosyvino convert`` output, :func:`cosyvino.converted.is_converted_dir`)
    is summarized from its manifest instead (:func:`_converted_info`), without torch.

    Raises ModelDirError / ConfigError / CheckpointError (ConvertedModelError for a converted
    dir whose manifest or speakers.json is edited or unreadable).
    """
    from cosyvino.families.cosyvoice1.synthetic import is_synthetic

    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_model_config(model_dir)
    if is_converted_dir(model_dir):
        return _converted_info(model_dir, cfg, is_synthetic(model_dir))
    from cosyvino.families.cosyvoice1.checkpoint import load_spk2info, load_torch_file

    files = {}
    for name in FILES:
        p = os.path.join(model_dir, name)
        files[name] = (f"{os.path.getsize(p) / 1e6:.1f} MB" if os.path.isfile(p) else "absent")
    params = {}
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        p = os.path.join(model_dir, name)
        if os.path.isfile(p):
            sd = load_torch_file(p)
            params[name] = f"{sum(v.numel() for v in sd.values()):,}"
    spk_path = os.path.join(model_dir, "spk2info.pt")
    speakers = list(load_spk2info(spk_path)) if os.path.isfile(spk_path) else []
    return {
        "path": os.path.abspath(model_dir),
        "synthetic": is_synthetic(model_dir),
        **_config_summary(cfg),
        "files": files,
        "parameters": params,
        "speakers": ", ".join(speakers),
        "modes": _modes(model_dir, speakers),
    }


def _converted_info(conv_dir: str, cfg, synthetic: bool) -> dict:
    """:func:`model_info` of a converted dir: runtime and source from the manifest, every file
    it lists with its size (MB, or ``missing``) and precision, speakers from speakers.json."""
    manifest = read_manifest(conv_dir)
    files = {}
    for name, rec in sorted(manifest.get("files", {}).items()):
        p = os.path.join(conv_dir, name)
        size = f"{os.path.getsize(p) / 1e6:.1f} MB" if os.path.isfile(p) else "missing"
        files[name] = f"{size} ({rec['precision']})" if rec.get("precision") else size
    speakers = read_speaker_names(conv_dir)
    return {
        "path": os.path.abspath(conv_dir),
        "converted": manifest_runtime(manifest),
        "source_dir": manifest.get("source_dir"),
        "synthetic": synthetic,
        **_config_summary(cfg),
        "files": files,
        "speakers": ", ".join(speakers),
        "modes": _modes(conv_dir, speakers),
    }


def _modes(model_dir: str, speakers) -> str:
    """The modes a Synthesizer offers on ``model_dir`` (:func:`.modes.modes_for`), comma-joined."""
    from cosyvino.families.cosyvoice1.modes import modes_for

    return ", ".join(modes_for(model_dir, list(speakers)))


def _config_summary(cfg) -> dict:
    return {
        "sample_rate": cfg.sample_rate,
        "llm": {"width": cfg.llm.llm_input_size, "text_encoder_blocks":
                cfg.llm.text_encoder.num_blocks, "llm_blocks": cfg.llm.llm.num_blocks,
                "sampling": dataclasses.asdict(cfg.llm.sampling)},
        "flow": {"encoder_blocks": cfg.flow.encoder.num_blocks,
                 "estimator_channels": list(cfg.flow.estimator.channels),
                 "n_timesteps": cfg.flow.cfm.n_timesteps,
                 "cfg_rate": cfg.flow.cfm.inference_cfg_rate},
        "hift": {"base_channels": cfg.hift.base_channels, "hop_length": cfg.hift.hop_length},
    }
