"""``cosyvino info`` for an official CosyVoice2 dir: config highlights, files, parameter counts,
speakers, how the registered family serves the dir (``servable``), the modes a Synthesizer offers
and whether it takes recordings (the prompt models), without building modules (sheet v2 §1, §3.7,
§4.1); the summary itself is shared with CosyVoice3
(:func:`cosyvino.families.cosyvoice23.info.speech_lm_dir_info`).
"""

from __future__ import annotations

import os

from cosyvino.errors import ModelDirError
from cosyvino.families.cosyvoice23.info import speech_lm_dir_info

from .config import YAML_NAME, read_cosyvoice2_config

#: the files of an official CosyVoice2 dir (sheet v2 §1), the ones ``info`` sizes
FILES = (YAML_NAME, "llm.pt", "flow.pt", "hift.pt", "spk2info.pt", "campplus.onnx",
         "speech_tokenizer_v2.onnx", "CosyVoice-BlankEN/config.json",
         "CosyVoice-BlankEN/vocab.json", "CosyVoice-BlankEN/merges.txt")
#: how the registered CosyVoice2 family serves an official dir
SERVABLE = ("yes: torch on this dir; onnxruntime or openvino after "
            "`cosyvino convert --format onnx|openvino`")


def model_info(model_dir: str) -> dict:
    """The summary dict of an official CosyVoice2 dir
    (:func:`~cosyvino.families.cosyvoice23.info.speech_lm_dir_info`: ``path``, ``family``,
    ``servable``, ``sample_rate``, ``llm``, ``files``, ``parameters``, ``speakers``, ``voices``), plus
    ``synthetic``, ``modes`` (:func:`.modes.modes_for`) and ``recordings`` (whether
    ``prompt_audio`` / ``source_audio`` / ``voices add`` work: the prompt models are there).

    Raises ModelDirError / ConfigError / CheckpointError (a checkpoint that cannot be read)."""
    from .modes import modes_for
    from .speakers import load_cosyvoice2_spk2info
    from .synthetic import is_synthetic

    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    cfg = read_cosyvoice2_config(model_dir)
    info = speech_lm_dir_info(model_dir, family="cosyvoice2", sample_rate=cfg.sample_rate,
                              llm=cfg.llm, files=FILES, servable=SERVABLE)
    spk_path = os.path.join(model_dir, "spk2info.pt")
    speakers = load_cosyvoice2_spk2info(spk_path) if os.path.isfile(spk_path) else {}
    info["synthetic"] = is_synthetic(model_dir)
    info["modes"] = ", ".join(modes_for([n for n, s in speakers.items()
                                         if s.embedding is not None]))
    info["recordings"] = _recordings(model_dir)
    return info


def _recordings(model_dir: str) -> str:
    from .modes import missing_prompt_models

    missing = missing_prompt_models(model_dir)
    if not missing:
        return "yes (campplus.onnx, speech_tokenizer_v2.onnx)"
    return f"no: {', '.join(missing)} missing (stored and spk2info.pt voices only)"
