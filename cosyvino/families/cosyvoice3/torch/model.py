"""The CosyVoice3 PyTorch model of an official dir: the three parts loaded strictly, plus what
serving needs besides the graphs (speakers and voices of ``spk2info.pt``, the fixed CFM noise
and the fixed NSF table). Imports torch. What the graph table's ``torch_module`` factories take
apart."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np

from cosyvino.families.cosyvoice23.voices import spk2info_voices

from ..model_config import CosyVoice3ModelConfig, read_model_config


@dataclass
class CosyVoice3TorchModel:
    """Attributes: ``config`` (:class:`CosyVoice3ModelConfig`), ``path`` (the model dir),
    ``llm`` (:class:`~.llm.CosyVoice3LM`), ``flow`` (:class:`~.flow.CausalMaskedDiffWithDiT`),
    ``hift`` (:class:`~.hift.CausalHiFTGenerator`), ``speakers`` (SFT name -> float32
    [1, 192]), ``voices`` (zero-shot bundles, name -> :class:`PromptVoice`)."""

    config: CosyVoice3ModelConfig
    path: str
    llm: object
    flow: object
    hift: object
    speakers: dict = field(default_factory=dict)
    voices: dict = field(default_factory=dict)
    _sine_waves: np.ndarray | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cfm_noise(self) -> np.ndarray:
        """The fixed CFM noise table float32 [1, 80, 15000] (sheet v3 §5.4, as v2's)."""
        from cosyvino.families.cosyvoice23.fixed_noise import make_cfm_noise_table

        return make_cfm_noise_table()

    def sine_waves(self) -> np.ndarray:
        """Upstream's fixed NSF noise table ``sine_waves`` float32 [1, 7 200 000, 9] (sheet v3
        §6.2), replayed once from the dir's yaml
        (:func:`~cosyvino.families.cosyvoice3.fixed_tables.make_fixed_tables`, ~2 s) and kept.
        Raises ConfigError (a yaml whose construction order the replay does not reproduce)."""
        with self._lock:
            if self._sine_waves is None:
                from cosyvino.families.cosyvoice3.fixed_tables import (
                    make_fixed_tables,
                    read_table_recipe,
                )

                self._sine_waves = make_fixed_tables(read_table_recipe(self.path)).sine_waves
            return self._sine_waves

    def vocoder_stream(self):
        """One segment's incremental causal vocoder (issue 36): a
        :class:`~.incremental_hift.IncrementalCausalHiFT` over this model's HiFT and fixed NSF
        table (:meth:`sine_waves`). Raises ConfigError as :meth:`sine_waves`."""
        from .incremental_hift import IncrementalCausalHiFT

        return IncrementalCausalHiFT(self.hift, self.sine_waves())


def load_torch_model(model_dir: str | os.PathLike) -> CosyVoice3TorchModel:
    """The model of an official CosyVoice3 dir, every part strictly loaded, eval mode.

    Raises: ModelDirError / ConfigError / CheckpointError (from the part loaders)."""
    from cosyvino.families.cosyvoice3.tokenizer import load_cosyvoice3_tokenizer

    from .flow_loading import load_flow
    from .hift import load_hift
    from .llm import load_cosyvoice3_lm

    model_dir = os.fspath(model_dir)
    config = read_model_config(model_dir)
    speakers, voices = spk2info_voices(model_dir, config, load_cosyvoice3_tokenizer)
    return CosyVoice3TorchModel(
        config=config, path=model_dir, llm=load_cosyvoice3_lm(model_dir, config.llm),
        flow=load_flow(model_dir), hift=load_hift(model_dir, config.hift),
        speakers=speakers, voices=voices)
