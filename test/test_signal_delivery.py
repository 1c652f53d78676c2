"""A signal that lands in a finalizer, where Python drops what its handler raises, still ends
the process (``signal_delivery.py``): here a package-building worker's SIGTERM, as in a CI run
where one landed in torch's weak-dictionary callback and the pool waited 10 minutes for the
worker to end."""

import os
import signal
import subprocess
import sys
import textwrap

_WORKER = textwrap.dedent("""
    import time, weakref
    from oxygen_ros.core.model.package_builds import leave_on_sigterm

    leave_on_sigterm()  # as the pool's worker process sets itself up

    class Held:
        pass

    def callback(ref):  # a weakref's callback, as torch's WeakIdKeyDictionary has
        print("in the callback", flush=True)
        end = time.monotonic() + 20
        while time.monotonic() < end:  # the SIGTERM's handler runs here, inside the callback
            pass

    held = Held()
    ref = weakref.ref(held, callback)
    try:
        del held  # the callback runs now
        time.sleep(120)  # the build going on
        print("built on to the end", flush=True)
    finally:
        print("cleaned up", flush=True)  # the build's clean-up (its half-written file removed)
""")


def test_a_building_worker_whose_sigterm_lands_in_a_weakref_callback_still_leaves_through_its_clean_up():
    child = subprocess.Popen([sys.executable, "-c", _WORKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout.readline() == "in the callback\n"
        child.send_signal(signal.SIGTERM)  # the pool's terminate()
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 1, err
    assert out.splitlines() == ["cleaned up"], out
    assert "Exception ignored" not in err  # the dropped exception is handled, not reported
