"""How a node's process turns SIGINT and SIGTERM into KeyboardInterrupt (``process.py``)."""

import signal
import time

import pytest

from oxygen_ros.ros.process import install_sigterm_as_keyboard_interrupt


@pytest.fixture
def our_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    install_sigterm_as_keyboard_interrupt()
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_interrupt_the_main_thread(our_handlers, signum):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signum)
        time.sleep(1.0)


class _Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while a finalizer runs (the collector's, say)
        for _ in range(10_000):  # places where the handler runs, inside the finalizer
            pass


def test_an_interrupt_that_comes_during_a_finalizer_is_not_lost(our_handlers, capfd):
    """Python swallows an exception raised in ``__del__`` (it prints "Exception ignored in" and a
    traceback), so a Ctrl-C landing there would be lost and the node go on starting. It comes
    again just after the finalizer, where it interrupts."""
    with pytest.raises(KeyboardInterrupt):
        _Dropped()  # made and dropped: its finalizer runs here
        time.sleep(1.0)  # the interrupt arrives here
    assert "Exception ignored" not in capfd.readouterr().err
