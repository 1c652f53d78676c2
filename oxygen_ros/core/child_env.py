"""The environment of a child Python process that imports this oxygen_ros (the checkout or the install)."""

from __future__ import annotations

import os
import pathlib

#: the folder holding the ``oxygen_ros`` package this process imported
PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra`` set and :data:`PACKAGE_ROOT` first on
    ``PYTHONPATH``, so that the child imports the same oxygen_ros as this process."""
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env
