"""The folder of a ``ros2 launch`` run's per-node overrides files, and those earlier runs left behind.

``launch/agent.launch.py`` writes each node's overrides into a temporary
folder (see ``plan.overrides_file``) and removes it when the launch shuts
down. A launch ended by SIGTERM (systemd stopping a service, ``kill``) or
SIGKILL runs no shutdown handlers, so its folder stays. Each folder is named
by its launch's process id, ``oxygen_launch_<pid>_<random>``, and the next
launch removes those of this user whose process no longer runs. A folder
whose process id was reused since is kept until that process ends too.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "oxygen_launch_"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)_")


def new_overrides_folder(parent: str | None = None) -> tuple[str, list[str]]:
    """A new folder for this process's overrides files in ``parent`` (default: the system's
    temporary folder), after removing the folders of launches that no longer run. Returns
    the new folder and the removed ones."""
    parent = parent or tempfile.gettempdir()
    removed = remove_left_behind(parent)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_", dir=parent), removed


def remove_left_behind(parent: str) -> list[str]:
    """Remove this user's overrides folders in ``parent`` whose launch process no longer runs;
    returns their paths. Folders of other names, of other users or of running processes stay."""
    removed = []
    for path in sorted(Path(parent).glob(PREFIX + "*")):
        match = _NAME.match(path.name)
        try:
            mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:  # gone meanwhile, or not ours to look at
            continue
        if match and mine and not _runs(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(str(path))
    return removed


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # not a process id at all
        return False
    return True
