"""The camera sides ``oxygen-agent --robot-processes`` runs as child processes, seen from a test.

* :func:`start_agent` - ``oxygen-agent robots:=a,b demo:=true`` (by default) as a subprocess.
* :func:`robot_processes` / :func:`wait_for_robot_processes` - its robot processes, by pid;
  :func:`robot_of` - whose one is.
* :func:`still_running` - which of some pids have not ended.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ros_harness import checkout_env, installed_script, process_ended

CHILD = "oxygen_ros.ros.robot_process"


def robot_processes(parent: int | None = None) -> dict[int, str]:
    """{pid: command line} of the running robot processes of this checkout's interpreter
    (of the agent ``parent`` only, when given)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if f" -m {CHILD} " in cmd and cmd.startswith(sys.executable + " ") and parent in (None, ppid):
            found[int(entry.name)] = cmd
    return found


def robot_of(cmd: str) -> str:
    return Path(cmd.split()[-1]).name.split("_")[2]  # oxygen_robot_<robot>_XXXX.json


def start_agent(tmp_path, *args, duration="8", robots="robots:=a,b"):
    return subprocess.Popen([installed_script("oxygen-agent"), robots, "demo:=true",
                             "--text", "none", "--duration", duration, *args], cwd=tmp_path, env=checkout_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_robot_processes(proc, count=2, timeout=90.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        children = robot_processes(proc.pid)
        if len(children) >= count:
            return children
        time.sleep(0.2)
    return robot_processes(proc.pid)


def still_running(pids, timeout=15.0) -> list[int]:
    """The pids of ``pids`` still running after at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(not process_ended(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if not process_ended(pid)]


def read_until_running(proc) -> str:
    """Read ``proc``'s stdout (an oxygen-agent's) up to its first status line, which comes once
    its nodes spin; returns what was read (AssertionError with it when the agent ended first)."""
    lines: list[str] = []
    while not any("ticks " in line for line in lines[-1:]):
        line = proc.stdout.readline()
        assert line, "the agent ended before it ran: " + "".join(lines[-30:])
        lines.append(line)
    return "".join(lines)
