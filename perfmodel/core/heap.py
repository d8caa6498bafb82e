"""The C heap that a batch of configurations is evaluated on (glibc's malloc on Linux).

A search batch's arrays are about a megabyte each (1.2e5 float64 configurations), and one
evaluation of the cost model creates and frees several hundred of them. glibc's malloc serves a
block that large from the heap only below a threshold that it adapts as mapped blocks are freed,
and it hands the free top of the heap back to the kernel once it is larger than twice that
threshold. Whether a batch's arrays then come back from the kernel page by page (about 16,000
page faults per evaluation of such a batch, a fifth to a quarter of its CPU time) or reuse the
pages of the previous batch depends on the order of every earlier allocation of the process.
:func:`keep_freed_heap` fixes both thresholds, so that freed blocks are reused.

References
----------
glibc ``malloc/malloc.c`` (``mallopt``, ``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD``; the dynamic
threshold since glibc 2.3.2, ``DEFAULT_MMAP_THRESHOLD_MAX`` 32 MiB on 64-bit systems).
"""

from __future__ import annotations

import ctypes
import sys

#: ``mallopt`` parameters (glibc ``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Free memory at the top of the heap kept for the next batch [bytes].
TRIM_THRESHOLD_BYTES = 128 * 2**20
#: Blocks smaller than this come from the heap rather than a mapping of their own [bytes]
#: (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit systems).
MMAP_THRESHOLD_BYTES = 32 * 2**20


def keep_freed_heap(trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES,
                    mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's trim and mmap thresholds for the process (which also stops their
    adaptation): blocks below ``mmap_threshold_bytes`` come from the heap, and up to
    ``trim_threshold_bytes`` of free memory stays at its top. True where both were set; False
    off Linux or where the C library has no ``mallopt`` or refuses a value (nothing changes
    there). No number the model computes depends on it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes))
