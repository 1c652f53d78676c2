"""A compiled package's shared library, called through its C interface with the interpreter lock released.

torch's own package loader (``aoti_load_package``) holds Python's interpreter
lock for the whole run of a package: while the denoise loop's 1.3 ms ran,
no other thread of the process could run Python, and the control tick waited
for it. The library inside an AOTInductor package (``*.so``) exports a plain C
interface (``torch/csrc/inductor/aoti_runtime/interface.h``); called through
:mod:`ctypes` it runs with the lock released, like an eager operator's kernel
(measured: a Python loop in another thread kept 95% of its speed while the
prefill package ran back to back, against 46% through the loader; the call
itself is as fast).

:class:`AOTILibrary` loads the library (extracted once next to its package, or
into a private folder when the package's folder is read-only),
creates one model container, points its constants at the caller's tensors
(user-managed: the weights stay the model's, nothing is copied) and runs it on
a flat list of input tensors. Tensors cross the boundary as ``at::Tensor``
handles made by torch's ``torch._C._aoti`` helpers.

On CUDA the same, with three differences: the package's kernel binaries
(``*.cubin``) are extracted beside the library and named to its container; a
run goes on the current CUDA stream (the one a CUDA graph's capture records);
and it is the single-threaded run, since the other one waits on the previous
run's event, which a capture does not allow. Before a GPU library is first
loaded, a child process tries it (``load_probe.py``). Seen on an H200, with
the C++ runtime preloaded (without it every library crashed there): a
decode package loaded this way gave eager's logits and replayed as a CUDA
graph (``cuda_graphs.py``).

Before each run the calling thread yields its core (``os.sched_yield``, which
releases the lock too). Releasing the lock wakes a thread waiting for it (the
control tick), and Linux queues the woken thread on the waker's core, behind the
package's run, even when the other core is idle (seen on a 2-core VM with
``perf sched timehist``: 2.8 ms of scheduling delay, the package's whole run). The
yield lets the woken thread run first. Measured with a thread ticking every 2 ms
beside back-to-back compiled frames (default model, 8 s, two rounds, interleaved):
ticks late by more than 2 ms fell from 288 / 327 to 74 / 54 of 4000, p99 lateness
from 4.1 / 4.5 ms to 2.4 / 2.3 ms (eager frames: 1.9 / 1.2 ms); ``oxygen-bench
--tick-probe`` shows the same (docs/compiled_frames.md, "Why, and the fix").
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import pathlib
import shutil
import tempfile
import weakref
import zipfile
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .load_probe import check_library_loads

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


_yield_core = getattr(os, "sched_yield", lambda: None)  # POSIX


class _ConstantEntry(ctypes.Structure):  # AOTInductorConstantMapEntry
    _fields_ = [("name", ctypes.c_char_p), ("handle", ctypes.c_void_p)]


def _handles(tensors: Sequence[Tensor]) -> list[int]:
    """New ``at::Tensor`` handles of ``tensors`` (owned by whoever receives them)."""
    return [_capsule_pointer(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]


def _tensors(handles: Sequence[int]) -> list[Tensor]:
    """The tensors of ``handles``, taking them over (the handles are freed)."""
    return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_new_capsule(h, None, None) for h in handles])


def check_constants(package: pathlib.Path, names: Sequence[str], constants: Mapping[str, Tensor]) -> None:
    """Refuse, naming the package, a model that lacks constants ``names`` of the package."""
    missing = [n for n in names if n not in constants]
    if missing:
        raise RuntimeError(f"{package.name} needs constants the model does not have: {missing[:5]}")


#: files of a GPU package that hold its kernels' machine code, read by the library at its first run
KERNEL_BINARIES = (".cubin", ".fatbin", ".hsaco")


def extract_library(package: pathlib.Path) -> pathlib.Path:
    """The package's shared library, extracted as ``<package stem>.so`` on first use (written under
    a temporary name, then renamed): beside the package, or, where its folder is read-only (a warm
    cache copied onto a robot, a read-only mount), in a private folder of this process
    (:func:`private_folder`). A GPU package's kernel binaries go into :func:`kernel_dir` first."""
    target = _extracted(package).with_suffix(".so")
    if target.exists():
        return target
    with zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        if len(names) != 1:
            raise RuntimeError(f"{package.name}: expected one shared library in the package, found {names}")
        kernels = [n for n in archive.namelist() if n.endswith(KERNEL_BINARIES)]
        if kernels:
            folder = kernel_dir(package)
            folder.mkdir(exist_ok=True)
            for name in kernels:
                _write_atomically(folder / pathlib.PurePosixPath(name).name, archive.read(name))
        _write_atomically(target, archive.read(names[0]))
    return target


def _extracted(package: pathlib.Path) -> pathlib.Path:
    """Where what is extracted from ``package`` goes, with the package's own name: beside it where
    its folder is writable, else in :func:`private_folder`."""
    package = pathlib.Path(package)
    return package if os.access(package.parent, os.W_OK) else private_folder() / package.name


