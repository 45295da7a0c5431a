"""The CosyVoice2 PyTorch model of an official dir: the three parts loaded strictly, plus what
serving needs besides the graphs (speakers and voices of ``spk2info.pt``, the fixed CFM noise).
Imports torch. What the graph table's ``torch_module`` factories take apart."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from cosyvino.families.cosyvoice23.voices import (
    spk2info_voices as shared_spk2info_voices,
)

from ..model_config import CosyVoice2ModelConfig, read_model_config
from ..voices import PromptVoice


@dataclass
class CosyVoice2TorchModel:
    """Attributes: ``config`` (:class:`CosyVoice2ModelConfig`), ``path`` (the model dir),
    ``llm`` (:class:`~.llm.CosyVoice2LM`), ``flow`` (:class:`~.flow.CausalMaskedDiffWithXvec`),
    ``hift`` (:class:`~.hift.HiFTGenerator`), ``speakers`` (SFT name -> float32 [1, 192]),
    ``voices`` (zero-shot bundles, name -> :class:`PromptVoice`)."""

    config: CosyVoice2ModelConfig
    path: str
    llm: object
    flow: object
    hift: object
    speakers: dict = field(default_factory=dict)
    voices: dict = field(default_factory=dict)

    def cfm_noise(self) -> np.ndarray:
        """The fixed CFM noise table float32 [1, 80, 15000] (sheet v2 §5.4)."""
        from cosyvino.families.cosyvoice23.fixed_noise import make_cfm_noise_table

        return make_cfm_noise_table()

    def flow_stream(self, noise_table: np.ndarray, embedding, *, prompt_token=None,
                    prompt_feat=None, n_timesteps: int | None = None,
                    left_chunks: int | None = None):
        """One segment's incremental streaming flow (issue 36): a
        :class:`~.incremental_flow.FlowStream` over this model's flow and ``noise_table``
        (float32 [1, 80, frames]); arguments as :class:`~.incremental_flow.IncrementalFlow` /
        :class:`~.incremental_flow.FlowStream`. Raises InputError / ConfigError as those."""
        from .incremental_flow import FlowStream, IncrementalFlow

        flow = IncrementalFlow(self.flow, noise_table, n_timesteps=n_timesteps,
                               left_chunks=left_chunks)
        return FlowStream(flow, embedding, prompt_token, prompt_feat)


def spk2info_voices(model_dir: str, config: CosyVoice2ModelConfig
                    ) -> tuple[dict[str, np.ndarray], dict[str, PromptVoice]]:
    """SFT speakers and zero-shot bundles of ``model_dir/spk2info.pt`` (empty without one);
    bundle transcripts decoded with the dir's Qwen tokenizer
    (:func:`cosyvino.families.cosyvoice23.voices.spk2info_voices`). Raises CheckpointError /
    ModelDirError (unreadable file or tokenizer)."""
    from cosyvino.families.cosyvoice23.tokenizer import load_qwen_tokenizer

    return shared_spk2info_voices(model_dir, config, load_qwen_tokenizer)


def load_torch_model(model_dir: str | os.PathLike) -> CosyVoice2TorchModel:
    """The model of an official CosyVoice2 dir, every part strictly loaded, eval mode.

    Raises: ModelDirError / ConfigError / CheckpointError (from the part loaders)."""
    from .flow_loading import load_flow
    from .hift import load_hift
    from .llm import load_cosyvoice2_lm

    model_dir = os.fspath(model_dir)
    config = read_model_config(model_dir)
    speakers, voices = spk2info_voices(model_dir, config)
    return CosyVoice2TorchModel(
        config=config, path=model_dir, llm=load_cosyvoice2_lm(model_dir, config.llm),
        flow=load_flow(model_dir), hift=load_hift(model_dir, config.hift),
        speakers=speakers, voices=voices)
