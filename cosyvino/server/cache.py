"""Result cache: in-memory LRU in front of an on-disk store, keyed by SHA-256.

Only deterministic (seeded) requests are cached; the key covers everything the bytes depend
on (see :func:`cache_key`). Disk entries are ``MAGIC | sha256(payload) | payload``, written
to a temp file and renamed (a reader never sees a half-written entry); an entry whose checksum
does not match (truncated, bit rot, edited) is deleted and counts as a miss, so the next
synthesis rewrites it. Both layers have byte caps; the disk layer evicts least recently used
files (by mtime, which a hit refreshes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict

from ..fileutil import atomic_write

log = logging.getLogger("cosyvino.server")

MAGIC = b"CVCACHE1"
_HEADER = len(MAGIC) + 32
#: bump when the bytes for the same inputs change (encoders, join rule, int16 rule) or the
#: key's parts change (3: the voice by its bundle digest, the mode inputs; 4: entries are
#: complete files, with their lengths in the header)
CACHE_VERSION = 4


def model_fingerprint(model_dir: str, backend: str) -> str:
    """SHA-256 over the backend name and each model file's name, size and mtime (cheap:
    no weights are read; a replaced checkpoint changes size or mtime)."""
    h = hashlib.sha256(f"backend={backend}\n".encode())
    try:
        names = sorted(os.listdir(model_dir))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(model_dir, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.path.isfile(path):
            h.update(f"{name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_key(**parts) -> str:
    """SHA-256 of the canonical JSON of ``parts`` (model fingerprint, normalized text, voice,
    speed, format, seed, sampling parameters, ...) plus :data:`CACHE_VERSION`."""
    blob = json.dumps({"v": CACHE_VERSION, **parts}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"), default=repr)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def request_inputs_key(request) -> dict:
    """The cache-key parts of a validated :class:`cosyvino.request.SynthesisRequest` beyond
    text, speed, seed and format: ``mode``, ``voice`` (:meth:`cosyvino.voices.Voice.digest`:
    embedding, prompt tokens, prompt mel and prompt text, so a voice registered again under
    the same name, or an uploaded prompt, is keyed by its bundle), ``prompt_text``,
    ``instruction``, ``source`` (SHA-256 of the source recording's speech tokens, vc) and
    ``streaming`` (flow / final hop / vocoder streaming: ``final_hop="incremental"`` changes
    the audio)."""
    voice = request.voice
    tokens = request.speech_tokens
    return {"mode": request.mode,
            "voice": None if voice is None else voice.digest(),
            "prompt_text": request.prompt_text, "instruction": request.instruction,
            "source": None if tokens is None else hashlib.sha256(
                tokens.astype("<i8").tobytes()).hexdigest(),
            "streaming": [request.streaming.flow_streaming, request.streaming.final_hop,
                          request.streaming.vocoder_streaming]}


class ResultCache:
    """Thread-safe two-level cache of response bodies.

    Args:
        directory: on-disk layer (None = memory only).
        memory_bytes: cap of the in-memory LRU (0 disables it).
        disk_bytes: cap of the on-disk layer.
    """

    def __init__(self, directory: str | None, *, memory_bytes: int = 64 << 20,
                 disk_bytes: int = 1 << 30):
        self.directory = os.path.abspath(directory) if directory else None
        self.memory_bytes = max(0, int(memory_bytes))
        self.disk_bytes = max(0, int(disk_bytes))
        self._mem: OrderedDict[str, bytes] = OrderedDict()
        self._mem_size = 0
        self._lock = threading.Lock()
        self.corrupt_recovered = 0
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
            self._disk_size = sum(size for _, size, _ in self._disk_entries())

    # ---- public ------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        with self._lock:
            data = self._mem.get(key)
            if data is not None:
                self._mem.move_to_end(key)
                return data
        data = self._disk_get(key)
        if data is not None:
            self._mem_put(key, data)
        return data

    def put(self, key: str, data: bytes) -> None:
        self._mem_put(key, data)
        self._disk_put(key, data)

    def path(self, key: str) -> str | None:
        """On-disk location of ``key`` (tests, debugging)."""
        if not self.directory:
            return None
        return os.path.join(self.directory, key[:2], key + ".bin")

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()
            self._mem_size = 0

    # ---- memory ------------------------------------------------------------------------------
    def _mem_put(self, key: str, data: bytes) -> None:
        if len(data) > self.memory_bytes:
            return
        with self._lock:
            old = self._mem.pop(key, None)
            if old is not None:
                self._mem_size -= len(old)
            self._mem[key] = data
            self._mem_size += len(data)
            while self._mem_size > self.memory_bytes and self._mem:
                _, dropped = self._mem.popitem(last=False)
                self._mem_size -= len(dropped)

    # ---- disk --------------------------------------------------------------------------------
    def _disk_get(self, key: str) -> bytes | None:
        path = self.path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cache: cannot read %s: %s", path, e)
            return None
        payload = blob[_HEADER:]
        if (len(blob) < _HEADER or blob[:len(MAGIC)] != MAGIC
                or hashlib.sha256(payload).digest() != blob[len(MAGIC):_HEADER]):
            log.warning("cache: corrupt entry %s ignored (will be rewritten)", path)
            self.corrupt_recovered += 1
            self._unlink(path, len(blob))
            return None
        try:
            os.utime(path)  # LRU order on disk
        except OSError:
            pass
        return payload

    def _disk_put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        if path is None or _HEADER + len(data) > self.disk_bytes:
            return
        blob = MAGIC + hashlib.sha256(data).digest() + data
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            try:
                old = os.path.getsize(path)
            except OSError:
                old = 0
            with atomic_write(path) as f:
                f.write(blob)
        except OSError as e:
            log.warning("cache: cannot write %s: %s", path, e)
            return
        with self._lock:
            self._disk_size += len(blob) - old
            over = self._disk_size > self.disk_bytes
        if over:
            self._evict_disk()

    def _disk_entries(self):
        """(path, size, mtime) of every entry file."""
        out = []
        for sub in os.listdir(self.directory):
            d = os.path.join(self.directory, sub)
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                if not name.endswith(".bin"):
                    continue
                p = os.path.join(d, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out.append((p, st.st_size, st.st_mtime))
        return out

    def _evict_disk(self) -> None:
        entries = sorted(self._disk_entries(), key=lambda e: e[2])
        total = sum(e[1] for e in entries)
        for p, size, _ in entries:
            if total <= self.disk_bytes * 0.9:
                break
            try:
                os.unlink(p)
                total -= size
            except OSError:
                pass
        with self._lock:
            self._disk_size = total

    def _unlink(self, path: str, size: int) -> None:
        try:
            os.unlink(path)
        except OSError:
            return
        with self._lock:
            self._disk_size -= size
