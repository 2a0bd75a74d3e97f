"""glibc's allocator set for a process that streams files over SSH.

An SFTP transfer makes and drops a few 256 KiB and 1 MiB buffers per MiB moved (a packet, its
answer, a chunk). glibc serves each from a fresh mmap, or from the heap's top and then gives
that top back, so every buffer's pages are faulted in anew: building one 256 KiB SFTP write
took 200 us, 6 us with these thresholds. Up to 4 MiB from the heap and 32 MiB of free top
kept, the same memory is reused. What stays held is at most the trim threshold, and a
process's peak is what it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024

_done = False


def keep_transfer_buffers() -> None:
    """Once per process; nothing where the C library is not glibc."""
    global _done
    if _done:
        return
    _done = True
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return
    taken = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    if not taken:
        log.info("the C library refused the allocator's thresholds; transfers cost more CPU")


__all__ = ["keep_transfer_buffers"]
