"""An exception raised by a signal handler that is not lost where Python drops exceptions.

A Python signal handler runs in the main thread, between two bytecodes, wherever that
thread is. When that is inside a finalizer, a ``__del__`` or a weakref's callback (the
garbage collector's, torch's weak dictionaries'), Python drops what the handler raises:
it prints "Exception ignored in ..." and the code goes on as if no signal had come. Seen
twice: a Ctrl-C landing in a ``Popen.__del__`` while a node started (the node went on), and
a package-building worker's SIGTERM landing in torch's ``WeakIdKeyDictionary`` callback (the
worker built on while the pool waited for it to end; a CI run hung for 10 minutes).

So a handler calls :func:`redelivered_after_finalizer` first (inside a ``__del__`` it does not
raise: the signal is sent again a moment later, after the finalizer) and raises through
:func:`raise_not_lost`, which sends the signal again if Python drops the exception (a
finalizer not told by its name, such as a weakref callback): ``sys.unraisablehook`` is
where Python reports what it dropped.

Standard library only: the executables' launchers import it before anything else.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import NoReturn

#: how long after a finalizer a signal that came during it is delivered again (seconds)
REDELIVERY_S = 0.01

# signal -> the identity and type of the exception its handler raised last (not the exception: its
# traceback would keep the frames it passed through, and what they hold, alive for good)
_raised: dict[int, tuple[int, type]] = {}


def redelivered_after_finalizer(signum: int, frame) -> bool:
    """True when the handler runs inside a ``__del__`` (``frame`` is the handler's): the signal is
    then sent again a moment later, to land outside it, and the handler should return."""
    f = frame
    while f is not None:
        if f.f_code.co_name == "__del__":
            _send_again(signum)
            return True
        f = f.f_back
    return False


def raise_not_lost(signum: int, exc: BaseException, again: int | None = None) -> NoReturn:
    """Raise ``exc`` from the handler of ``signum``; if Python drops it (it was raised inside a
    finalizer), the signal is sent again a moment later, quietly, and its handler runs again.
    ``again``: the signal to send then instead, for a handler that has just turned its own off."""
    if getattr(sys.unraisablehook, "_oxygen_previous", None) is None:
        sys.unraisablehook = _hook_over(sys.unraisablehook)
    _raised[signum if again is None else again] = (id(exc), type(exc))
    raise exc


def _hook_over(previous):
    def hook(unraisable) -> None:
        dropped = unraisable.exc_value
        for signum, raised in list(_raised.items()):
            if dropped is not None and raised == (id(dropped), type(dropped)):
                del _raised[signum]
                _send_again(signum)
                return
        previous(unraisable)

    hook._oxygen_previous = previous
    return hook


def _send_again(signum: int) -> None:
    # to the main thread itself: sent to the process (or raised in the timer's thread) it would
    # not wake a main thread blocked in a call (a sleep, a wait for a compiler), and its handler
    # would run only once that call returned
    timer = threading.Timer(REDELIVERY_S, signal.pthread_kill, (threading.main_thread().ident, signum))
    timer.daemon = True
    timer.start()
