"""Text in (issue 36 item 5): text pieces -> the bistream LLM input (sheet v2 §4.6) -> audio.

* :class:`IncrementalTokenizer`: the ids of text given piece by piece equal the ids of the whole
  text, for every cut of tricky strings (words, CJK, tags split inside, NFC, emoji);
* :class:`Utf8Pieces`: UTF-8 bytes cut inside a character, surrogate pairs cut in two, and the
  typed errors for bad UTF-8 / lone surrogates;
* :class:`BistreamLayout`: the LLM input of each call and the FILL positions as the sheet's
  pseudo-code gives them (no prompt, a zero-shot prompt, a sampled FILL, text ending after a
  FILL: the fed-twice quirk, text shorter than 5 tokens: the non-streamed layout);
* the v2 program on tiny-c: only new positions reach the KV-cached session (prefill of the new
  text, never a re-run), same seed + text + flush points = same audio however cut, flushes make
  utterances, punctuation-only / empty pieces, nothing speakable -> EmptyTextError, v1 refused,
  cancel while waiting for text, bounded text waiting for the LLM (backpressure).
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from cosyvino.errors import EmptyTextError, InputError, SynthesisCancelled
from cosyvino.families.cosyvoice23.bistream import (EMIT, END, FILL, SOS, SPEECH, TASK, TEXT,
                                                    BistreamLayout, Part)
from cosyvino.families.cosyvoice23.incremental_text import IncrementalTokenizer
from cosyvino.text_stream import FLUSH, Utf8Pieces

from conftest import TINY_A, TINY_C, TINY_E

TRICKY = [
    "Hello world, it's 2024!!\n\nNew  line   ends.",
    "在他讲述那个荒诞故事的过程中，他突然[laughter]停下来。",
    "You are a helpful assistant.<|endofprompt|>希望你以后能够做的比我还好呦。",
    "<strong>勇气</strong> and [breath] [laugh [lipsmack]",
    "cafe\u0301 naïve — “quoted” 😀 ok?! <|en|>Hello",
]


@pytest.fixture(scope="module")
def tokenizer():
    from cosyvino.families.cosyvoice23.tokenizer import load_qwen_tokenizer

    return load_qwen_tokenizer(TINY_C)


def _pieces_ids(tokenizer, pieces) -> list[int]:
    inc = IncrementalTokenizer(tokenizer)
    ids = []
    for p in pieces:
        ids += inc.push(p)
    return ids + inc.finish()


@pytest.mark.parametrize("text", TRICKY)
def test_incremental_ids_equal_the_whole_texts_for_every_cut(tokenizer, text):
    whole = tokenizer.encode(text)
    for i in range(len(text) + 1):  # every cut in two
        assert _pieces_ids(tokenizer, [text[:i], text[i:]]) == whole, i
    rng = random.Random(0)
    for _ in range(30):  # random cuts into many pieces (empty ones too)
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(2, 12)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert _pieces_ids(tokenizer, pieces) == whole
    assert _pieces_ids(tokenizer, list(text)) == whole  # one character at a time


def test_a_tag_split_in_the_middle_is_one_special_token(tokenizer):
    inc = IncrementalTokenizer(tokenizer)
    first = inc.push("他突然[laugh")
    assert "[laugh" in inc.pending  # held: it may still become the special
    rest = inc.push("ter]停") + inc.finish()
    assert 151651 in first + rest and first + rest == tokenizer.encode("他突然[laughter]停")


def test_utf8_bytes_and_surrogates_cut_inside_a_character():
    text = "naïve 你好 😀"
    data = text.encode()
    for i in range(len(data) + 1):
        p = Utf8Pieces()
        assert p.piece(data[:i]) + p.piece(data[i:]) == text
        p.finish()
    p = Utf8Pieces()  # JSON "\ud83d" then "\ude00"
    assert p.piece("a\ud83d") == "a" and p.piece("\ude00b") == "😀b"
    with pytest.raises(InputError, match="UTF-8"):
        Utf8Pieces().piece(b"\xff\xfe")
    p = Utf8Pieces()
    p.piece(data[:-1])
    with pytest.raises(InputError, match="inside a UTF-8 character"):
        p.finish()
    with pytest.raises(InputError, match="surrogate"):
        Utf8Pieces().piece("a\ude00b")
    with pytest.raises(InputError, match="str or bytes"):
        Utf8Pieces().piece(12)


# ---- the layout (sheet v2 §4.6) ------------------------------------------------------------
def _run_layout(layout: BistreamLayout, text_ids, *, end: bool, fill_at=()):
    """Drive ``layout`` with a sampler that returns speech token 7 (or FILL at the ``out``
    indexes in ``fill_at``); returns the list of (fed parts, decision) per LLM call."""
    calls = []
    layout.push(text_ids)
    if end:
        layout.end()

    def sample(logp, history):
        assert np.isneginf(logp[6561]) or layout.final  # EOS masked inside a group
        if layout.final:
            return 6561 if len(history) >= 60 else 7
        return 6563 if len(history) in fill_at else 7

    while (parts := layout.forward_due()) is not None:
        calls.append((parts, layout.decide(np.zeros(6564, np.float32), sample)))
    return calls


def test_layout_without_a_prompt_groups_5_text_then_15_speech_then_fill():
    layout = BistreamLayout()
    calls = _run_layout(layout, range(100, 112), end=True)
    t = lambda *ids: Part(TEXT, tuple(ids))  # noqa: E731
    assert calls[0][0] == [Part(SOS), t(100, 101, 102, 103, 104)]
    assert [d for _, d in calls[:16]] == [(EMIT, 7)] * 15 + [(FILL, None)]
    assert layout.out[15] == 6563  # forced at index 15, no draw
    assert calls[16][0] == [t(105, 106, 107, 108, 109)]  # replaces the input: FILL not fed
    assert layout.out[31] == 6563  # then every 16th
    # the text ended after a FILL: the last fed speech token is fed again (upstream's quirk)
    assert calls[32][0] == [Part(SPEECH, (7,)), t(110, 111), Part(TASK)]
    assert calls[-1][1] == (END, None) and layout.done


def test_layout_with_a_zero_shot_prompt_interleaves_it_first():
    # 7 transcript ids queued before the text, 20 prompt speech tokens: 5 text + 15 speech,
    # then 5 text + the last 5 speech; next_fill = (20 // 15 + 1) * 15 - 20 = 10
    layout = BistreamLayout(range(1, 8), range(500, 520))
    calls = _run_layout(layout, range(100, 104), end=False)
    assert calls[0][0] == [Part(SOS), Part(TEXT, (1, 2, 3, 4, 5)),
                           Part(SPEECH, tuple(range(500, 515))),
                           Part(TEXT, (6, 7, 100, 101, 102)),
                           Part(SPEECH, tuple(range(515, 520)))]
    assert len(calls) == 11 and calls[-1][1] == (FILL, None) and layout.out[10] == 6563
    assert layout.forward_due() is None  # 1 text id queued: waits for 4 more
    layout.push([104, 105, 106, 107])
    assert layout.forward_due() == [Part(TEXT, (103, 104, 105, 106, 107))]


def test_a_sampled_fill_ends_the_group_early_and_moves_the_next_one():
    layout = BistreamLayout()
    _run_layout(layout, range(100, 115), end=False, fill_at=(3,))
    assert layout.out[3] == 6563 and layout.out[4 + 15] == 6563  # next forced one 16 later
    assert layout.out.count(6563) == 3


def test_short_text_gives_the_non_streamed_layout():
    layout = BistreamLayout()
    calls = _run_layout(layout, [100, 101, 102], end=True)
    assert calls[0][0] == [Part(SOS), Part(TEXT, (100, 101, 102)), Part(TASK)]


def test_end_phase_masks_other_stop_ids_and_is_bounded():
    layout = BistreamLayout(max_len=4)
    layout.push([1])
    layout.end()
    seen = []

    def sample(logp, history):
        seen.append((np.isneginf(logp[6562]), np.isneginf(logp[6563]), np.isneginf(logp[6561])))
        return 9

    while (layout.forward_due()) is not None:
        layout.decide(np.zeros(6564, np.float32), sample)
    assert seen[0] == (True, True, False) and len(seen) == 4 and layout.done


# ---- the v2 program on tiny-c ----------------------------------------------------------------
SPEAKER = "中文女"
SENTENCE = "Hello world, this is a streamed sentence. 你好，世界。"


@pytest.fixture(scope="module")
def tts():
    pytest.importorskip("torch")
    from cosyvino import Synthesizer

    t = Synthesizer(str(TINY_C), backend="torch", num_threads=1, voices_dir=False)
    yield t
    t.close()


def _cut(text, n):
    return [text[i:i + n] for i in range(0, len(text), n)]


def _audio(chunks):
    return np.concatenate([c.samples for c in chunks])


@pytest.fixture(scope="module")
def reference(tts):
    return list(tts.stream_text([SENTENCE], SPEAKER, seed=1))


def test_same_seed_same_audio_however_the_text_is_cut(tts, reference):
    ref = _audio(reference)
    assert ref.size > 0 and len(reference) > 1  # streamed: several hops
    for pieces in (_cut(SENTENCE, 1), _cut(SENTENCE, 15),
                   [p.encode() for p in _cut(SENTENCE, 4)],
                   ["", *_cut(SENTENCE, 7), "", ""]):
        np.testing.assert_array_equal(_audio(tts.stream_text(pieces, SPEAKER, seed=1)), ref)
    other = _audio(tts.stream_text([SENTENCE], SPEAKER, seed=9))
    assert not np.array_equal(other[:min(other.size, ref.size)], ref[:min(other.size, ref.size)])


def test_only_new_positions_reach_the_kv_cache(tts):
    """Each LLM call feeds what the layout adds (SOS + 5 text, then 1 speech token or 5 text
    after a FILL, and the rest + TASK at the end): positions fed = the session's cache."""
    from cosyvino.families.cosyvoice23.graph_stages import GraphLLMSession

    fed, lengths = [], []
    original = GraphLLMSession.forward

    def forward(self, inputs_embeds):
        fed.append(int(inputs_embeds.shape[1]))
        out = original(self, inputs_embeds)
        lengths.append(self.cache_length())
        return out

    GraphLLMSession.forward = forward
    try:
        chunks = list(tts.stream_text(_cut(SENTENCE, 3), SPEAKER, seed=1))
    finally:
        GraphLLMSession.forward = original
    assert fed[0] == 1 + 5 and set(fed[1:16]) == {1}
    assert fed[16] == 5  # after the FILL: the next 5 text tokens, nothing re-run
    assert list(np.cumsum(fed)) == lengths  # every call appended to the cache
    assert fed[-1] == 1  # the last call fed the last speech token and drew EOS
    assert sum(c.speech_tokens.size for c in chunks) > 15


