"""One builder at a time per compile cache: a lock file that every process building packages into it takes.

Two processes starting on one cold cache (two agents, an agent beside a
benchmark) would each build every package, both at once on the same cores:
twice the work, each at half the speed. The second waits for the first
(saying so), then builds only what the first did not: usually nothing.

While the lock is held nobody else builds into the cache, so a half-written
package found there (``*.tmp.pt2``, left by a build that was killed with
SIGKILL, which no clean-up survives) is removed when it is taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import time
from collections.abc import Callable, Iterator

#: the lock file, in the folder the packages are written to
LOCK_NAME = ".build.lock"
#: how a package being built is named until it is whole (``packaged.build_package``)
HALF_WRITTEN = "*.tmp.pt2"


@contextlib.contextmanager
def build_lock(folder: pathlib.Path, note: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``folder``'s build lock for the block, waiting for another process that holds it
    (``note`` says so when it has to wait, and again when it got the lock)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            if note is not None:
                note(f"waiting for process {holder}, which is building packages into {folder} ...")
            t0 = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)  # Ctrl-C interrupts the wait
            if note is not None:
                note(f"process {holder} finished building after {time.monotonic() - t0:.1f} s of waiting")
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")  # who holds it, for a process that comes to wait
            f.flush()
            for stale in folder.glob(HALF_WRITTEN):
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
