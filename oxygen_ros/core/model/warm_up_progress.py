"""What a compiled warm-up says while it loads or builds its packages: one line per bucket, and
what the commands say first about the packages being built.

A warm-up of a cold cache builds a package per bucket, a few minutes in all on a CPU, and
nothing else is printed meanwhile: the inference node logs :func:`bucket_lines`' lines, and the
commands that compile (``oxygen-calibrate``, ``oxygen-eval``) print them to stderr after
:func:`packages_built_first`.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

from .compiled import Progress


def bucket_lines(say: Callable[[str], None]) -> Progress:
    """A warm-up's ``progress``: ``say`` gets a line per bucket loaded or built,
    ``bucket 3/12: decode batch 4 (compiled) (2.1 s; 20.3 s in all)``: the seconds since the line
    before, and since this call."""
    started = last = time.perf_counter()

    def said(done: int, total: int, what: str) -> None:
        nonlocal last
        now = time.perf_counter()
        say(f"bucket {done}/{total}: {what} ({now - last:.1f} s; {now - started:.1f} s in all)")
        last = now

    return said


def packages_built_first(cache: pathlib.Path) -> str:
    """The line said before a compiled warm-up starts: what it builds, how long, and where it keeps it."""
    return (f"compiled: the packages of the pieces' shapes not in the cache ({cache}) are built first, a few "
            "minutes when it is empty, then loaded from it in seconds; a line per bucket follows")


__all__ = ["bucket_lines", "packages_built_first"]