@functools.cache
def private_folder() -> pathlib.Path:
    """A folder of this process's own under the temporary directory (mode 0700), removed when it
    exits: where libraries from a read-only cache are extracted (the library of a loaded package
    stays mapped after its file is gone)."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="oxygen_ros-libraries-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def kernel_dir(package: pathlib.Path) -> pathlib.Path:
    """Where a GPU package's kernel binaries are extracted (``<package stem>.kernels``, beside the
    library)."""
    return _extracted(package).with_suffix(".kernels")


def _kernels(package: pathlib.Path) -> pathlib.Path | None:
    """The package's extracted kernel binaries (None: a CPU package's kernels are in its library)."""
    folder = kernel_dir(package)
    return folder if folder.is_dir() else None


def probe_package(package: pathlib.Path, device: str | torch.device) -> None:
    """Raise :class:`~.load_probe.LibraryLoadError` if ``package``'s library would crash this
    process (see ``load_probe.py``); extracts it first."""
    check_library_loads(extract_library(package), device, _kernels(package))


def _write_atomically(target: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".tmp")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, target)


class AOTILibrary:
    """The model container of ``package``'s library on ``device``, its constants ``constants``
    (by their original names: a module's ``named_parameters``/``named_buffers``). Call it with
    the flat input tensors; it returns the outputs in their original structure."""

    def __init__(self, package: pathlib.Path, constants: Mapping[str, Tensor], device: str = "cpu"):
        self.path = extract_library(pathlib.Path(package))
        self.device = torch.device(device)
        kernels = _kernels(pathlib.Path(package))
        check_library_loads(self.path, self.device, kernels)  # a library that would crash this process is refused
        self._lib = lib = ctypes.CDLL(str(self.path))
        cubin_dir = None if kernels is None else str(kernels).encode()
        handle = ctypes.c_void_p()
        self._check(lib.AOTInductorModelContainerCreateWithDevice(ctypes.byref(handle), ctypes.c_size_t(1),
                                                                  str(self.device).encode(), cubin_dir),
                    "create its container")
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.AOTInductorModelContainerDelete, handle)
        self._load_constants(constants)
        self._inputs, self._outputs = self._count("Inputs"), self._count("Outputs")
        spec_in, spec_out = ctypes.c_char_p(), ctypes.c_char_p()
        self._check(lib.AOTInductorModelContainerGetCallSpec(handle, ctypes.byref(spec_in), ctypes.byref(spec_out)),
                    "read its call spec")
        self._out_spec = pytree.treespec_loads(spec_out.value.decode())
        # a ctypes.CDLL call: the interpreter lock is released. On a GPU, the single-threaded run: the
        # other one waits on the previous run's event, which a CUDA graph's capture does not allow
        self._on_cpu = self.device.type == "cpu"
        self._run = lib.AOTInductorModelContainerRun if self._on_cpu else \
            lib.AOTInductorModelContainerRunSingleThreaded

    def _stream(self) -> ctypes.c_void_p | None:
        """The stream a run's kernels go on: the current CUDA stream (the one a graph's capture
        records), None on the CPU."""
        if self._on_cpu:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)  # a pointer, not a C int

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            message = ctypes.c_char_p()
            last_error = getattr(self._lib, "AOTInductorGetLastError", None)  # absent from older libraries
            if last_error is not None:
                last_error(ctypes.byref(message))
            detail = message.value.decode(errors="replace") if message.value else f"error code {code}"
            raise RuntimeError(f"{self.path.name}: could not {what}: {detail}")

    def _count(self, what: str) -> int:
        n = ctypes.c_size_t()
        self._check(getattr(self._lib, f"AOTInductorModelContainerGetNum{what}")(self._handle, ctypes.byref(n)),
                    f"count its {what.lower()}")
        return n.value

    def _constant_name(self, getter: str, i: int) -> bytes:
        name = ctypes.c_char_p()
        self._check(getattr(self._lib, f"AOTInductorModelContainerGetConstant{getter}")(
            self._handle, ctypes.c_size_t(i), ctypes.byref(name)), "name a constant")
        return name.value

    def constant_names(self) -> list[str]:
        """The original names of the constants the library needs."""
        return [self._constant_name("OriginalFQN", i).decode() for i in range(self._count("Constants"))]

    def _load_constants(self, constants: Mapping[str, Tensor]) -> None:
        fqns = self.constant_names()
        check_constants(self.path, fqns, constants)
        internal = [self._constant_name("Name", i) for i in range(len(fqns))]
        handles = _handles([constants[n] for n in fqns])
        entries = (_ConstantEntry * len(fqns))(*(_ConstantEntry(n, h) for n, h in zip(internal, handles)))
        try:  # user-managed: the container keeps handles of its own to the same tensors
            self._check(self._lib.AOTInductorModelContainerUpdateUserManagedConstantBufferPairs(
                self._handle, entries, ctypes.c_size_t(len(fqns)), False, True), "take the model's weights")
        finally:
            _tensors(handles)  # ours are freed

    def __call__(self, *inputs: Tensor):
        if len(inputs) != self._inputs:
            raise ValueError(f"{self.path.name} takes {self._inputs} tensors, got {len(inputs)}")
        ins = (ctypes.c_void_p * self._inputs)(*_handles(inputs))  # taken over by the run
        outs = (ctypes.c_void_p * self._outputs)()
        _yield_core()  # a thread the run's lock release wakes runs first (module docstring)
        self._check(self._run(self._handle, ins, ctypes.c_size_t(self._inputs), outs, ctypes.c_size_t(self._outputs),
                              self._stream(), None), "run")
        return pytree.tree_unflatten(_tensors(list(outs)), self._out_spec)
