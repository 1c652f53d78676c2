"""Memory a frame frees kept in the process for the next frame: no page faults in the steady state.

glibc gives freed memory back to the operating system: the top of its heap
is trimmed once it exceeds twice the largest block freed so far, and blocks
over the mmap threshold are unmapped. A π0.5 prefill holds several 26 MB
activations at once (790 tokens x 16384, bfloat16), so every prefill trimmed
and refilled its heap: the next one faulted its pages in again, one 4 KiB
page at a time, each zeroed by the kernel. Measured on the main thread of a
2-core machine (random π0.5 weights, bfloat16, 3 cameras, 2 threads, the
median of 8 eager prefills of one observation, timed by a script of its own):
0.24-0.46 million page faults per prefill (0.9-1.8 GB of fresh pages) and
3.98 s; with :func:`keep_freed_memory`, no faults and 3.45 s. The resident
size grew by 265 MB (7385 to 7650 MB) and then stayed there.

What it sets (``mallopt``, process-wide, once): no trimming
(``M_TRIM_THRESHOLD = -1``, as ROS 2's real-time guides do) and a fixed mmap
threshold of 32 MB, glibc's largest: blocks up to it come from the heap and
are reused, larger ones are still mapped and unmapped each time. Unmapping
is kept on purpose: with ``M_MMAP_MAX = 0`` as well, building the π0.5 model
left its temporary float32 weights in the heap and the process doubled in
size (14.2 GB instead of 7.4 GB). Other C libraries than glibc have no such
settings: the function says so and changes nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

#: mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: blocks up to this size come from the heap (glibc refuses more than 32 MB on a 64-bit machine)
MMAP_THRESHOLD = 32 << 20

_lock = threading.Lock()
_result: str | None = None


def freed_memory_note(keep: bool) -> str:
    """:func:`keep_freed_memory` when ``keep``, else the line that says it is off."""
    return keep_freed_memory() if keep else "keep_freed_memory is off: the C library's own rules for freed memory"


def keep_freed_memory() -> str:
    """Keep freed memory in the heap for reuse (glibc: ``mallopt``; once per process). Returns a
    line for the log: what was done, or why nothing could be."""
    global _result
    with _lock:
        if _result is None:
            _result = _apply()
        return _result


def _apply() -> str:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return f"freed memory is returned to the OS as usual: the C library ({name}) has no mallopt"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, -1)):
        return f"freed memory is returned to the OS as usual: the C library ({name}) refused mallopt"
    return ("freed memory is kept for reuse (mallopt: no trim, blocks up to 32 MB from the heap): "
            "no page faults from frame to frame")
