"""Ctrl-C during a command's start-up, even where a library swallows it.

Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread is. Some code
clears it: torch's C start-up imports numpy and, when that import fails, clears the error
and goes on (a Ctrl-C landing there, about 0.2 s into ``import torch``, was lost and the
node ran on; or numpy was left half-imported and the next line failed with an
AttributeError traceback). So every interrupt is also counted here, and a stretch of
start-up run under :func:`honour_interrupts` ends with a KeyboardInterrupt when one came
during it, whatever became of the exception.

Standard library only: the executables' launchers import this before anything else.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from .signal_delivery import raise_not_lost

_count = 0


def record_interrupt() -> None:
    """Count an interrupt: called by every SIGINT (and SIGTERM) handler that raises one."""
    global _count
    _count += 1


def interrupts() -> int:
    """How many interrupts have come so far."""
    return _count


def _interrupt(signum, frame) -> None:
    record_interrupt()
    raise_not_lost(signum, KeyboardInterrupt())


def catch_interrupts() -> None:
    """SIGINT raises KeyboardInterrupt, as Python's default handler does, and is counted. Left
    alone when SIGINT is not at Python's default (ignored, as in a background job: the command
    keeps that)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


@contextmanager
def honour_interrupts() -> Iterator[None]:
    """Run a stretch of start-up; if an interrupt came during it, leave with KeyboardInterrupt:
    also when the stretch ended normally (the interrupt was swallowed) or with another error
    (a module the interrupt left half-imported failed next)."""
    before = _count
    try:
        yield
    except BaseException:
        if _count != before:
            raise KeyboardInterrupt from None
        raise
    if _count != before:
        raise KeyboardInterrupt