def test_flushes_make_utterances_and_dropped_punctuation(tts):
    pieces = ["Hello there.", FLUSH, "...", " !", FLUSH, "你好，", "世界。", FLUSH, "", "Bye"]
    chunks = list(tts.stream_text(pieces, SPEAKER, seed=2))
    segments = sorted({c.stats["segment"] for c in chunks})
    assert segments == [0, 1, 2]  # the punctuation-only utterance made no audio
    assert sum(c.stats["is_last_in_segment"] for c in chunks) == 3
    # the same utterances, cut otherwise and with the punctuation-only one left out
    again = list(tts.stream_text(["Hel", "lo there.", FLUSH, "你好", "，世界。", FLUSH, "Bye"],
                                 SPEAKER, seed=2))
    np.testing.assert_array_equal(_audio(again), _audio(chunks))


def test_nothing_speakable_is_a_typed_error(tts):
    with pytest.raises(EmptyTextError):
        list(tts.stream_text(["", "...", FLUSH, "!?"], SPEAKER, seed=1))


def test_zero_shot_voice_streams(tts):
    chunks = list(tts.stream_text(_cut("Hello world, streamed with a prompt.", 5),
                                  voice="alice", seed=1))
    assert chunks and chunks[0].stats["mode"] == "zero_shot"


