"""Keep the OpenVINO CPU backend's resident memory to one copy of the weights and one stage's
intermediate buffers. Must not import torch.

What holds memory and how each helper frees it (the measurements are in docs/performance.md,
"Measurements behind code constants"; ``benchmarks/ov_memory.py`` reproduces them):

* the CPU plugin repacks weights into its own buffers while the IR ``.bin`` stays mapped, so
  the pages read while repacking stay counted in RSS: :func:`release_weight_pages` drops them
  (``madvise(MADV_DONTNEED)``; a page still read directly is faulted back from the page cache,
  so results never change, only residency);
* a constant ``Broadcast`` in front of a MatMul is folded into ``B`` weight copies:
  :func:`fold_weight_broadcasts` feeds the constant straight to the MatMul (same product by
  numpy-style batch broadcasting), for IRs exported before the estimator linears were 2-D;
* every compiled model keeps the activation buffers of the largest shapes it ran:
  :class:`IntermediateReleaser` frees them at quiet stage transitions.

(Handled elsewhere: a kernel + buffers kept per distinct MatMul shape, bounded by the LLM's
bucketed position table — ``cosyvino.export.openvino.model_patcher.POS_BUCKET`` — and the
vocoder's buffers growing with the mel length, bounded by decode windows,
``cosyvino.families.cosyvoice1.pipeline.vocoder_chunks``.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from typing import Callable

log = logging.getLogger("cosyvino.openvino")

_MADV_DONTNEED = 4  # <sys/mman.h> on Linux (all architectures)
_libc = None


def fold_weight_broadcasts(model) -> int:
    """Rewire ``MatMul(x, Broadcast(Constant W))`` to ``MatMul(x, W)`` in place.

    Only broadcasts whose data input is a Constant (optionally through one Convert, as in IRs
    saved with fp16 weights) and that only add or expand leading (batch) dims are rewired; the
    MatMul then broadcasts ``W`` itself (OpenVINO MatMul follows numpy batch broadcasting), so
    the output shape and values are unchanged. Returns the number of MatMuls rewired.
    """
    rewired = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        for port in (0, 1):
            bcast = op.input(port).get_source_output().get_node()
            if bcast.get_type_name() != "Broadcast":
                continue
            weight = bcast.input(0).get_source_output()
            node = weight.get_node()
            if node.get_type_name() == "Convert":
                node = node.input(0).get_source_output().get_node()
            if node.get_type_name() != "Constant" or not _batch_only(weight, bcast):
                continue
            op.input(port).replace_source_output(weight)
            rewired += 1
    if rewired:
        model.validate_nodes_and_infer_types()
    return rewired


def _batch_only(weight, bcast) -> bool:
    """True when broadcasting ``weight`` to ``bcast``'s output changes only leading dims of size
    1 (or adds leading dims): the last two (matrix) dims must match exactly."""
    src, dst = weight.get_partial_shape(), bcast.get_output_partial_shape(0)
    if src.rank.is_dynamic or dst.rank.is_dynamic or src.rank.get_length() < 2:
        return False
    if not src.is_static:
        return False
    s, d = list(src.to_shape()), list(dst)
    if len(d) < len(s):
        return False
    lead = len(d) - len(s)
    for i, n in enumerate(s):
        target = d[lead + i]
        if i >= len(s) - 2:
            if not (target.is_static and target.get_length() == n):
                return False
        elif n != 1 and not (target.is_static and target.get_length() == n):
            return False
    return True


def _c_library():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc


def _madvise():
    return _c_library().madvise


def release_weight_pages(dirs, maps_path: str = "/proc/self/maps") -> int:
    """Drop this process's resident pages of read-only file mappings under ``dirs`` (the IR
    directory, the compiled-blob cache); returns the bytes of address range advised.

    Only mappings without write permission are touched, so no private (copy-on-write) data can
    be lost: the dropped pages are reloaded from the file on their next access. A no-op (0)
    where ``/proc/self/maps`` or ``madvise`` is unavailable (non-Linux).
    """
    if not sys.platform.startswith("linux"):
        return 0
    prefixes = tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)
    if not prefixes:
        return 0
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        madvise = _madvise()
    except OSError:
        return 0
    advised = 0
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "w" in parts[1]:
            continue
        path = parts[5].strip()
        if not path.startswith(prefixes):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if madvise(start, end - start, _MADV_DONTNEED) == 0:
            advised += end - start
        else:
            log.debug("madvise(%s) failed: errno %d", path, ctypes.get_errno())
    return advised


def trim_heap() -> bool:
    """Return freed heap memory to the OS (glibc ``malloc_trim(0)``); False where unavailable.

    Buffers the CPU plugin frees are often below glibc's (adaptive) mmap threshold, so they go
    back to malloc's arenas and stay in RSS until trimmed.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_c_library().malloc_trim(0))
    except (OSError, AttributeError):  # not glibc (e.g. musl has no malloc_trim)
        return False


class IntermediateReleaser:
    """Frees a stage's intermediate buffers (``CompiledModel.release_memory()``) when another
    stage starts while nothing else runs.

    The CPU plugin keeps every compiled model's activation buffers, sized for the largest
    shape it has run, for the model's lifetime; a segment runs the stages one after another, so
    without this their buffers add up. A stage keeps its buffers while it runs repeatedly (LLM
    steps, the estimator's Euler steps, the vocoder chunks) and re-allocates them once per
    segment after a release. The LLM's KV cache lives in each session's request state, which
    ``release_memory`` leaves alone (tested: same logits with a release between steps).

    ``on_release`` runs after each quiet transition that released something; the backend
    passes :func:`release_weight_pages` for its weight files there: the plugin reads some
    weights straight from the mapped IR / blob at every call (embedding tables, the text
    encoder's and the fp16 vocoder's constants), and without this those pages stay resident
    next to the stage that peaks (the vocoder's decode, docs/performance.md). A stage re-faults its own pages from the page cache when it next runs.

    Releases happen only at quiet transitions (the starting call is the only one in flight), so
    under concurrent requests stages are not released under each other's feet nor re-allocated
    on every alternation. :meth:`enter` holds one lock while it releases, so a stage is never
    released while one of its calls runs or starts.
    """

    def __init__(self, enabled: bool = True, on_release: Callable[[], object] | None = None):
        self.enabled = enabled
        self._on_release = on_release
        self._compiled: dict[str, object] = {}
        self._in_flight: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self.releases = 0  # how many release_memory() calls were made (tests, logs)

    def register(self, key: str, compiled) -> None:
        self._compiled[key] = compiled
        self._in_flight.setdefault(key, 0)

    def enter(self, key: str) -> None:
        """A call of stage ``key`` starts (pair with :meth:`exit`)."""
        if not self.enabled:
            return
        released = False
        with self._lock:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            if sum(self._in_flight.values()) == 1:
                for other in [k for k in self._dirty if k != key]:
                    self._dirty.discard(other)
                    self._compiled[other].release_memory()
                    self.releases += 1
                    released = True
            self._dirty.add(key)
        if released:
            trim_heap()
            if self._on_release is not None:
                self._on_release()

    def exit(self, key: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._in_flight[key] = max(0, self._in_flight.get(key, 0) - 1)
