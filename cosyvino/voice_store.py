"""Registered voices on disk: one ``.npz`` file per voice in a directory (by default
``<model_dir>/voices/``), written atomically, checksummed, re-read when another process changes
the directory. Must not import torch.

File ``<dir>/<name>.npz`` (numpy ``savez``, read with ``allow_pickle=False``):

* ``embedding`` float32 [1, S], ``prompt_speech_tokens`` int64 [N], ``prompt_mel`` float32
  [M, bins] (the prompt bundle, :class:`cosyvino.voices.Voice`);
* ``meta``: a 0-d unicode array holding JSON: ``format`` (``"cosyvino-voice"``), ``version``
  (1), ``name`` (must equal the file name: a renamed file is not silently another voice),
  ``prompt_text``, ``prompt_seconds``, ``family``, ``created`` (UTC ISO 8601) and ``sha256``
  (:meth:`Voice.digest` of the bundle: arrays and text).

A file that fails to load (not a zip, truncated, a checksum or name mismatch, arrays that do not
fit the model) is skipped with a :class:`VoiceStoreWarning` and listed in
:attr:`VoiceStore.skipped`; using its name raises :class:`CorruptVoiceError`. Files whose name
starts with a dot (temporary files of a write in progress) are ignored.

Like the official ``add_zero_shot_spk`` (architecture sheet 3.7), the stored value is the whole
prompt bundle, so a registered voice skips the prompt models at synthesis.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Callable, Collection, Iterator

import numpy as np

from .errors import InputError, ModelDirError, UnknownSpeakerError
from .fileutil import atomic_write
from .voices import Voice

FORMAT, VERSION = "cosyvino-voice", 1
SUFFIX = ".npz"
#: longest voice name
MAX_NAME_LENGTH = 64
# letters/digits (any script) first; then letters, digits, "_", "-", "."; no path separators,
# no spaces, no leading dot (hidden / temporary files), no trailing dot (Windows)
_NAME = re.compile(r"[^\W_][\w.\-]*", re.UNICODE)


class VoiceStoreWarning(UserWarning):
    """A stored voice file was skipped (corrupt, renamed, or not fitting the model)."""


class VoiceStoreError(ModelDirError):
    """The voice store cannot be read or written (``path``: the file or directory)."""


class CorruptVoiceError(VoiceStoreError):
    """A registered voice's file failed its checks (checksum, format, name, model fit); the
    message says why and how to fix it (register the voice again)."""


class InvalidVoiceNameError(InputError):
    """A voice name that cannot be a file name in the store (module :func:`check_name`)."""


class VoiceExistsError(InputError):
    """A voice of this name exists (registered, or a built-in speaker); ``name`` is the name.
    Pass ``overwrite=True`` to replace a registered one."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


class UnknownVoiceError(UnknownSpeakerError):
    """No registered voice of this name (``available``: the registered names)."""

    def __init__(self, name: str, available):
        self.speaker = name
        self.available = sorted(available)
        InputError.__init__(self, f"no registered voice {name!r}; registered voices: "
                                  f"{', '.join(self.available) or 'none'}")


def check_name(name) -> str:
    """``name`` if it can name a voice: 1..64 characters, letters or digits (any script) first,
    then letters, digits, ``_``, ``-`` or ``.``, not ending with ``.``. Raises
    InvalidVoiceNameError otherwise (path separators, spaces, ``..`` tricks included)."""
    if not isinstance(name, str):
        raise InvalidVoiceNameError(f"voice name must be a string, got {type(name).__name__}")
    if not (1 <= len(name) <= MAX_NAME_LENGTH) or not _NAME.fullmatch(name) or \
            name.endswith("."):
        raise InvalidVoiceNameError(
            f"invalid voice name {name!r}: use 1-{MAX_NAME_LENGTH} letters, digits, '_', '-' or "
            "'.', starting with a letter or digit (no spaces, slashes or trailing dot)")
    return name


def _meta(voice: Voice, family: str) -> dict:
    return {"format": FORMAT, "version": VERSION, "name": voice.name,
            "prompt_text": voice.prompt_text, "prompt_seconds": voice.prompt_seconds,
            "family": family,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "sha256": voice.digest()}