def test_v1_family_refuses_text_in():
    pytest.importorskip("torch")
    from cosyvino import Synthesizer

    t = Synthesizer(str(TINY_A), backend="torch", voices_dir=False)
    try:
        with pytest.raises(InputError, match="takes no streamed text"):
            t.open_text_stream(t.speakers[0])
    finally:
        t.close()


def test_bad_arguments_are_refused_at_the_call(tts):
    from cosyvino.errors import UnknownSpeakerError

    with pytest.raises(UnknownSpeakerError):
        tts.open_text_stream("nobody")
    with pytest.raises(InputError, match="max_pending_tokens"):
        tts.open_text_stream(SPEAKER, max_pending_tokens=0)
    stream = tts.open_text_stream(SPEAKER, seed=1)
    stream.send("Hi there.")
    stream.close()
    with pytest.raises(InputError, match="closed"):
        stream.send("more")
    assert list(stream)


def test_cancel_while_waiting_for_text(tts):
    stream = tts.open_text_stream(SPEAKER, seed=1)
    stream.send("Hello")  # under 5 tokens: the LLM waits for more text
    result = []
    reader = threading.Thread(target=lambda: result.append(
        pytest.raises(SynthesisCancelled, list, stream)))
    reader.start()
    stream.cancel()
    reader.join(30)
    assert not reader.is_alive() and result
    # the model serves the next request
    assert list(tts.stream_text(["Next one."], SPEAKER, seed=1))


