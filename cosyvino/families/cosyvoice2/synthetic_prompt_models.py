"""Synthetic stand-ins of the two ONNX prompt models of a CosyVoice2 dir, random weights with
the official I/O contract (sheet v2 §3.4, §3.5), built by the v1 builders
(:mod:`cosyvino.families.cosyvoice1.synthetic_prompt_models`) with the v2 parameters:

* ``campplus.onnx``: the same file and I/O as v1 (sheet v2 §1, §3.5): ``feats`` float32
  [1, T, 80] -> ``embedding`` float32 [1, 192].
* ``speech_tokenizer_v2.onnx``: ``feats`` float32 [1, 128, T] (whisper log-mel, 100 Hz) and
  ``feats_length`` int32 [1] (= T) -> ``indices`` int64 [1, 1, T'], T' = ceil(ceil(T/2)/2)
  (25 Hz: two stride-2 k3 convs), ids 0..6560 by finite scalar quantization (Linear to 8,
  tanh, x 0.999, round, + 1, id = sum d_i 3^i). The transformer in between is the v1 stand-in's
  (6 blocks, 1280-d, 20 heads at full size; the real file's rotary positions and FSMN memory
  branch are not modelled: they change no shape and little compute). Names follow the
  third-party description (sheet v2 §3.4); the official code feeds both models by position.

Needs ``onnx`` (and numpy), not torch.
"""

from __future__ import annotations

import os

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.synthetic_prompt_models import (
    CamPlusShape,
    TokenizerShape,
    write_prompt_model_files,
)

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
#: ternary FSQ digits of the v2 tokenizer: 3^8 = 6561 codes (sheet v2 §2, §3.4)
FSQ_DIGITS = 8

_V2 = {"strides": (2, 2), "fsq_digits": FSQ_DIGITS, "output_name": "indices"}

#: preset name -> (CAM++ shape, tokenizer shape); ``0.5b`` is the full size of the real files
PROMPT_PRESETS = {
    "tiny": (CamPlusShape(fcm_channels=4, fcm_layers=2, fcm_strided=2, tdnn_channels=16,
                          blocks=((2, 1),), growth=8, bottleneck=16),
             TokenizerShape(d_model=32, heads=2, blocks=1, mlp=64, **_V2)),
    "0.5b": (CamPlusShape(), TokenizerShape(**_V2)),
}


def write_prompt_models(out_dir: str | os.PathLike, preset: str = "tiny", *,
                        seed: int = 0) -> tuple[str, str]:
    """Write ``campplus.onnx`` and ``speech_tokenizer_v2.onnx`` stand-ins into ``out_dir``.

    Args:
        out_dir: an existing directory; each file is written atomically.
        preset: ``"tiny"`` (tests) or ``"0.5b"`` (full size, :data:`PROMPT_PRESETS`).
        seed: seed of the random weights (the tokenizer uses ``seed + 1``).

    Returns:
        (campplus path, speech tokenizer path).

    Raises:
        InputError: unknown preset.
        ModelDirError: ``onnx`` is not installed, or ``out_dir`` cannot be written.
    """
    if preset not in PROMPT_PRESETS:
        raise InputError(f"unknown CosyVoice2 prompt-model preset {preset!r}; choose one of "
                         f"{', '.join(PROMPT_PRESETS)}")
    cam, tok = PROMPT_PRESETS[preset]
    return write_prompt_model_files(out_dir, cam, tok, SPEECH_TOKENIZER_FILE, seed=seed)
