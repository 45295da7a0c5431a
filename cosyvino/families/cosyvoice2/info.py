"""``cosyvino info`` for an official CosyVoice2 dir: config highlights, files, parameter counts,
speakers, the modes a Synthesizer offers and whether it takes recordings (the prompt models),
without building modules (sheet v2 §1, §3.7, §4.1).
"""

from __future__ import annotations

import dataclasses
import os

from cosyvino.errors import ModelDirError

from .config import YAML_NAME, read_cosyvoice2_config

#: the files of an official CosyVoice2 dir (sheet v2 §1), the ones ``info`` sizes
FILES = (YAML_NAME, "llm.pt", "flow.pt", "hift.pt", "spk2info.pt", "campplus.onnx",
         "speech_tokenizer_v2.onnx", "CosyVoice-BlankEN/config.json",
         "CosyVoice-BlankEN/vocab.json", "CosyVoice-BlankEN/merges.txt")


def model_info(model_dir: str) -> dict:
    """The summary dict of an official CosyVoice2 dir (same layout as the v1 summary where
    the fields exist: ``path``, ``family``, ``sample_rate``, ``llm``, ``files`` (MB or
    ``absent``), ``parameters`` (per .pt file), ``speakers`` (SFT and zero-shot voices)),
    plus ``synthetic``, ``modes`` (:func:`.modes.modes_for`) and ``recordings`` (whether
    ``prompt_audio`` / ``source_audio`` / ``voices add`` work: the prompt models are there).

    Raises ModelDirError / ConfigError / CheckpointError (a checkpoint that cannot be read)."""
    from cosyvino.families.cosyvoice1.checkpoint import load_torch_file

    from .modes import modes_for
    from .speakers import load_cosyvoice2_spk2info
    from .synthetic import is_synthetic

    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_cosyvoice2_config(model_dir)
    q = cfg.llm.qwen
    files = {}
    for name in FILES:
        p = os.path.join(model_dir, name)
        files[name] = f"{os.path.getsize(p) / 1e6:.1f} MB" if os.path.isfile(p) else "absent"
    params = {}
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        p = os.path.join(model_dir, name)
        if os.path.isfile(p):
            params[name] = f"{sum(v.numel() for v in load_torch_file(p).values()):,}"
    spk_path = os.path.join(model_dir, "spk2info.pt")
    speakers = load_cosyvoice2_spk2info(spk_path) if os.path.isfile(spk_path) else {}
    return {
        "path": os.path.abspath(model_dir),
        "family": "cosyvoice2",
        "synthetic": is_synthetic(model_dir),
        "sample_rate": cfg.sample_rate,
        "llm": {"width": q.hidden_size, "qwen2_layers": q.num_hidden_layers,
                "heads": f"{q.num_attention_heads} (kv {q.num_key_value_heads})",
                "mlp": q.intermediate_size, "speech_tokens": cfg.llm.speech_token_size,
                "sampling": dataclasses.asdict(cfg.llm.sampling)},
        "files": files,
        "parameters": params,
        "speakers": ", ".join(n for n, s in speakers.items() if s.embedding is not None),
        "voices": ", ".join(n for n, s in speakers.items() if s.bundle is not None),
        "modes": ", ".join(modes_for([n for n, s in speakers.items()
                                      if s.embedding is not None])),
        "recordings": _recordings(model_dir),
    }


def _recordings(model_dir: str) -> str:
    from .modes import missing_prompt_models

    missing = missing_prompt_models(model_dir)
    if not missing:
        return "yes (campplus.onnx, speech_tokenizer_v2.onnx)"
    return f"no: {', '.join(missing)} missing (stored and spk2info.pt voices only)"