def write_voice(path: str, voice: Voice, *, family: str = "", meta: dict | None = None) -> None:
    """Write ``voice`` to ``path`` atomically (a temporary file in the same directory, fsync,
    rename); ``meta``: its metadata (default: made now). Raises OSError."""
    arrays = {"embedding": voice.embedding}
    if voice.has_prompt:
        arrays["prompt_speech_tokens"] = voice.prompt_speech_tokens
        arrays["prompt_mel"] = voice.prompt_mel
    meta = meta if meta is not None else _meta(voice, family)
    arrays["meta"] = np.array(json.dumps(meta, ensure_ascii=False))
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def read_voice(path: str, *, family: str | None = None) -> tuple[Voice, dict]:
    """``(voice, meta)`` from a voice file, verified (format, version, name = file name,
    family when given, checksum). Raises CorruptVoiceError naming the problem."""
    name = os.path.basename(path)[: -len(SUFFIX)]

    def bad(why: str) -> CorruptVoiceError:
        return CorruptVoiceError(f"stored voice {name!r} ({path}) is unusable: {why}; "
                                 f"register it again (add_voice ..., overwrite=True)", path)

    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - BadZipFile, ValueError, OSError, zlib.error ...
        raise bad(f"not a readable voice file ({type(e).__name__}: {e})") from None
    try:
        meta = json.loads(str(data.pop("meta")[()]))
    except Exception:  # noqa: BLE001 - missing key, not JSON
        raise bad("no readable metadata") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise bad("not a cosyvino voice file")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise bad(f"format version {meta.get('version')!r} is newer than this cosyvino "
                  f"reads ({VERSION})")
    if meta.get("name") != name:
        raise bad(f"the file holds voice {meta.get('name')!r} (renamed file)")
    if family is not None and meta.get("family") not in (None, "", family):
        raise bad(f"made for model family {meta.get('family')!r}, this model is {family!r}")
    try:
        voice = Voice(name=name, embedding=data["embedding"],
                      prompt_speech_tokens=data.get("prompt_speech_tokens"),
                      prompt_mel=data.get("prompt_mel"), prompt_text=meta.get("prompt_text"),
                      prompt_seconds=meta.get("prompt_seconds"))
    except (KeyError, InputError) as e:
        raise bad(f"bad arrays ({e})") from None
    if voice.digest() != meta.get("sha256"):
        raise bad("checksum mismatch (the file was modified or damaged)")
    return voice, meta


