"""LLM accuracy of a quantized converted dir against its fp32 source (no torch).

Teacher forcing: for every text, the fp32 and the quantized LLM step through the same inputs
(prefix = SOS, speaker, text, TASK, then forced speech tokens one per step), and the two
next-token distributions are compared at every position: top-1 agreement and
KL(fp32 || quantized). The forced tokens are the fp32 model's greedy choice (EOS excluded),
so the quantized model is scored along the path the reference model takes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import numpy as np

#: exact f32 compute and KV cache, no blob cache: differences come from the weights only
F32_OPTIONS = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


def _kl(ref: np.ndarray, test: np.ndarray) -> float:
    r = ref.astype(np.float64)
    t = test.astype(np.float64)
    p = np.exp(r)
    mask = p > 0
    return float(np.sum(p[mask] * (r[mask] - t[mask])))


def llm_teacher_forced_report(ref_dir: str, test_llm_xml: str, texts: Iterable,
                              tokens_per_text: int = 20, num_threads: int | None = None
                              ) -> dict:
    """Compare the LLM of converted dir ``ref_dir`` with the LLM IR ``test_llm_xml``.

    ``texts``: :class:`cosyvino.calibration.CalibrationText` items (``id``, ``language``,
    ``speaker``, ``text``); the first frontend segment of each is used, with the text's speaker
    when the model has it (else the model's first speaker). Returns a JSON-able dict with
    ``per_text`` rows and ``top1_agreement`` / ``mean_kl`` / ``max_kl`` over all positions.
    """
    import openvino as ov
    from cosyvino_openvino.stages import OpenVINOLLMSession, compile_properties

    from ..synthesizer import Synthesizer

    tts = Synthesizer(ref_dir, backend="openvino", num_threads=num_threads, **F32_OPTIONS)
    props, llm_props = compile_properties(num_threads=num_threads, **F32_OPTIONS)
    test_compiled = ov.Core().compile_model(os.fspath(test_llm_xml), "CPU",
                                            dict(props, **llm_props))
    rows = []
    all_agree, all_kl = [], []
    for item in texts:
        speaker = item.speaker if item.speaker in tts.stages.speakers else tts.speakers[0]
        seg = tts.frontend.segments(item.text)[0]
        text_token = np.asarray(seg.token_ids, np.int64)[None, :]
        lm_input = tts.pipeline.build_lm_input(text_token, tts.stages.speakers[speaker])
        ref = tts.stages.new_llm_session()
        test = OpenVINOLLMSession(test_compiled)
        ref.reset()
        test.reset()
        x = lm_input
        agree, kls = [], []
        for _ in range(tokens_per_text + 1):
            lr, lt = ref.forward(x), test.forward(x)
            agree.append(int(np.argmax(lr)) == int(np.argmax(lt)))
            kls.append(_kl(lr, lt))
            token = int(np.argmax(lr[:-1]))  # last entry is EOS: never forced
            x = tts.stages.embed_speech_tokens(np.array([[token]], np.int64))
        rows.append({"id": item.id, "language": item.language, "speaker": speaker,
                     "positions": len(kls), "top1_agreement": float(np.mean(agree)),
                     "mean_kl": float(np.mean(kls)), "max_kl": float(np.max(kls))})
        all_agree += agree
        all_kl += kls
    return {"method": "teacher-forced, fp32 greedy path, f32 compute and KV cache",
            "texts": len(rows), "tokens_per_text": tokens_per_text,
            "positions": len(all_kl), "top1_agreement": float(np.mean(all_agree)),
            "mean_kl": float(np.mean(all_kl)), "max_kl": float(np.max(all_kl)),
            "per_text": rows}


def report_is_finite(report: dict) -> bool:
    return all(math.isfinite(report[k]) for k in ("top1_agreement", "mean_kl", "max_kl"))


def format_table(report: dict) -> str:
    head = ("text", "lang", "positions", "top-1 agree", "mean KL", "max KL")
    rows = [head] + [(r["id"], r["language"], str(r["positions"]),
                      f"{r['top1_agreement']:.3f}", f"{r['mean_kl']:.2e}",
                      f"{r['max_kl']:.2e}") for r in report["per_text"]]
    rows.append(("all", "", str(report["positions"]), f"{report['top1_agreement']:.3f}",
                 f"{report['mean_kl']:.2e}", f"{report['max_kl']:.2e}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
