"""Registered voices (issue 15): the voice store on disk (atomic, checksummed, one file per
voice, re-read across stores/processes), name validation, duplicates, corrupt files, and
``Synthesizer.add_voice`` / ``remove_voice`` / ``voices`` (a registered voice == the same
prompt given per request)."""

from __future__ import annotations

import json
import os
import threading
import warnings

import numpy as np
import pytest

from cosyvino import Synthesizer
from cosyvino.errors import InputError, ModelDirError, UnknownSpeakerError
from cosyvino.voice_store import (
    CorruptVoiceError,
    InvalidVoiceNameError,
    UnknownVoiceError,
    VoiceExistsError,
    VoiceStore,
    VoiceStoreError,
    VoiceStoreWarning,
    check_name,
    read_voice,
)
from cosyvino.voices import Voice

from conftest import FIXTURES

pytest.importorskip("onnx")
PROMPT = FIXTURES / "zero_shot_prompt.wav"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "你好，世界。"


def _voice(name="v", seed=0, text="hello", n=20, m=34):
    rng = np.random.default_rng(seed)
    return Voice(name, rng.standard_normal((1, 192)).astype(np.float32),
                 rng.integers(0, 4096, n), rng.standard_normal((m, 80)).astype(np.float32),
                 text, prompt_seconds=1.5)


def _same(a: Voice, b: Voice):
    np.testing.assert_array_equal(a.embedding, b.embedding)
    np.testing.assert_array_equal(a.prompt_speech_tokens, b.prompt_speech_tokens)
    np.testing.assert_array_equal(a.prompt_mel, b.prompt_mel)
    assert a.prompt_text == b.prompt_text and a.digest() == b.digest()


# ---- the store alone ---------------------------------------------------------------------------
def test_round_trip_one_file_per_voice(tmp_path):
    store = VoiceStore(tmp_path / "voices", family="cosyvoice1")
    assert len(store) == 0 and not (tmp_path / "voices").exists()  # created on first add
    v = store.add(_voice("alice"))
    store.add(_voice("张三", seed=1, text=None))
    assert sorted(os.listdir(tmp_path / "voices")) == ["alice.npz", "张三.npz"]
    again = VoiceStore(tmp_path / "voices", family="cosyvoice1")
    assert list(again) == ["alice", "张三"]
    _same(again["alice"], v)
    assert again["张三"].prompt_text is None and again["alice"].prompt_seconds == 1.5
    info = again.info("alice")
    assert info["sha256"] == v.digest() and info["prompt_tokens"] == 20 and info["created"]
    voice, meta = read_voice(str(tmp_path / "voices" / "alice.npz"))
    assert meta["format"] == "cosyvino-voice" and meta["name"] == "alice"
    assert meta["family"] == "cosyvoice1"


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a\\b", ".hidden", "x.", "a b", "-x",
                                  "_x", "x" * 65, "a\x00b", "<prompt>", 3])
def test_bad_names_are_refused(tmp_path, name):
    store = VoiceStore(tmp_path)
    with pytest.raises(InvalidVoiceNameError):
        store.add(Voice(name, np.zeros((1, 192), np.float32)))
    assert os.listdir(tmp_path) == []


def test_good_names():
    for name in ("alice", "Bob-2", "v1.0", "张三", "日本語_声", "x" * 64):
        assert check_name(name) == name


def test_duplicates_builtin_names_and_overwrite(tmp_path):
    store = VoiceStore(tmp_path, reserved=["中文女"])
    store.add(_voice("alice"))
    with pytest.raises(VoiceExistsError, match="already registered"):
        store.add(_voice("alice", seed=2))
    with pytest.raises(VoiceExistsError, match="'alice' is already"):
        store.add(_voice("ALICE", seed=2))  # case-insensitive filesystems
    with pytest.raises(VoiceExistsError, match="built-in speaker"):
        store.add(_voice("中文女"))
    new = store.add(_voice("Alice", seed=3), overwrite=True)
    assert list(store) == ["Alice"] and os.listdir(tmp_path) == ["Alice.npz"]
    _same(VoiceStore(tmp_path)["Alice"], new)


