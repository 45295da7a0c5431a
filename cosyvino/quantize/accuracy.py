"""LLM accuracy of a quantized converted dir against its fp32 source (no torch).

Teacher forcing: for every text, the fp32 and the quantized LLM step through the same inputs
(prefix = SOS, speaker, text, TASK, then forced speech tokens one per step), and the two
next-token distributions are compared at every position: top-1 agreement and
KL(fp32 || quantized). The forced tokens are the fp32 model's greedy choice (EOS excluded),
so the quantized model is scored along the path the reference model takes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..families.cosyvoice1.graphs import reference_table

#: exact f32 compute and KV cache, no blob cache: differences come from the weights only
F32_OPTIONS = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


def _kl(ref: np.ndarray, test: np.ndarray) -> float:
    """KL(ref || test) in nats from two log-probability rows. Both are renormalized in float64
    first: float32 log-softmax rows are off by ~1e-7 in total mass, which otherwise showed up
    as slightly negative KLs."""
    r = ref.astype(np.float64)
    t = test.astype(np.float64)
    r = r - np.logaddexp.reduce(r)
    t = t - np.logaddexp.reduce(t)
    p = np.exp(r)
    mask = p > 0
    return float(np.sum(p[mask] * (r[mask] - t[mask])))


def llm_teacher_forced_report(ref_stages, test_stages, texts: Iterable,
                              tokens_per_text: int = 20) -> dict:
    """Compare the LLM path (text encoder + LLM) of ``test_stages`` with ``ref_stages``.

    Both are loaded openvino :class:`~cosyvino.backends.Stages` (f32 compute and KV cache, see
    :data:`F32_OPTIONS`). ``texts``: :class:`cosyvino.quantize.calibration.CalibrationText` items
    (``id``, ``language``, ``speaker``, ``text``); the first frontend segment of each is used,
    with the text's speaker when the model has it (else the model's first speaker). Each model
    builds its own prefix (its own text encoder), then both are fed the fp32 model's greedy
    tokens. Returns a JSON-able dict with ``per_text`` rows and ``top1_agreement`` /
    ``mean_kl`` / ``max_kl`` (nats) over all positions.
    """
    from ..frontend import TextFrontend
    from cosyvino.families.cosyvoice1.pipeline import Pipeline

    frontend = TextFrontend()
    ref_pipe, test_pipe = Pipeline(ref_stages), Pipeline(test_stages)
    first_speaker = next(iter(ref_stages.speakers))
    rows = []
    all_agree, all_kl = [], []
    for item in texts:
        speaker = item.speaker if item.speaker in ref_stages.speakers else first_speaker
        emb = ref_stages.speakers[speaker]
        seg = frontend.segments(item.text)[0]
        text_token = np.asarray(seg.token_ids, np.int64)[None, :]
        ref, test = ref_stages.new_llm_session(), test_stages.new_llm_session()
        ref.reset()
        test.reset()
        xr = ref_pipe.build_lm_input(text_token, emb)
        xt = test_pipe.build_lm_input(text_token, emb)
        agree, kls = [], []
        try:
            for _ in range(tokens_per_text + 1):
                lr, lt = ref.forward(xr), test.forward(xt)
                agree.append(int(np.argmax(lr)) == int(np.argmax(lt)))
                kls.append(_kl(lr, lt))
                token = int(np.argmax(lr[:-1]))  # last entry is EOS: never forced
                xr = ref_stages.embed_speech_tokens(np.array([[token]], np.int64))
                xt = test_stages.embed_speech_tokens(np.array([[token]], np.int64))
        finally:
            ref.close()
            test.close()
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


# ---- audio stages: mel and waveform distances ------------------------------------------------

#: swap group -> the Stages methods taken from the quantized model
SWAP_GROUPS = {
    "flow_encoder": ("flow_encode",),
    "length_regulator": ("length_regulate",),
    "estimator": ("estimate",),
    "vocoder": ("vocoder_f0", "vocoder_source", "vocoder_decode"),
}
#: graph -> swap group, from the v1 graph table: a graph that is a swap group itself (the flow
#: graphs: one stage call each), else its component's (the vocoder's three graphs are run by
#: three calls of one group); graphs not listed (component ``llm``) only affect the LLM path
STAGE_GROUP = {g: (g if g in SWAP_GROUPS else spec.component)
               for g, spec in reference_table().items()
               if g in SWAP_GROUPS or spec.component in SWAP_GROUPS}
#: swap groups that change the mel (the flow component's graphs)
_MEL_GROUPS = tuple(g for g in reference_table().component("flow") if g in SWAP_GROUPS)
#: swap group -> the graph roles (:data:`cosyvino.families.ROLES`) it takes from the quantized
#: model in a family whose stages run on a graph runner (:mod:`.graph_accuracy`); the v1 graph
#: names above are those roles
SWAP_ROLES = {g: tuple(r for r, gg in STAGE_GROUP.items() if gg == g) for g in SWAP_GROUPS}


def audio_scopes(rows: list[dict], variants) -> dict:
    """variant -> mean/min SNR (dB) and, for mel variants, mean/max mel L1 and LSD (dB) over
    the per-text ``rows`` of an audio report."""
    scopes = {}
    for v in variants:
        vals = [r[v] for r in rows]
        sc = {"mean_snr_db": float(np.mean([x["snr_db"] for x in vals])),
              "min_snr_db": float(np.min([x["snr_db"] for x in vals]))}
        if "mel_l1" in vals[0]:
            sc.update({"mean_mel_l1": float(np.mean([x["mel_l1"] for x in vals])),
                       "max_mel_l1": float(np.max([x["mel_l1"] for x in vals])),
                       "mean_lsd_db": float(np.mean([x["lsd_db"] for x in vals])),
                       "max_lsd_db": float(np.max([x["lsd_db"] for x in vals]))})
        scopes[v] = sc
    return scopes


class SwappedStages:
    """The fp32 ``ref`` stages with the calls of ``groups`` (keys of :data:`SWAP_GROUPS`) taken
    from ``test``: isolates one quantized stage's effect. Duck-typed Stages (attributes
    delegate to ``ref``)."""

    def __init__(self, ref, test, groups):
        self._ref = ref
        self._calls = {m: getattr(test, m) for g in groups for m in SWAP_GROUPS[g]}

    def __getattr__(self, name):
        calls = self.__dict__.get("_calls", {})
        if name in calls:
            return calls[name]
        return getattr(self.__dict__["_ref"], name)


def audio_report(ref_stages, test_stages, texts: Iterable, changed_stages: Iterable[str],
                 seed: int = 0, speech_tokens: int | None = None) -> dict:
    """Mel and waveform distances of the quantized audio stages against fp32.

    For every text (first frontend segment, the text's speaker or the model's first): the fp32
    model samples speech tokens (seeded), then the fp32 flow + vocoder and each variant run on
    those same tokens with the same flow noise and NSF draws. Variants: each changed swap group
    alone (``estimator``, ``flow_encoder``, ``vocoder`` ...: the other stages fp32) and
    ``end_to_end`` (every changed audio stage). Mel variants are scored with
    :func:`~.metrics.mel_l1` and :func:`~.metrics.log_spectral_distance` (dB); every variant
    with :func:`~.metrics.snr_db` (dB). A vocoder-only swap vocodes the fp32 mel, so its mel
    metrics are absent. ``speech_tokens`` forces that many tokens per text (None: until EOS).

    Returns a JSON-able dict: ``scopes`` {variant: {mean/max mel_l1, mean/max lsd_db,
    mean/min snr_db}} and ``per_text`` rows. ``changed_stages``: IR stage names (keys of
    :data:`STAGE_GROUP`; others ignored). Raises InputError when no audio stage changed.
    """
    from ..errors import InputError
    from ..frontend import TextFrontend
    from cosyvino.families.cosyvoice1.pipeline import Pipeline
    from .metrics import log_spectral_distance, mel_l1, snr_db

    texts = list(texts)
    groups = [g for g in SWAP_GROUPS if g in {STAGE_GROUP.get(s) for s in changed_stages}]
    if not groups:
        raise InputError("no audio stage was quantized: nothing for the audio report to compare")
    variants = {g: [g] for g in groups}
    if len(groups) > 1:
        variants["end_to_end"] = groups
    frontend = TextFrontend()
    ref_pipe = Pipeline(ref_stages)
    pipes = {v: Pipeline(SwappedStages(ref_stages, test_stages, gs))
             for v, gs in variants.items()}
    first_speaker = next(iter(ref_stages.speakers))
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=(len(texts), 3))
    rows = []
    for i, item in enumerate(texts):
        speaker = item.speaker if item.speaker in ref_stages.speakers else first_speaker
        emb = ref_stages.speakers[speaker]
        seg = frontend.segments(item.text)[0]
        s_llm, s_flow, s_voc = (int(x) for x in seeds[i])
        tokens = ref_pipe.generate_speech_tokens(np.asarray(seg.token_ids, np.int64)[None, :],
                                                 emb, np.random.default_rng(s_llm),
                                                 num_tokens=speech_tokens)
        ref_mel = ref_pipe.tokens_to_mel(tokens, emb, np.random.default_rng(s_flow))
        ref_wav = ref_pipe.mel_to_wav(ref_mel, np.random.default_rng(s_voc))
        row = {"id": item.id, "language": item.language, "speaker": speaker,
               "speech_tokens": int(tokens.size), "mel_frames": int(ref_mel.shape[-1])}
        for v, gs in variants.items():
            pipe = pipes[v]
            if any(g in _MEL_GROUPS for g in gs):
                mel = pipe.tokens_to_mel(tokens, emb, np.random.default_rng(s_flow))
                res = {"mel_l1": mel_l1(ref_mel, mel),
                       "lsd_db": log_spectral_distance(ref_mel, mel)}
            else:
                mel, res = ref_mel, {}
            res["snr_db"] = snr_db(ref_wav, pipe.mel_to_wav(mel, np.random.default_rng(s_voc)))
            row[v] = res
        rows.append(row)
    scopes = audio_scopes(rows, variants)
    overall = "end_to_end" if "end_to_end" in scopes else groups[0]
    return {"method": "fp32 sampled tokens (seeded); same flow noise and NSF draws; "
                      "f32 compute", "texts": len(rows), "seed": seed,
            "overall": overall, "scopes": scopes, "per_text": rows}


def audio_is_finite(report: dict) -> bool:
    return all(math.isfinite(v) for sc in report["scopes"].values() for v in sc.values())


def format_audio_table(report: dict) -> str:
    head = ("variant", "mel L1", "max mel L1", "LSD dB", "max LSD dB", "SNR dB", "min SNR dB")
    rows = [head]
    cols = (("mean_mel_l1", "{:.4f}"), ("max_mel_l1", "{:.4f}"), ("mean_lsd_db", "{:.3f}"),
            ("max_lsd_db", "{:.3f}"), ("mean_snr_db", "{:.2f}"), ("min_snr_db", "{:.2f}"))
    for v, sc in report["scopes"].items():
        name = v + (" (overall)" if v == report["overall"] else "")
        rows.append((name, *(fmt.format(sc[k]) if k in sc else "-" for k, fmt in cols)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
