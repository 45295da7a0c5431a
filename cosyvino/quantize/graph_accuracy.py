"""Accuracy of a quantized conversion against fp32 for a family whose stages run on a graph
runner (CosyVoice2 ...), by graph ROLE (:data:`cosyvino.families.ROLES`): the family's own
program builds every input, so nothing here knows a family's layout. No torch.

* LLM (:func:`llm_teacher_forced_report`): each model's program builds its own prefix (its own
  text embedding), recorded at the ``llm`` graph's first call; then both ``llm`` graphs are fed
  the fp32 model's greedy speech tokens, each through its own ``speech_embedding`` graph; top-1
  agreement and KL(fp32 || quantized) at every position (the v1 report's method,
  :mod:`.accuracy`).
* audio (:func:`audio_report`): the fp32 model samples speech tokens (seeded), then fp32 and each
  variant vocode those tokens (token-to-wav, the same seed: the same NSF draws; the flow noise
  of these families is fixed). A variant runs the graphs of its roles on the quantized runner
  and the rest on the fp32 one. The mel is what the ``hift_f0`` graph receives.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..backends.graphs import GraphSession
from ..errors import InputError
from .accuracy import _MEL_GROUPS, STAGE_GROUP, SWAP_ROLES, _kl, audio_scopes
from .graph_capture import _Delegating, runner_of, speaking_voices


class _FirstCall(GraphSession):
    """A session that copies its first call's first input (the prefix rows) into ``sink``."""

    def __init__(self, inner: GraphSession, sink: list):
        self._inner = inner
        self._sink = sink
        self._seen = False

    def run(self, inputs):
        if not self._seen:
            self._seen = True
            self._sink.append(np.array(inputs[0], np.float32, copy=True))
        return self._inner.run(inputs)

    def reset(self):
        self._inner.reset()

    def close(self):
        self._inner.close()

    def state_length(self):
        return self._inner.state_length()

    def state_arrays(self):
        return self._inner.state_arrays()


class _PrefixRunner(_Delegating):
    """Records the first call of each ``llm`` session (a segment's prefix)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.prefixes: list[np.ndarray] = []

    def new_session(self, graph):
        session = self.inner.new_session(graph)
        if self.inner.table[graph].role != "llm":
            return session
        return _FirstCall(session, self.prefixes)


class _SwappedRunner(_Delegating):
    """``ref`` with the graphs in ``graphs`` run on ``test`` instead; records the mels the
    ``hift_f0`` graph receives."""

    def __init__(self, ref, test, graphs):
        super().__init__(ref)
        self.test = test
        self.graphs = set(graphs)
        self.mels: list[np.ndarray] = []

    def run(self, graph, inputs):
        if self.inner.table[graph].role == "hift_f0":
            self.mels.append(np.array(inputs[0], np.float32, copy=True))
        runner = self.test if graph in self.graphs else self.inner
        return runner.run(graph, inputs)

    def new_session(self, graph):
        runner = self.test if graph in self.graphs else self.inner
        return runner.new_session(graph)


def _synthesizer(stages, family, runner, conv_dir):
    from ..synthesizer import Synthesizer

    st = family.stages_from_runner(runner, conv_dir)
    return Synthesizer.from_stages(st, backend_name="openvino", model_dir=conv_dir,
                                   voices_dir=False)


def _only(table, role: str) -> str:
    names = table.with_role(role)
    if len(names) != 1:
        raise InputError(f"the model's graph table has {len(names)} graphs of role {role!r}; "
                         "the accuracy report needs exactly one")
    return names[0]


def _prefix(tts, rec: _PrefixRunner, text: str, voice: str) -> np.ndarray:
    """The LLM input rows of the first segment of ``text``, built by the model's program."""
    state = tts.engine.start(tts.request(text, voice, seed=0, hop_schedule="segment"))
    try:
        rec.prefixes.clear()
        while not rec.prefixes and not state.done:
            tts.engine.step(state)
    finally:
        state.program.close()
    if not rec.prefixes:
        raise InputError(f"no LLM call for {text!r}")
    return rec.prefixes[0]


