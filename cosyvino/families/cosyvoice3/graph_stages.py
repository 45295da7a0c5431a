"""CosyVoice3 stages over a generic :class:`cosyvino.backends.graphs.GraphRunner`: each stage
call is one graph of :mod:`.graphs` (the vocoder three). What a backend that runs graph tables
(the torch runner on an official dir, ONNX Runtime on a converted one) gets for v3. The
speech-LM, estimator, noise and voice parts are shared with CosyVoice2
(:class:`cosyvino.families.cosyvoice23.graph_stages.SpeechLMGraphStages`). Must not import
torch (an official dir's tables come from the torch runner's loaded model).
"""

from __future__ import annotations

import numpy as np

from cosyvino.errors import InputError

from ..cosyvoice23.graph_stages import GraphLLMSession, SpeechLMGraphStages, f32
from .fixed_tables import sine_wave_rows
from .hift_config import F0_LOOK_RIGHT
from .serving_files import read_sine_waves
from .stages import CosyVoice3Stages


class CosyVoice3GraphStages(SpeechLMGraphStages, CosyVoice3Stages):
    """v3 stage calls as graph calls on ``runner``. Speakers, voices, the CFM noise and the NSF
    table come from the converted dir (:mod:`.serving_files`) or, for an official dir, from the
    runner's loaded torch model (``runner.model``).

    Raises: ConvertedModelError (a converted dir's files unreadable); ConfigError (an official
    yaml whose NSF-table replay order differs)."""

    def __init__(self, runner, model_dir: str):
        super().__init__(runner, model_dir)
        self._sine_waves = (runner.model.sine_waves() if self.official
                            else read_sine_waves(model_dir))
        llm, hift = self.config.llm, self.config.hift
        rows = self._one("speech_embedding", np.array([[llm.sos, llm.task_id]], np.int64))
        self._special = (f32(rows[:, :1]), f32(rows[:, 1:2]))
        self._hop = int(hift.hop_length)
        self._look_right = int(hift.conv_pre_look_right)
        self._held_back = F0_LOOK_RIGHT + self._look_right + 1  # 8 frames (sheet v3 §6.3)

    def llm_special_embeddings(self):
        return self._special

    def flow_encode(self, tokens, embedding, *, finalize, streaming):
        body, context, scale = self.lookahead_split(tokens, finalize)
        mu, spks = self.runner.run("flow_encoder", [body, context, scale, f32(embedding)])
        return mu, spks

    def sine_waves(self) -> np.ndarray:
        """The fixed NSF table float32 [1, 7 200 000, 9] (sheet v3 §6.2)."""
        return self._sine_waves

    def vocoder(self, mel, finalize):
        mel = f32(mel)
        t = mel.shape[-1] if mel.ndim == 3 else 0
        need = 1 if finalize else self._held_back + 1
        if mel.ndim != 3 or mel.shape[0] != 1 or t < need:
            raise InputError(f"the vocoder needs a [1, 80, T] mel with T >= {need} "
                             f"(finalize={finalize}), got {list(mel.shape)}")
        f0 = self._one("hift_f0", mel)
        frames = t if finalize else t - F0_LOOK_RIGHT   # T': the frames with a source
        if not finalize:
            f0 = np.ascontiguousarray(f0[:, :frames])
        rows = sine_wave_rows(self._sine_waves, self._hop * frames)
        source = self._one("hift_source", f32(f0), rows)
        n = frames if finalize else frames - self._look_right  # frames that produce audio
        if finalize:
            context = np.zeros((1, mel.shape[1], self._look_right), np.float32)
        else:
            context = np.ascontiguousarray(mel[:, :, n:n + self._look_right])
        wav = self._one("hift_decode", np.ascontiguousarray(mel[:, :, :n]), context, source)
        if not finalize:  # the iSTFT tail of the last frame is incomplete (sheet v3 §6.3)
            wav = np.ascontiguousarray(wav[:, :self._hop * (n - 1)])
        return wav


__all__ = ["CosyVoice3GraphStages", "GraphLLMSession"]
