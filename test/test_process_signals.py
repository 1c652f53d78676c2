"""How a node's process turns SIGINT and SIGTERM into KeyboardInterrupt (``process.py``)."""

import signal
import time

import pytest

from oxygen_ros.ros.process import install_sigterm_as_keyboard_interrupt


@pytest.fixture
def saved_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture
def our_handlers(saved_handlers):
    install_sigterm_as_keyboard_interrupt()


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
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _Dropped()  # made and dropped: its finalizer runs here
        time.sleep(30.0)  # the interrupt arrives here, and ends the wait
    assert time.monotonic() - start < 30.0, "the interrupt came only once the sleep had ended"
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_node_that_closes_on_sigint_ignores_the_next_ones_but_not_sigterm(saved_handlers):
    """The inference node's process (``sigint_once``): the SIGINT that interrupts it turns
    SIGINT off in the handler itself, so the one ``ros2 launch`` forwards just after the
    terminal's cannot interrupt the clean-up, even before the clean-up has begun. Seen in
    CI: a second SIGINT landing between the first KeyboardInterrupt and the clean-up's own
    call that ignores SIGINT cut the clean-up short. SIGTERM still ends it."""
    install_sigterm_as_keyboard_interrupt(sigint_once=True)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        time.sleep(1.0)
    signal.raise_signal(signal.SIGINT)  # the second one: nothing happens
    time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
        time.sleep(1.0)


def test_the_agent_stops_its_clean_up_on_a_second_ctrl_c(our_handlers):
    """Without ``sigint_once`` (``oxygen-agent`` in a terminal), every Ctrl-C interrupts:
    the second one stops the agent's clean-up at once, as it says."""
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            time.sleep(1.0)


def test_a_sigint_once_that_comes_during_a_finalizer_still_interrupts_after_it(saved_handlers):
    install_sigterm_as_keyboard_interrupt(sigint_once=True)
    with pytest.raises(KeyboardInterrupt):
        _Dropped()
        time.sleep(1.0)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _swallowing_start():
    """A start-up in which a library clears a Ctrl-C (torch's C start-up, importing numpy)."""
    try:
        signal.raise_signal(signal.SIGINT)
        time.sleep(1.0)
    except KeyboardInterrupt:
        pass


def test_a_ctrl_c_a_library_swallows_while_a_node_starts_still_ends_the_start(our_handlers):
    """The nodes' start-up (and the agent's) runs under honour_interrupts: the node does not go
    on to spin as if nothing had been asked."""
    from oxygen_ros.core.interrupts import honour_interrupts

    ran_on = []
    with pytest.raises(KeyboardInterrupt):
        with honour_interrupts():
            _swallowing_start()
            ran_on.append("the rest of the start-up")
    assert ran_on == ["the rest of the start-up"]  # the start-up ended; then the interrupt was honoured


def test_an_error_after_a_swallowed_ctrl_c_is_taken_as_the_interrupt(our_handlers):
    """What the interrupt left half-done fails next (numpy half-imported: an AttributeError):
    that is the Ctrl-C's doing, ended quietly, not a crash with a traceback."""
    from oxygen_ros.core.interrupts import honour_interrupts

    with pytest.raises(KeyboardInterrupt):
        with honour_interrupts():
            _swallowing_start()
            raise AttributeError("module 'numpy' has no attribute 'ndarray'")


def test_without_a_ctrl_c_a_start_up_s_errors_are_its_own(our_handlers):
    from oxygen_ros.core.interrupts import honour_interrupts

    with pytest.raises(AttributeError):
        with honour_interrupts():
            raise AttributeError("a real fault")
    with honour_interrupts():
        pass  # and an earlier interrupt (the tests above) does not end a later start-up


def test_a_node_built_while_an_interrupt_came_is_destroyed_to_its_end(stepped_ros):
    """rclpy's create_publisher lists the publisher, wakes the executor, then adds its event
    handlers: a Ctrl-C in between (the node starting) made rclpy's destroy_node raise ValueError
    half-way, and the inference node's clean-up ended with that traceback and exit status 1 (a
    clean-clone run, test_ctrl_c_under_ros2_launch_...[starting-inference_node]). The interrupt
    is raised at that spot here, through the node's own executor wake-up."""
    import rclpy
    from std_msgs.msg import String

    from oxygen_ros.ros.process import destroy_after_interrupt

    p = stepped_ros.prefix

    def interrupted_node(name):
        node = rclpy.create_node(name, context=stepped_ros.context)
        wake = node._wake_executor

        def interrupt():
            node._wake_executor = wake
            raise KeyboardInterrupt

        node._wake_executor = interrupt
        with pytest.raises(KeyboardInterrupt):
            node.create_publisher(String, f"{p}/{name}/interrupted", 10)
        node.create_subscription(String, f"{p}/{name}/after", print, 10)
        return node

    plain = interrupted_node("plain")  # (held: its leftovers live as long as it does)
    with pytest.raises(ValueError):  # rclpy's own destroy stops at the interrupted publisher
        plain.destroy_node()
    destroy_after_interrupt(interrupted_node("ours").destroy_node)
    observer = stepped_ros.node("oxygen_test_observer")
    assert stepped_ros.spin_until(lambda: observer.count_subscribers(f"{p}/plain/after") == 1)
    assert stepped_ros.spin_until(lambda: observer.count_subscribers(f"{p}/ours/after") == 0), \
        "the subscription made after the interrupt was left behind"


def _interrupted_in_a_weakref_callback(signum, capfd):
    """Drop an object whose weakref's callback gets ``signum``; asserts that the interrupt ends
    the 30 s wait that follows."""
    import weakref

    class Held:
        pass

    def callback(ref):
        signal.raise_signal(signum)
        for _ in range(10_000):  # places where the handler runs, inside the callback
            pass

    held = Held()
    ref = weakref.ref(held, callback)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        del held  # its callback runs here
        time.sleep(30.0)  # the interrupt arrives here, and ends the wait
    assert time.monotonic() - start < 30.0, "the interrupt came only once the sleep had ended"
    assert ref() is None
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_that_comes_during_a_weakref_callback_is_not_lost(our_handlers, capfd, signum):
    """A weakref's callback is a finalizer not told by its name (torch's weak dictionaries have
    them): Python drops the KeyboardInterrupt raised there, and the signal is sent again."""
    _interrupted_in_a_weakref_callback(signum, capfd)


def test_a_sigint_once_dropped_in_a_weakref_callback_still_interrupts(saved_handlers, capfd):
    """The inference node's SIGINT turns SIGINT off as it raises: the interrupt Python dropped
    comes again as SIGTERM, which interrupts the same way."""
    install_sigterm_as_keyboard_interrupt(sigint_once=True)
    _interrupted_in_a_weakref_callback(signal.SIGINT, capfd)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
