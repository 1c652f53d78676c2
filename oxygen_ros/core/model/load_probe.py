"""Whether a compiled package's library can be loaded in a process like this one, tried in a child first.

Seen on an H200 machine (torch 2.11 built for CUDA 13, g++ 13): creating the
model container of any AOTInductor CUDA library segfaulted, inside the
library's own C++ code (``std::regex``, parsing the device name), with our
loader and with torch's own (``aoti_load_package``), for packages with or
without their weights. The library does not link the C++ runtime itself (it
takes it from the process), so what it binds to depends on what the process
loaded before it. With the system's ``libstdc++`` preloaded (``LD_PRELOAD``)
the same packages loaded, gave eager's results and replayed as CUDA graphs.

A segfault ends the node, and ``compile`` must never stop a node from
starting. So before the first library of a probed device type is loaded in
this process, :func:`check_library_loads` has a child Python, with this
process's native libraries (:func:`loaded_packages`) and the model's
imports, create its container. If the child dies of a signal, it is
tried once more with the C++ runtime preloaded, and :class:`LibraryLoadError`
says what happened and whether preloading helps: the caller runs eager with
that reason. A child that fails without crashing (an error code, a missing
library) proves nothing about a crash; the load then goes ahead in this
process and reports its own error. One child per device type per process:
the clash depends on the process's libraries, not on the package.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import torch

from ..child_env import child_env

#: device types whose libraries are tried in a child before this process loads one (the CPU's
#: libraries have loaded in-process on every machine tried, and a child costs a second or two)
PROBED_DEVICES = ("cuda",)
#: seconds a child may take (importing torch and the model, starting the device)
PROBE_TIMEOUT_S = 180

# argv: library, device, kernel directory ("" for none), then the packages to import first (this
# process's, in its order). Exit 0: created; 3: the library's error code.
_CHILD = """
import ctypes, importlib, sys
for name in sys.argv[4:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
import oxygen_ros.core.model.vla  # the libraries the model loads (torch, transformers)
lib = ctypes.CDLL(sys.argv[1])
handle = ctypes.c_void_p()
code = lib.AOTInductorModelContainerCreateWithDevice(ctypes.byref(handle), ctypes.c_size_t(1),
                                                     sys.argv[2].encode(), sys.argv[3].encode() or None)
if code == 0:
    lib.AOTInductorModelContainerDelete(handle)
sys.exit(3 if code else 0)
"""

_verdicts: dict[str, str | None] = {}  # device type -> why its libraries cannot load here (None: they can)


class LibraryLoadError(RuntimeError):
    """A compiled library would crash this process if loaded here."""


def probes(device: str | torch.device) -> bool:
    """Whether libraries for ``device`` are tried in a child before this process loads one."""
    return torch.device(device).type in PROBED_DEVICES


def check_library_loads(library: pathlib.Path, device: str | torch.device, kernels: pathlib.Path | None) -> None:
    """Raise :class:`LibraryLoadError` if creating ``library``'s model container on ``device``
    crashed a child process (for a device type in :data:`PROBED_DEVICES`; once per process)."""
    if not probes(device):
        return
    kind = torch.device(device).type
    if kind not in _verdicts:
        _verdicts[kind] = _probe(pathlib.Path(library), str(device), kernels)
    if _verdicts[kind]:
        raise LibraryLoadError(_verdicts[kind])


def _probe(library: pathlib.Path, device: str, kernels: pathlib.Path | None) -> str | None:
    crash = _crash_in_child(library, device, kernels, {})
    if crash is None:
        return None
    said = (f"{library.name}: creating its model container on {device} killed a test process ({crash}), so "
            f"loading it here would kill this one: the library and the libraries this process loads clash "
            f"(seen with CUDA builds of torch 2.11, in the C++ runtime)")
    runtime = cxx_runtime()
    if runtime is None:
        return said
    if _crash_in_child(library, device, kernels, {"LD_PRELOAD": _preloaded(runtime)}) is None:
        return f"{said}. It loads with the C++ runtime preloaded: start with LD_PRELOAD={runtime}"
    return f"{said}, and also with the C++ runtime preloaded (LD_PRELOAD={runtime})"


def _crash_in_child(library: pathlib.Path, device: str, kernels: pathlib.Path | None,
                    extra_env: dict[str, str]) -> str | None:
    """The signal that ended the child creating the container (None: it did not crash)."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(library), device, str(kernels or ""),
                               *loaded_packages()], env=child_env(extra_env),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None  # slow, not dead: nothing learned
    if done.returncode >= 0:
        return None
    try:
        return signal.Signals(-done.returncode).name
    except ValueError:
        return f"signal {-done.returncode}"


def loaded_packages() -> list[str]:
    """The top-level packages of the extension modules this process has loaded, in the order they
    were imported (rclpy's, in a node): the child imports them before it loads the library, so that
    it holds the same native libraries, loaded in about the same order."""
    out: dict[str, None] = {}
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").endswith(".so"):
            out.setdefault(name.partition(".")[0], None)
    out.pop("__main__", None)
    return list(out)


def _preloaded(runtime: str) -> str:
    return " ".join(p for p in (runtime, os.environ.get("LD_PRELOAD", "")) if p)


def cxx_runtime() -> str | None:
    """The path of the C++ runtime (``libstdc++``) this process has loaded, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libstdc++.so" in path:
                    return path
    except OSError:
        pass
    return None