def test_text_waiting_for_the_llm_is_bounded(tts):
    """``wait_for_room`` blocks while more than the bound waits; stepping the LLM frees it."""
    req = tts.request("", SPEAKER, seed=1, text_stream=True)
    state = tts.engine.start(req)
    program = state.program
    try:
        program.feed_text("one two three four five six seven eight nine ten eleven twelve ")
        assert program.pending_text_tokens > 8
        assert program.wait_for_room(8, timeout=0.05) is False
        program.step("llm")  # takes 5 text tokens, one LLM call
        while program.pending_text_tokens > 8:
            program.step("llm")
        assert program.wait_for_room(8, timeout=0.05) is True
    finally:
        program.close()


def test_iterator_errors_reach_the_caller(tts):
    def pieces():
        yield "Hello world, this is"
        raise ValueError("the chat model failed")

    with pytest.raises(ValueError, match="chat model failed"):
        list(tts.stream_text(pieces(), SPEAKER, seed=1))


def test_async_iterable(tts, reference):
    import asyncio

    async def pieces():
        for p in _cut(SENTENCE, 15):
            await asyncio.sleep(0)
            yield p

    async def run():
        return [c async for c in tts.astream_text(pieces(), SPEAKER, seed=1)]

    np.testing.assert_array_equal(_audio(asyncio.run(run())), _audio(reference))


def test_v3_places_the_system_prompt_and_decodes_at_the_first_text_token():
    # upstream CosyVoice3LM.inference_bistream: [SOS][prompt up to <|endofprompt|>] is the
    # input, and with no prompt speech the first group starts at once (sheet v3 §4)
    from cosyvino.families.cosyvoice23.bistream import BistreamTokens

    layout = BistreamLayout((7, 8), (), BistreamTokens(eos_token=6562, fill_token=6564),
                            placed_text=(1, 2, 151646))
    layout.push([100])
    assert layout.forward_due() == [Part(SOS), Part(TEXT, (1, 2, 151646))]
    assert list(layout.text) == [7, 8, 100]  # queued: the rest of the prompt text, then 100


def test_v3_text_in_same_audio_however_cut():
    pytest.importorskip("torch")
    from cosyvino import Synthesizer

    t = Synthesizer(str(TINY_E), backend="torch", num_threads=1, voices_dir=False)
    try:
        whole = _audio(t.stream_text([SENTENCE], SPEAKER, seed=1))
        assert whole.size > 0
        np.testing.assert_array_equal(_audio(t.stream_text(_cut(SENTENCE, 3), SPEAKER, seed=1)),
                                      whole)
    finally:
        t.close()
