"""Argument types the commands share: numbers in range, and output paths checked up front.

Each is an ``argparse`` ``type``: a bad value ends the command at once with argparse's one
line naming the option (``argument --out: ...``), before a model loads or a run starts, so
that nothing produced is lost to a path found unusable at the end. What the checks cannot
see (a full disk, a path the system refuses only when written) :func:`write_output` catches
when it writes: the text then goes to stdout.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path


def plain(doc: str) -> str:
    """A module docstring's text as a command's ``--help`` shows it: without the reST markup
    (````oxygen-record````: ``oxygen-record``)."""
    return doc.replace("``", "")


def _number(text: str, kind: type, lowest: float, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if (kind is float and not math.isfinite(value)) or value < lowest:  # nan, inf (an int of any size is fine)
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    return _number(text, float, 0.0, "a number >= 0")


def positive_float(text: str) -> float:
    value = _number(text, float, 0.0, "a number > 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


class DefaultsHelp(argparse.HelpFormatter):
    """Each option's help ends with its default, as the user would type it (``baseline,oxygen``,
    not a Python list), unless the help already says its default or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text, default = action.help or "", action.default
        if ("default" in text.lower() or default is None or default is False or default == []
                or default == argparse.SUPPRESS or not action.option_strings or action.nargs == 0):
            return text
        shown = ",".join(str(v) for v in default) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _creatable(path: Path) -> str | None:
    """Why ``path`` (absent) could not be made: its nearest existing folder is a file or not
    writable; None when it can."""
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def output_file(text: str) -> Path:
    """A file the command will write (its folders made when it writes): not a folder, and in a
    place this user can write."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder; give a file name")
    why = (None if os.access(path, os.W_OK) else f"{path} is not writable") if path.exists() else _creatable(path)
    if why:
        raise argparse.ArgumentTypeError(why)
    return path


def output_dir(text: str) -> Path:
    """A folder the command will write into (made when it writes): a folder or nothing yet,
    in a place this user can write."""
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{path} is not writable")
        return path
    why = _creatable(path)
    if why:
        raise argparse.ArgumentTypeError(why)
    return path


def write_output(path: Path, text: str, tool: str) -> bool:
    """Write ``text`` to ``path`` (its folders made). When that fails, ``tool`` says why on stderr,
    naming the path, and prints ``text`` on stdout instead: what a run measured is not lost to
    its output file. False then (the command's exit status is 1)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return True
    except OSError as exc:
        print(f"{tool}: could not write {path}: {exc.strerror or exc}; what it would hold follows on stdout",
              file=sys.stderr, flush=True)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return False


__all__ = ["DefaultsHelp", "non_negative_int", "output_dir", "output_file", "positive_float", "positive_int",
           "write_output"]
