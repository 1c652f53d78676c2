"""Whether the model's pieces can be compiled here, and where the compiler's cache lives.

``compile`` is a static setting: ``"on"`` compiles, ``"off"`` runs eager,
``"auto"`` (the default) compiles where the benchmark showed it pays off
(:data:`AUTO_DEVICES`). Where compilation is impossible, :func:`resolve_compile`
says why, so the caller logs it once and runs eager: a machine without a C++
compiler never fails to start because of this setting. Loading a package the
cache already holds needs no compiler: the compiler is looked for only when a
package is missing (:func:`build_unavailable`), so a machine without one runs
compiled from a warm cache, and eager, saying why, from a cold one.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
from dataclasses import dataclass

import torch
from torch._higher_order_ops.while_loop import while_loop

COMPILE_CHOICES = ("auto", "on", "off")
#: device types on which ``auto`` compiles. Not CPU: there a cold start compiles for minutes
#: (the tiny model's buckets took 338 s on a loaded 2-core machine), so it is opt-in (README)
AUTO_DEVICES = ("cuda",)
#: environment variable that overrides the compiler's on-disk cache directory
CACHE_ENV = "OXYGEN_COMPILE_CACHE"


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    reason: str  # why compilation is off (empty when enabled)


class CannotBuild(RuntimeError):
    """Packages the cache lacks cannot be built here (no compiler, a read-only cache): the message
    says which and why, whole."""


#: how much of a compile error :func:`failure_reason` keeps (torch's run to hundreds of lines: whole graphs)
REASON_LINES, REASON_CHARS = 3, 400


#: free bytes under which a failed compile is put down to a full disk
FULL_DISK_BYTES = 64 << 20


def failure_reason(exc: BaseException, cache_dir: pathlib.Path | None = None) -> str:
    """Why compiling failed, in one log line: the error's type and the first lines of its message;
    first, when the disk of ``cache_dir`` is (nearly) full or the error says so, that (a compiler
    that ran out of space failed with a long command line, and "No space left" far below it)."""
    if isinstance(exc, CannotBuild):
        return str(exc)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:REASON_LINES])
    if len(text) > REASON_CHARS:
        text = text[: REASON_CHARS - 3] + "..."
    more = " (more in the error's full text)" if len(lines) > REASON_LINES else ""
    return f"compilation failed: {_full_disk(exc, cache_dir)}{type(exc).__name__}: {text}{more}"


def _full_disk(exc: BaseException, cache_dir: pathlib.Path | None) -> str:
    """The words for a full disk, when it is one (else nothing)."""
    try:
        free = shutil.disk_usage(cache_dir).free if cache_dir is not None else None
    except OSError:
        free = None
    if "No space left on device" not in str(exc) and (free is None or free >= FULL_DISK_BYTES):
        return ""
    where = f" of the compile cache ({cache_dir}, {free / 2**20:.0f} MB free)" if free is not None else ""
    return (f"the disk{where} is full: free some space, or point {CACHE_ENV} at another disk. ")


def compile_unavailable(device: str | torch.device) -> str | None:
    """Why compiled packages cannot run on ``device`` on this machine (None: they can)."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return None if torch.cuda.is_available() else "CUDA is not available"
    return f"compilation is not supported on {device.type} devices"


def build_unavailable(device: str | torch.device) -> str | None:
    """Why packages for ``device`` cannot be built on this machine (None: they can): its code
    generator's compiler is missing."""
    if torch.device(device).type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton (torch's GPU code generator) is not installed"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:  # the compiler looks for g++/clang++ and raises when none is found
        return f"no working C++ compiler for torch's CPU code generator ({e})"
    return None


def resolve_compile(choice: str, device: str | torch.device) -> CompileDecision:
    """What ``compile=choice`` means on ``device``."""
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {choice!r}")
    if choice == "off":
        return CompileDecision(False, "compile is off")
    device = torch.device(device)
    if choice == "auto" and device.type not in AUTO_DEVICES:
        return CompileDecision(False, f"compile=auto runs eager on {device.type}")
    reason = compile_unavailable(device)
    return CompileDecision(False, reason) if reason else CompileDecision(True, "")


#: the first torch release seen to export a ``while_loop`` that writes a tensor in place (2.13 and 2.14
#: were checked; 2.11 does not; 2.15 has no wheel for this Python)
LOOP_WRITES_FROM = (2, 13)


@functools.cache
def loops_can_write_in_place() -> bool:
    """Whether this torch exports a ``while_loop`` whose body writes a tensor it does not own, as
    the CPU's decode loop writes the pool (``static.StaticPieces.decode_loop``). Known for torch
    >= 2.13; an older one is tried once per process on a four-number tensor (about 2 s): torch
    2.11 refuses it ("input mutation"), and its decode then runs one step's package per call."""
    return torch.__version__ >= LOOP_WRITES_FROM or small_loop_exports()  # a TorchVersion: compares to a tuple


class _WritingLoop(torch.nn.Module):
    """``steps`` [1] turns of a ``while_loop`` that writes each turn's count into ``store``, in place."""

    def forward(self, store: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        def turn(t: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            store[t.view(1)] = total.view(1)
            return t + 1, total + 1

        start = torch.zeros((), dtype=torch.long)
        return while_loop(lambda t, total: t < steps[0], turn, (start, torch.zeros(())))[1]


def small_loop_exports() -> bool:
    """Whether torch exports :class:`_WritingLoop` (three turns over four numbers)."""
    try:
        with torch.no_grad():
            torch.export.export(_WritingLoop(), (torch.zeros(4), torch.tensor([3])), strict=False)
    except Exception:  # torch's refusal has no public type of its own
        return False
    return True


def compile_cache_dir() -> pathlib.Path:
    """``$OXYGEN_COMPILE_CACHE``, else ``$XDG_CACHE_HOME/oxygen_ros/compile``, else ``~/.cache/oxygen_ros/compile``."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "oxygen_ros" / "compile"


#: the ``TORCHINDUCTOR_CACHE_DIR`` :func:`use_compile_cache` set last (not the user's choice)
_set_here: str | None = None


def use_compile_cache() -> pathlib.Path:
    """Point torch's compiler cache at :func:`compile_cache_dir` (unless ``TORCHINDUCTOR_CACHE_DIR``
    was set to a directory of the user's choice) and return the directory in use. Called again
    after ``OXYGEN_COMPILE_CACHE`` changed, it follows it (the variable it set itself is not a choice)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    global _set_here
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or chosen == _set_here or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        path = compile_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _set_here = str(path)
    return pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