def test_remove(tmp_path):
    store = VoiceStore(tmp_path)
    store.add(_voice("alice"))
    store.remove("alice")
    assert os.listdir(tmp_path) == [] and "alice" not in store
    with pytest.raises(UnknownVoiceError, match="no registered voice 'alice'"):
        store.remove("alice")
    assert isinstance(UnknownVoiceError("x", []), UnknownSpeakerError)


def _write_raw(path, arrays: dict, meta: dict):
    np.savez(path, **arrays, meta=np.array(json.dumps(meta)))


def test_corrupt_files_are_skipped_with_a_warning_never_a_wrong_voice(tmp_path):
    good = VoiceStore(tmp_path)
    v = good.add(_voice("good"))
    for name in ("trunc", "flip", "renamed", "garbage", "future"):
        good.add(_voice(name, seed=4))
    data = (tmp_path / "trunc.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    # another embedding under the original metadata: the checksum catches it
    with np.load(tmp_path / "flip.npz") as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")[()]))
    arrays["embedding"] = arrays["embedding"] + 1e-3
    _write_raw(tmp_path / "flip.npz", arrays, meta)
    os.replace(tmp_path / "renamed.npz", tmp_path / "other.npz")  # holds 'renamed'
    (tmp_path / "garbage.npz").write_bytes(b"not a zip at all")
    with np.load(tmp_path / "future.npz") as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")[()]))
    _write_raw(tmp_path / "future.npz", arrays, {**meta, "version": 99})
    (tmp_path / ".x.npz.123.tmp").write_bytes(b"half a write")  # ignored
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = VoiceStore(tmp_path)
    assert list(store) == ["good"]
    _same(store["good"], v)
    assert sorted(store.skipped) == ["flip", "future", "garbage", "other", "trunc"]
    assert len([w for w in caught if issubclass(w.category, VoiceStoreWarning)]) == 5
    assert "checksum mismatch" in store.skipped["flip"]
    assert "holds voice 'renamed'" in store.skipped["other"]
    assert "newer" in store.skipped["future"]
    with pytest.raises(CorruptVoiceError, match="checksum mismatch") as e:
        store["flip"]
    assert isinstance(e.value, ModelDirError) and e.value.path.endswith("flip.npz")
    # re-registering fixes it
    store.add(_voice("flip", seed=5), overwrite=True)
    assert "flip" in store and "flip" not in store.skipped


def test_check_rejects_voices_that_do_not_fit_the_model(tmp_path):
    VoiceStore(tmp_path).add(_voice("alice"))
    with pytest.warns(VoiceStoreWarning, match="does not fit this model: too big"):
        store = VoiceStore(tmp_path, check=lambda v: "too big")
    assert "alice" not in store and "alice" in store.skipped


def test_another_store_on_the_same_dir_sees_changes(tmp_path):
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.add(_voice("alice"))
    assert "alice" in b
    a.add(_voice("alice", seed=7), overwrite=True)
    _same(b["alice"], a["alice"])
    a.remove("alice")
    assert "alice" not in b and list(b) == []


def test_in_memory_store_and_unwritable_dir(tmp_path):
    mem = VoiceStore(None)
    mem.add(_voice("alice"))
    assert list(mem) == ["alice"] and mem.directory is None
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the directory should be: cannot be created
    store = VoiceStore(blocker / "voices")
    with pytest.raises(VoiceStoreError, match="pass voices_dir="):
        store.add(_voice("alice"))
    assert list(store) == []


# ---- through the Synthesizer ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def tts(tiny_model_dir, voices_dir):
    return Synthesizer(str(tiny_model_dir), backend="torch", voices_dir=voices_dir)


def test_registered_voice_equals_the_same_prompt_per_request(tts):
    v = tts.add_voice("alice", PROMPT, PROMPT_TEXT, overwrite=True)
    assert v.has_prompt and v.prompt_text == PROMPT_TEXT and not v.builtin
    assert "alice" in tts.voices and "alice" in tts.registered_voices
    assert set(tts.speakers) <= set(tts.voices)
    a = tts.synthesize(TEXT, "alice", seed=4, num_speech_tokens=30)
    b = tts.synthesize(TEXT, prompt_audio=PROMPT, prompt_text=PROMPT_TEXT, seed=4,
                       num_speech_tokens=30)
    np.testing.assert_array_equal(a.samples, b.samples)
    # without a transcript: cross-lingual by default, == prompt_audio alone
    tts.add_voice("bare", PROMPT, overwrite=True)
    c = tts.synthesize("<|en|>Hello.", "bare", seed=4, num_speech_tokens=30)
    d = tts.synthesize("<|en|>Hello.", prompt_audio=PROMPT, seed=4, num_speech_tokens=30)
    np.testing.assert_array_equal(c.samples, d.samples)
    info = tts.voice_info("alice")
    assert info["name"] == "alice" and info["has_prompt"] and info["sha256"] == v.digest()
    assert tts.voice_info(tts.speakers[0])["builtin"]


def test_voices_survive_a_new_synthesizer(tts, tiny_model_dir, voices_dir):
    tts.add_voice("keep", PROMPT, PROMPT_TEXT, overwrite=True)
    a = tts.synthesize(TEXT, "keep", seed=9, num_speech_tokens=20)
    fresh = Synthesizer(str(tiny_model_dir), backend="torch", voices_dir=voices_dir)
    assert "keep" in fresh.voices
    _same(fresh.voice("keep"), tts.voice("keep"))
    np.testing.assert_array_equal(fresh.synthesize(TEXT, "keep", seed=9,
                                                   num_speech_tokens=20).samples, a.samples)
    fresh.remove_voice("keep")
    assert "keep" not in tts.voices  # the other Synthesizer sees the removal
    with pytest.raises(UnknownSpeakerError, match="unknown speaker 'keep'"):
        tts.synthesize(TEXT, "keep")
    fresh.close()


def test_synthesizer_voice_errors(tts, tiny_model_dir, tmp_path):
    with pytest.raises(VoiceExistsError, match="built-in speaker"):
        tts.add_voice(tts.speakers[0], PROMPT, PROMPT_TEXT)
    with pytest.raises(InvalidVoiceNameError):
        tts.add_voice("../evil", PROMPT, PROMPT_TEXT)
    with pytest.raises(InputError, match="built-in speaker"):
        tts.remove_voice(tts.speakers[0])
    with pytest.raises(UnknownVoiceError):
        tts.remove_voice("never-added")
    with pytest.raises(InputError, match="prompt_text must be a non-empty string"):
        tts.add_voice("x", PROMPT, "   ")
    tts.add_voice("dup", PROMPT, overwrite=True)
    with pytest.raises(VoiceExistsError):
        tts.add_voice("dup", PROMPT)
    # a corrupt stored voice: a typed error when used, the others still load
    path = tts.voice_store.path_of("dup")
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.warns(VoiceStoreWarning):
        with pytest.raises(CorruptVoiceError, match="register it again"):
            tts.synthesize(TEXT, "dup")
    assert "dup" not in tts.voices
    tts.add_voice("dup", PROMPT, overwrite=True)
    assert "dup" in tts.voices
    # the default store is <model_dir>/voices; False keeps voices in memory
    link = tmp_path / "model"
    os.symlink(tiny_model_dir, link)
    assert Synthesizer(str(link), backend="torch").voice_store.directory == \
        os.path.abspath(os.path.join(str(link), "voices"))
    mem = Synthesizer(str(link), backend="torch", voices_dir=False)
    mem.add_voice("m", PROMPT)
    assert mem.voice_store.directory is None and "m" in mem.voices


def test_add_and_remove_while_synthesis_runs(tts):
    """The store is changed from another thread while the scheduler runs requests naming a
    registered voice: every request finishes with that voice's audio."""
    tts.add_voice("steady", PROMPT, PROMPT_TEXT, overwrite=True)
    want = tts.synthesize(TEXT, "steady", seed=1, num_speech_tokens=15).samples
    errors = []

    def churn():
        try:
            for i in range(3):
                tts.add_voice(f"tmp{i}", PROMPT, overwrite=True)
                tts.remove_voice(f"tmp{i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=churn)
    t.start()
    outs = [tts.synthesize(TEXT, "steady", seed=1, num_speech_tokens=15).samples
            for _ in range(3)]
    t.join()
    assert errors == []
    for out in outs:
        np.testing.assert_array_equal(out, want)
    assert not any(n.startswith("tmp") for n in tts.registered_voices)
