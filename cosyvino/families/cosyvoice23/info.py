"""``cosyvino info`` for an official CosyVoice2/3 dir: config highlights, files, parameter counts
and speakers, without building modules (sheet v2 §1, §3.7, §4.1; sheet v3 §1, §4.1). The
family supplies its config and file list. Must not import torch at module level.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from cosyvino.errors import ModelDirError

from .lm_config import SpeechLMConfig


def speech_lm_dir_info(model_dir: str, *, family: str, sample_rate: int, llm: SpeechLMConfig,
                       files: Sequence[str], servable: str | None = None) -> dict:
    """The summary dict of an official CosyVoice2/3 dir (same layout as the v1 summary where
    the fields exist): ``path``, ``family``, ``servable`` (when given), ``sample_rate``,
    ``llm`` (Qwen2 sizes, speech tokens, head rows, sampling), ``files`` (MB or ``absent``),
    ``parameters`` (values per .pt file, tied copies counted twice as upstream's manifest
    does), ``speakers`` (SFT) and ``voices`` (zero-shot bundles).

    Raises:
        ModelDirError: ``model_dir`` is not a directory, a missing/unreadable file;
        CheckpointError: a checkpoint or ``spk2info.pt`` that cannot be read.
    """
    from cosyvino.families.cosyvoice1.checkpoint import load_torch_file

    from .speakers import load_spk2info

    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    q = llm.qwen
    sizes = {}
    for name in files:
        p = os.path.join(model_dir, name)
        sizes[name] = f"{os.path.getsize(p) / 1e6:.1f} MB" if os.path.isfile(p) else "absent"
    params = {}
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        p = os.path.join(model_dir, name)
        if os.path.isfile(p):
            params[name] = f"{sum(v.numel() for v in load_torch_file(p).values()):,}"
    spk_path = os.path.join(model_dir, "spk2info.pt")
    speakers = (load_spk2info(spk_path, speech_token_size=llm.speech_token_size)
                if os.path.isfile(spk_path) else {})
    info = {
        "path": os.path.abspath(model_dir),
        "family": family,
        "sample_rate": sample_rate,
        "llm": {"width": q.hidden_size, "qwen2_layers": q.num_hidden_layers,
                "heads": f"{q.num_attention_heads} (kv {q.num_key_value_heads})",
                "mlp": q.intermediate_size, "speech_tokens": llm.speech_token_size,
                "speech_head_rows": llm.vocab_out,
                "sampling": dataclasses.asdict(llm.sampling)},
        "files": sizes,
        "parameters": params,
        "speakers": ", ".join(n for n, s in speakers.items() if s.embedding is not None),
        "voices": ", ".join(n for n, s in speakers.items() if s.bundle is not None),
    }
    if servable is not None:  # a family that reads dirs it cannot serve says so
        info["servable"] = servable
    return info
