"""``--help`` of a node's executable: what the node does and every parameter, without starting it.

``ros2 run oxygen_ros inference_node --help`` (or ``-h``, before any ``--ros-args``) prints
this and exits 0; anything after ``--ros-args`` is ROS's own and left alone. The text comes
from the node's parameter table, the one its checks and ``ros2 param describe`` read.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from .parameters import ParamSpec

HELP_FLAGS = ("-h", "--help")
WIDTH = 100


@dataclass(frozen=True)
class NodeHelp:
    """What ``--help`` says about a node: its executable, node name, what it does, its parameters
    and (a lifecycle node) those read at configure, which change while it is unconfigured."""

    executable: str
    node: str
    summary: str
    specs: Sequence[ParamSpec]
    configure_time: frozenset[str] = frozenset()  # a lifecycle node's: read at configure


#: the parameter types as ROS names them (``ros2 param describe``)
TYPE_NAMES = {"str": "string", "str_list": "string array", "int": "integer", "float": "double", "bool": "bool"}


def help_requested(args: Sequence[str] | None = None) -> bool:
    """``-h`` or ``--help`` among the process's own arguments (those before ``--ros-args``)."""
    argv = list(sys.argv[1:] if args is None else args)
    if "--ros-args" in argv:
        argv = argv[:argv.index("--ros-args")]
    return any(a in HELP_FLAGS for a in argv)


def help_text(h: NodeHelp) -> str:
    """The usage line, the summary, then each parameter: type, default, whether it changes at
    run time, description and constraints."""
    lines = [f"usage: ros2 run oxygen_ros {h.executable} [--ros-args [-p NAME:=VALUE]... "
             "[--params-file FILE] [-r FROM:=TO]...]", ""]
    lines += textwrap.wrap(f"{h.node}: {h.summary}", WIDTH)
    lines += ["", f"parameters ({len(h.specs)}; in a params file under '{h.node}: ros__parameters:'):"]
    for spec in h.specs:
        when = ("changes at run time" if spec.dynamic else "read at configure: changes while unconfigured"
                if spec.name in h.configure_time else "read at start")
        lines.append(f"  {spec.name} ({TYPE_NAMES[spec.type]}, default {_shown(spec.default)}; {when})")
        text = spec.description + (f" [{spec.constraints}]" if spec.constraints else "")
        lines += textwrap.wrap(text, WIDTH, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines) + "\n"


def _shown(value) -> str:
    """A default as it is written on a command line or in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def print_help_if_asked(h: NodeHelp | None, args: Sequence[str] | None = None) -> bool:
    """Print ``h``'s help when the arguments ask for it; True then (the node is not started)."""
    if h is None or not help_requested(args):
        return False
    sys.stdout.write(help_text(h))
    return True