class VoiceStore(Mapping):
    """Registered voices by name (a read-only Mapping; :meth:`add` / :meth:`remove` change it),
    kept in ``directory`` (None: in memory only). Thread-safe. Every read first picks up files
    another process (or another store on the same directory) added, replaced or removed.

    Args:
        directory: where voice files live (created on the first :meth:`add`); None: memory.
        family: the model family name recorded in (and checked on) files.
        check: ``voice -> reason | None``: why a stored voice does not fit the loaded model
            (such files are skipped with a warning).
        reserved: names that cannot be registered (the model's built-in speakers).

    Raises (constructor): nothing: a missing directory is an empty store; an unreadable one
    and unusable files are skipped with a :class:`VoiceStoreWarning`.
    """

    def __init__(self, directory: str | os.PathLike | None, *, family: str = "",
                 check: Callable[[Voice], str | None] | None = None,
                 reserved: Collection[str] = ()):
        self.directory = None if directory is None else os.path.abspath(os.fspath(directory))
        self.family = family
        self._check = check
        self.reserved = frozenset(reserved)
        self._lock = threading.RLock()
        self._voices: dict[str, Voice] = {}
        self._meta: dict[str, dict] = {}
        self._signatures: dict[str, tuple] = {}
        #: stored names that failed to load -> why (re-checked when their file changes)
        self.skipped: dict[str, str] = {}
        self._dir_stamp = None
        self._warned_unreadable = False
        self.refresh()

    # ---- reading --------------------------------------------------------------------------
    def path_of(self, name: str) -> str:
        """The file of voice ``name`` (InvalidVoiceNameError for a bad name; VoiceStoreError
        for an in-memory store)."""
        if self.directory is None:
            raise VoiceStoreError("this voice store keeps voices in memory only (no directory)")
        return os.path.join(self.directory, check_name(name) + SUFFIX)

    def refresh(self) -> None:
        """Re-read what changed in the directory since the last look (new, replaced and removed
        files); cheap when nothing did (one ``stat``)."""
        if self.directory is None:
            return
        with self._lock:
            try:
                st = os.stat(self.directory)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            except OSError as e:
                self._unreadable(e)
                return
            # a directory changed within the last 2 s may change again within its mtime's
            # granularity: look at the files then, whatever the stamp says
            stamp = None if st is None else (st.st_mtime_ns, st.st_ino)
            recent = st is not None and time.time() - st.st_mtime < 2.0
            if stamp == self._dir_stamp and not recent:
                return
            self._dir_stamp = stamp
            self._scan()

    def _scan(self) -> None:
        seen: dict[str, tuple] = {}
        try:
            entries = list(os.scandir(self.directory))
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        except OSError as e:
            self._unreadable(e)
            return
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            if not entry.is_file():
                continue
            seen[entry.name[: -len(SUFFIX)]] = (st.st_mtime_ns, st.st_size, st.st_ino)
        for name in list(self._signatures):
            if name not in seen:
                self._forget(name)
        for name, sig in seen.items():
            if self._signatures.get(name) != sig:
                self._signatures[name] = sig
                self._load(name)

    def _unreadable(self, error: OSError) -> None:
        """An unreadable store directory: warn once, serve what was read before."""
        if not self._warned_unreadable:
            self._warned_unreadable = True
            warnings.warn(f"cannot read the voice store {self.directory}: {error}",
                          VoiceStoreWarning, stacklevel=4)

    def _forget(self, name: str) -> None:
        self._signatures.pop(name, None)
        self._voices.pop(name, None)
        self._meta.pop(name, None)
        self.skipped.pop(name, None)

    def _load(self, name: str) -> None:
        self._voices.pop(name, None)
        self._meta.pop(name, None)
        self.skipped.pop(name, None)
        path = os.path.join(self.directory, name + SUFFIX)
        try:
            check_name(name)
            if name in self.reserved:
                raise CorruptVoiceError(f"stored voice {name!r} ({path}) has the name of a "
                                        "built-in speaker; rename or remove the file", path)
            voice, meta = read_voice(path, family=self.family or None)
            why = self._check(voice) if self._check is not None else None
            if why:
                raise CorruptVoiceError(f"stored voice {name!r} ({path}) does not fit this "
                                        f"model: {why}; register it again for this model",
                                        path)
        except (CorruptVoiceError, InvalidVoiceNameError) as e:
            self.skipped[name] = str(e)
            warnings.warn(f"skipping {e}", VoiceStoreWarning, stacklevel=3)
            return
        self._voices[name] = voice
        self._meta[name] = meta

    def __getitem__(self, name: str) -> Voice:
        self.refresh()
        with self._lock:
            if name in self._voices:
                return self._voices[name]
            if name in self.skipped:
                raise CorruptVoiceError(self.skipped[name],
                                        os.path.join(self.directory or "", name + SUFFIX))
        raise KeyError(name)

    def __contains__(self, name) -> bool:
        self.refresh()
        with self._lock:
            return name in self._voices

    def __iter__(self) -> Iterator[str]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        return len(self.snapshot())

    def snapshot(self) -> dict[str, Voice]:
        """name -> Voice of every usable registered voice, sorted by name (a copy)."""
        self.refresh()
        with self._lock:
            return {n: self._voices[n] for n in sorted(self._voices)}

    def info(self, name: str) -> dict:
        """JSON-ready description of registered voice ``name``: :meth:`Voice.describe` plus
        ``created`` (UTC ISO 8601) and ``sha256``. Raises UnknownVoiceError."""
        voice = self.get(name)
        if voice is None:
            raise UnknownVoiceError(name, self.snapshot())
        meta = self._meta.get(name, {})
        return {**voice.describe(), "created": meta.get("created"), "sha256": meta.get("sha256")}

    # ---- writing --------------------------------------------------------------------------
    def _same_name(self, name: str) -> str | None:
        """A registered name equal to ``name`` ignoring case (case-insensitive filesystems)."""
        folded = name.casefold()
        return next((n for n in self._voices if n.casefold() == folded), None)

    def check_new(self, name: str, *, overwrite: bool = False) -> str:
        """``name`` if a voice may be registered under it now (valid, not a built-in speaker,
        not taken unless ``overwrite``). Raises InvalidVoiceNameError / VoiceExistsError."""
        check_name(name)
        if name in self.reserved or name.casefold() in {r.casefold() for r in self.reserved}:
            raise VoiceExistsError(f"{name!r} is a built-in speaker of the model; pick another "
                                   "name", name)
        self.refresh()
        with self._lock:
            taken = self._same_name(name)
            if taken is not None and not overwrite:
                raise VoiceExistsError(f"a voice named {taken!r} is already registered; "
                                       "replace it (add_voice(..., overwrite=True), `cosyvino "
                                       "voices add --overwrite`, or the form field "
                                       "overwrite=true) or pick another name", name)
        return name

    def add(self, voice: Voice, *, overwrite: bool = False) -> Voice:
        """Register ``voice`` under ``voice.name`` (written to disk before it is visible).

        Raises:
            InvalidVoiceNameError / VoiceExistsError: as :meth:`check_new`.
            VoiceStoreError: the directory cannot be created or written (e.g. a read-only
                model dir: give the Synthesizer ``voices_dir=``).
        """
        name = voice.name
        meta = _meta(voice, self.family)
        with self._lock:
            self.check_new(name, overwrite=overwrite)
            old = self._same_name(name)
            if self.directory is not None:
                path = self.path_of(name)
                try:
                    os.makedirs(self.directory, exist_ok=True)
                    write_voice(path, voice, meta=meta)
                    if old is not None and old != name:
                        os.unlink(os.path.join(self.directory, old + SUFFIX))
                except OSError as e:
                    raise VoiceStoreError(
                        f"cannot write voice {name!r} to {self.directory}: {e}; pass "
                        "voices_dir= (a writable directory) to the Synthesizer", path) from None
                self._dir_stamp = None  # rescan on the next read (signatures of the new file)
            if old is not None and old != name:
                self._forget(old)
            self._voices[name] = voice
            self._meta[name] = meta
            self.skipped.pop(name, None)
        return voice

    def remove(self, name: str) -> None:
        """Unregister ``name`` (its file is deleted). Raises UnknownVoiceError (nothing
        registered under it), VoiceStoreError (the file cannot be deleted)."""
        self.refresh()
        with self._lock:
            if name not in self._voices and name not in self.skipped:
                raise UnknownVoiceError(name, self._voices)
            if self.directory is not None:
                path = os.path.join(self.directory, check_name(name) + SUFFIX)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise VoiceStoreError(f"cannot remove voice {name!r}: {e}", path) from None
                self._dir_stamp = None
            self._forget(name)
