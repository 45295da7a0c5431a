"""CosyVoice3 modes: the CosyVoice2 modes (the same names, matching order and flow
conditioning: :mod:`cosyvino.families.cosyvoice23.modes`) with v3's LLM text convention (sheet
v3 §3.4, §4.3). Must not import torch.

========================  =====================================  ======================  =======
mode                      LLM text before the tts text /         flow prompt             flow
                          LLM prompt speech tokens                                       spk
========================  =====================================  ======================  =======
``zero_shot``             [system prefix] transcript / tokens    prompt tokens + mel     prompt
``cross_lingual``         system prefix / none                   prompt tokens + mel     prompt
``vc``                    (no LLM: the source speech tokens)     prompt tokens + mel     prompt
``instruct2``             system part with the instruction /     prompt tokens + mel     prompt
                          none
``sft``                   system prefix / none                   none                    speaker
========================  =====================================  ======================  =======

The v3 LLM was trained with a system / instruction part ending with ``<|endofprompt|>`` before
the text, and upstream asserts the marker is in the prompt text or the text. cosyvino applies
:func:`cosyvino.families.cosyvoice3.prompt.llm_text_ids` per segment (policy ``add``): when
neither the text before the tts text nor the segment holds the marker,
``You are a helpful assistant.<|endofprompt|>`` goes first (counted as prompt, not in
min_len / max_len). ``instruct2`` builds the official system part
``You are a helpful assistant. <instruction><|endofprompt|>``
(:func:`~cosyvino.families.cosyvoice3.prompt.instruct_prompt`; an instruction that holds the
marker is used as given). Recordings need ``campplus.onnx`` and ``speech_tokenizer_v3.onnx``,
which cosyvino does not run yet (the shared
:class:`~cosyvino.families.cosyvoice23.modes.UnavailablePromptEncoder`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cosyvoice23 import modes as shared
from ..cosyvoice23.modes import INSTRUCT2, MODES, ZERO_SHOT, LLMPrefix, Tokenize
from .prompt import DEFAULT_PREFIX, instruct_prompt, llm_text_ids

#: the prompt models of an official CosyVoice3 dir (sheet v3 §1, §3.5)
PROMPT_MODEL_FILES = ("campplus.onnx", "speech_tokenizer_v3.onnx")


def llm_prefix(request, tokenize: Tokenize, normalize: Callable[[str], str]) -> LLMPrefix:
    """The text before the tts text and the LLM prompt speech tokens of a validated request in
    its v3 mode (module docstring; the system prefix is added per segment by
    :func:`segment_llm_text`). Raises InputError for a transcript or instruction with nothing
    speakable."""
    mode = request.mode
    if mode == ZERO_SHOT.name:
        return LLMPrefix(shared.prompt_text_ids(request, tokenize, normalize),
                         shared.prompt_speech(request))
    if mode == INSTRUCT2.name:
        return LLMPrefix(shared.text_ids(tokenize(instruct_prompt(request.instruction)),
                                         "instruction"))
    return LLMPrefix()  # sft, cross_lingual; vc runs no LLM


def segment_llm_text(text: np.ndarray, before: np.ndarray | None,
                     prefix_ids: np.ndarray) -> np.ndarray:
    """The ids between SOS and TASK for one segment: ``before ⧺ text``, with ``prefix_ids``
    (the ids of ``You are a helpful assistant.<|endofprompt|>``) in front when neither holds
    ``<|endofprompt|>`` (:func:`~.prompt.llm_text_ids`, policy ``add``); int64 [1, L']."""
    prompt, txt = llm_text_ids(np.asarray(text).reshape(-1),
                               () if before is None else np.asarray(before).reshape(-1),
                               prefix_ids=np.asarray(prefix_ids).reshape(-1))
    return np.asarray(prompt + txt, np.int64).reshape(1, -1)


def default_prefix_ids(tokenize: Tokenize) -> np.ndarray:
    """The Qwen ids of :data:`~.prompt.DEFAULT_PREFIX` (int64 [L])."""
    return np.asarray(tokenize(DEFAULT_PREFIX), np.int64)


def missing_prompt_models(model_dir) -> list[str]:
    """The prompt-model files of :data:`PROMPT_MODEL_FILES` not in ``model_dir``."""
    return shared.missing_prompt_models(model_dir, PROMPT_MODEL_FILES)


def prompt_models_reason(model_dir) -> str:
    """Why a recording cannot be turned into a voice or speech tokens for CosyVoice3 here."""
    return shared.prompt_models_reason(model_dir, "CosyVoice3", PROMPT_MODEL_FILES)


__all__ = ["MODES", "PROMPT_MODEL_FILES", "default_prefix_ids", "llm_prefix",
           "missing_prompt_models", "prompt_models_reason", "segment_llm_text"]
