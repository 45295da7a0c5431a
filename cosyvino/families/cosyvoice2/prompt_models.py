"""The CosyVoice2 prompt side (sheet v2 §3.4-§3.6, §3.8): recordings -> voices.

What differs from v1 (:mod:`cosyvino.families.cosyvoice1.prompt_models`, reused for the rest):

* speech tokens come from ``speech_tokenizer_v2.onnx`` (same whisper 128-bin log-mel input and
  positional I/O as v1: feats float32 [1, 128, T] + length int32 [1]; the output flattened,
  25 Hz, ids 0..6560);
* the prompt mel is computed at 24 kHz with n_fft 1920, hop 480, win 1920, fmin 0, fmax 8000,
  80 bins, center False (:data:`PROMPT_MEL`; the yaml's ``feat_extractor``), so frames =
  samples // 480 (50 Hz, 2 per token);
* zero-shot, cross-lingual and instruct2 align the prompt (:func:`align_prompt`): L =
  min(mel frames // 2, tokens), mel cut to 2L frames, tokens to L; voice conversion does not
  (§3.8 note 3). A :class:`~cosyvino.voices.Voice` therefore keeps the uncut features and the
  family aligns them per mode.

CAM++ (``campplus.onnx``) is the v1 file and call. Must not import torch.
"""

from __future__ import annotations

import os

from cosyvino.errors import ConfigError
from cosyvino.families.cosyvoice1.config import MelConfig
from cosyvino.families.cosyvoice1.prompt_models import PromptEncoder as _V1PromptEncoder
from cosyvino.families.cosyvoice1.prompt_models import RunnerFactory
from cosyvino.families.cosyvoice23.prompt_align import (  # noqa: F401  (the v2 names)
    PROMPT_MEL,
    RATE_TOLERANCE,
    TOKEN_MEL_RATIO,
    align_prompt,
    prompt_rate_reason,
)

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
#: speech-token ids 0..6560 (sheet v2 §2)
SPEECH_VOCAB = 6561
def prompt_mel_config(data: dict, path: str = "cosyvoice2.yaml") -> MelConfig:
    """The prompt mel of an inert-parsed ``cosyvoice2.yaml`` (its ``feat_extractor``; the
    sheet v2 values :data:`PROMPT_MEL` when the section is absent). A ``fmax: null`` (Matcha:
    up to Nyquist) is kept as None.

    Raises:
        ConfigError: ``feat_extractor`` is not a mapping of numbers, or its bins or frame
            rate disagree with the flow (80 bins, 2 frames per token at 25 Hz: hop =
            sampling_rate / 50).
    """
    from cosyvino.families.cosyvoice1.yaml_config import Tagged

    node = data.get("feat_extractor")
    if node is None:
        return PROMPT_MEL
    args = node.args if isinstance(node, Tagged) else None
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: 'feat_extractor' must be a '!name:' mapping", path)
    d = PROMPT_MEL
    try:
        fmax = args.get("fmax", d.fmax)
        mel = MelConfig(n_fft=int(args.get("n_fft", d.n_fft)),
                        num_mels=int(args.get("num_mels", d.num_mels)),
                        sampling_rate=int(args.get("sampling_rate", d.sampling_rate)),
                        hop_size=int(args.get("hop_size", d.hop_size)),
                        win_size=int(args.get("win_size", d.win_size)),
                        fmin=float(args.get("fmin", d.fmin)),
                        fmax=None if fmax is None else float(fmax))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'feat_extractor' values must be numbers", path) from None
    if mel.num_mels != d.num_mels or mel.sampling_rate != mel.hop_size * 50 or \
            not 0 < mel.win_size <= mel.n_fft:
        raise ConfigError(f"{path}: 'feat_extractor' gives {mel.num_mels} bins, hop "
                          f"{mel.hop_size} at {mel.sampling_rate} Hz, window {mel.win_size} of "
                          f"n_fft {mel.n_fft}; the CosyVoice2 flow takes 80 bins at 50 frames/s",
                          path)
    return mel


def read_prompt_mel_config(model_dir: str | os.PathLike) -> MelConfig:
    """:func:`prompt_mel_config` of ``<model_dir>/cosyvoice2.yaml``.

    Raises: ModelDirError (missing/unreadable yaml), ConfigError (as above, or bad YAML)."""
    from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml

    path = os.path.join(os.fspath(model_dir), "cosyvoice2.yaml")
    return prompt_mel_config(load_inert_yaml(path), path)


class PromptEncoder(_V1PromptEncoder):
    """Recordings -> voices for the CosyVoice2 prompt modes (the family's ``prompt_encoder``
    hook; the v1 contract: :meth:`voice`, :meth:`speech_tokens`, :meth:`check_voice`,
    :meth:`close`). Cheap to build: ``campplus.onnx`` and ``speech_tokenizer_v2.onnx`` are
    loaded on first use.

    :meth:`voice` gives CAM++ embedding float32 [1, 192], speech tokens int64 [N] (25 Hz,
    ids 0..6560) and the 24 kHz prompt mel float32 [M, 80] (M = samples at 24 kHz // 480),
    uncut: :func:`align_prompt` is the family's per-mode step.

    Args:
        model_dir: the dir holding both ONNX files.
        backend: the backend running them (None: the v1 default choice).
        embedding_dim / speech_vocab / mel_bins: what a voice must have to fit the model
            (192, 6561, 80 for CosyVoice2-0.5B).
        mel: the prompt mel config (default :data:`PROMPT_MEL`; a dir's own:
            :func:`read_prompt_mel_config`).
        factory / options: as :class:`cosyvino.families.cosyvoice1.prompt_models.PromptModels`.
    """

    tokenizer_file = SPEECH_TOKENIZER_FILE

    def __init__(self, model_dir: str | os.PathLike, backend: str | None = None, *,
                 embedding_dim: int = 192, speech_vocab: int = SPEECH_VOCAB, mel_bins: int = 80,
                 mel: MelConfig | None = None, factory: RunnerFactory | None = None, **options):
        super().__init__(os.fspath(model_dir), backend, embedding_dim=embedding_dim,
                         speech_vocab=speech_vocab, mel_bins=mel_bins, factory=factory,
                         **options)
        self.mel = PROMPT_MEL if mel is None else mel
        if self.mel.num_mels != mel_bins:
            raise ConfigError(f"the prompt mel has {self.mel.num_mels} bins but the model takes "
                              f"{mel_bins}")

    def check_voice(self, voice) -> str | None:
        """Why ``voice`` does not fit this model (v1's checks: embedding width, token ids, mel
        bins; then :func:`prompt_rate_reason` at :attr:`mel`), or None."""
        return super().check_voice(voice) or prompt_rate_reason(voice, self.mel)
