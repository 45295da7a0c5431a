"""Keep the OpenVINO CPU backend's resident memory to one copy of the weights. Must not import
torch.

Two measured causes of the backend's peak RSS (synthetic 300M, fp32 IRs, measured with
``benchmarks/ov_memory.py``):

* The CPU plugin repacks FullyConnected / Convolution weights into its own (anonymous) buffers,
  at compile time or lazily at the first inference, but the IR ``.bin`` (or cached blob) stays
  memory-mapped and the pages it read while repacking stay counted in RSS: about 1.7 GB of
  file-backed pages next to 1.5 GB of repacked copies. :func:`release_weight_pages` tells the
  kernel (``madvise(MADV_DONTNEED)``) those pages are not needed; a page the plugin still reads
  directly (embedding tables used by Gather) is faulted back in from the page cache on its next
  access, so this never changes results, only residency.
* The estimator's 3-D linears are exported as ``MatMul(x, Broadcast(W, [B, K, N]))`` (the torch
  model spells them ``bmm`` with an expanded weight, see ``cosyvino/models/torch/estimator.py``).
  The plugin constant-folds the Broadcast, so every weight exists ``B`` (= 2 for CFG) times
  (about 0.8 GB more after the first call). :func:`fold_weight_broadcasts` feeds the constant
  straight to the MatMul, whose numpy-style batch broadcasting gives the same product.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

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


def _madvise():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise


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