def llm_teacher_forced_report(ref_stages, test_stages, texts: Iterable, family,
                              conv_dirs: tuple[str, str], tokens_per_text: int = 20) -> dict:
    """The LLM path of ``test_stages`` against ``ref_stages`` (both loaded on a graph runner,
    f32 compute and KV cache), teacher-forced along the fp32 greedy path (EOS and the other
    non-speech rows of the head never forced). ``conv_dirs``: the (fp32, quantized) converted
    dirs. Returns the dict of :func:`.accuracy.llm_teacher_forced_report` (``per_text`` rows,
    ``top1_agreement``, ``mean_kl`` / ``max_kl`` in nats)."""
    ref_run, test_run = runner_of(ref_stages), runner_of(test_stages)
    table = ref_run.table
    llm, embed = _only(table, "llm"), _only(table, "speech_embedding")
    vocab = family.speech_vocab(ref_stages.config)
    recs = (_PrefixRunner(ref_run), _PrefixRunner(test_run))
    ttss = [_synthesizer(s, family, r, d) for s, r, d in zip((ref_stages, test_stages), recs,
                                                             conv_dirs)]
    rows, all_agree, all_kl = [], [], []
    try:
        voices = speaking_voices(ttss[0])
        for item in texts:
            voice = item.speaker if item.speaker in voices else voices[0]
            xs = [_prefix(t, r, item.text, voice) for t, r in zip(ttss, recs)]
            sessions = [ref_run.new_session(llm), test_run.new_session(llm)]
            agree, kls = [], []
            try:
                for _ in range(tokens_per_text + 1):
                    lr, lt = (s.run([x])[0][0] for s, x in zip(sessions, xs))
                    agree.append(int(np.argmax(lr)) == int(np.argmax(lt)))
                    kls.append(_kl(lr, lt))
                    token = np.array([[int(np.argmax(lr[:vocab]))]], np.int64)
                    xs = [run.run(embed, [token])[0] for run in (ref_run, test_run)]
            finally:
                for s in sessions:
                    s.close()
            rows.append({"id": item.id, "language": item.language, "speaker": voice,
                         "positions": len(kls), "top1_agreement": float(np.mean(agree)),
                         "mean_kl": float(np.mean(kls)), "max_kl": float(np.max(kls))})
            all_agree += agree
            all_kl += kls
    finally:
        for t in ttss:
            t.close()
    return {"method": "teacher-forced, fp32 greedy path, f32 compute and KV cache",
            "texts": len(rows), "tokens_per_text": tokens_per_text,
            "positions": len(all_kl), "top1_agreement": float(np.mean(all_agree)),
            "mean_kl": float(np.mean(all_kl)), "max_kl": float(np.max(all_kl)),
            "per_text": rows}


def audio_report(ref_stages, test_stages, texts: Iterable, changed_roles: Iterable[str],
                 family, conv_dir: str, seed: int = 0,
                 speech_tokens: int | None = None) -> dict:
    """Mel and waveform distances of the quantized audio graphs against fp32, the dict of
    :func:`.accuracy.audio_report` (``scopes`` per variant, ``overall``, ``per_text``).
    ``changed_roles``: roles of the changed graphs (keys of :data:`.accuracy.STAGE_GROUP`;
    others ignored); ``conv_dir``: the fp32 converted dir. Raises InputError when no audio
    graph changed."""
    from .metrics import log_spectral_distance, mel_l1, snr_db

    texts = list(texts)
    changed = {STAGE_GROUP.get(r) for r in changed_roles}
    groups = [g for g in SWAP_ROLES if g in changed]
    if not groups:
        raise InputError("no audio stage was quantized: nothing for the audio report to compare")
    ref_run, test_run = runner_of(ref_stages), runner_of(test_stages)
    table = ref_run.table
    variants = {g: [g] for g in groups}
    if len(groups) > 1:
        variants["end_to_end"] = groups
    runners = {"fp32": _SwappedRunner(ref_run, test_run, ())}
    for v, gs in variants.items():
        graphs = [n for g in gs for r in SWAP_ROLES[g] for n in table.with_role(r)]
        runners[v] = _SwappedRunner(ref_run, test_run, graphs)
    ttss = {v: _synthesizer(ref_stages, family, r, conv_dir) for v, r in runners.items()}
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=(len(texts), 2))
    rows = []

    def vocode(v, tokens, voice, s_voc):
        runners[v].mels.clear()
        wav = ttss[v].tokens_to_audio(tokens, voice, seed=s_voc).samples
        return np.concatenate(runners[v].mels, axis=-1), wav

    try:
        voices = speaking_voices(ttss["fp32"])
        for i, item in enumerate(texts):
            voice = item.speaker if item.speaker in voices else voices[0]
            s_llm, s_voc = (int(x) for x in seeds[i])
            tokens = ttss["fp32"].synthesize(item.text, voice, seed=s_llm,
                                             num_speech_tokens=speech_tokens).speech_tokens
            ref_mel, ref_wav = vocode("fp32", tokens, voice, s_voc)
            row = {"id": item.id, "language": item.language, "speaker": voice,
                   "speech_tokens": int(tokens.size), "mel_frames": int(ref_mel.shape[-1])}
            for v, gs in variants.items():
                mel, wav = vocode(v, tokens, voice, s_voc)
                res = ({"mel_l1": mel_l1(ref_mel, mel),
                        "lsd_db": log_spectral_distance(ref_mel, mel)}
                       if any(g in _MEL_GROUPS for g in gs) else {})
                res["snr_db"] = snr_db(ref_wav, wav)
                row[v] = res
            rows.append(row)
    finally:
        for t in ttss.values():
            t.close()
    scopes = audio_scopes(rows, variants)
    overall = "end_to_end" if "end_to_end" in scopes else groups[0]
    return {"method": "fp32 sampled tokens (seeded), token-to-wav with the same seed (same "
                      "NSF draws, fixed flow noise); f32 compute", "texts": len(rows),
            "seed": seed, "overall": overall, "scopes": scopes, "per_text": rows}


__all__ = ["audio_report", "llm_teacher_forced_report"]
