"""One piece at one bucket as an AOTInductor package: built once, kept on disk, loaded in milliseconds.

A :class:`PackagedPiece` is a :class:`~.static.StaticPieces` function at fixed
input shapes, exported (``torch.export``) and compiled ahead of time into a
shared library (``torch._inductor.aoti_compile_and_package``). Calling it
runs the library directly: no guard evaluation, no Python between kernels,
and the interpreter lock released (``aoti_library.py``).

* **The pool stays the one owner of K/V memory.** The pool's ``k`` and ``v``
  are the first two inputs of every package and are written in place.
* **The weights stay the model's.** They are not packaged
  (``package_constants_in_so=False``): after loading, the package is pointed
  at the model's own parameter tensors (``user_managed``), so a package holds
  code only and serves any checkpoint of the same sizes.
* **The cache.** A package is stored as ``<cache>/aoti/<piece>-<key>.pt2``,
  the key a digest of everything the code depends on (:func:`package_key`):
  the model's configuration, the shapes and dtypes, the device, the CPU's
  vector instruction set, torch's version and the source of this folder. A
  second start of the same model loads every package without compiling,
  and needs no compiler for it: a warm cache serves a machine without one,
  read-only too (the libraries are then extracted into a private folder,
  ``aoti_library.py``). Only a missing package asks for the compiler and a
  writable cache (:func:`check_buildable`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import tempfile
import warnings

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .aoti_library import AOTILibrary, check_constants
from .build_lock import build_lock
from .cache import KVCache
from .compile_setup import CACHE_ENV, CannotBuild, build_unavailable
from .static import StaticPieces
from .vla import VLA

#: inductor settings for every package: code only, the weights come from the model at load time
PACKAGE_OPTIONS = {"aot_inductor.package_constants_in_so": False}
_SOURCE = pathlib.Path(__file__).resolve().parent


class _Piece(torch.nn.Module):
    """``StaticPieces.<name>`` with the pool's storage as explicit inputs (so that export sees its writes)."""

    def __init__(self, model: VLA, name: str, steps: int):
        super().__init__()
        self.model, self.name, self.steps = model, name, steps

    def forward(self, k: Tensor, v: Tensor, *inputs: Tensor):
        return getattr(StaticPieces(self.model, KVCache(k, v), self.steps), self.name)(*inputs)


@functools.cache
def source_digest() -> str:
    """SHA-256 over this folder's Python source (the code every graph is traced from); read once
    per process."""
    h = hashlib.sha256()
    for path in sorted(_SOURCE.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def package_key(model: VLA, name: str, steps: int, cache: KVCache, inputs: tuple[Tensor, ...]) -> str:
    """What a package's code depends on, as a short digest."""
    device = model.device
    if device.type == "cuda":
        target = f"cuda sm{''.join(map(str, torch.cuda.get_device_capability(device)))}"
    else:
        target = f"{device.type} {cpu_target()}"
    parts = [torch.__version__, target, source_digest(), repr(model.config), str(model.dtype), name, str(steps),
             str(PACKAGE_OPTIONS), *(f"{tuple(t.shape)} {t.dtype}" for t in (cache.k, cache.v, *inputs))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@functools.cache
def cpu_target() -> str:
    """This CPU's architecture and vector instruction sets, as the key names them: read off the CPU
    (torch's own checks), not found by compiling test programs as inductor's choice of ISA is, so
    that a machine without a compiler finds the packages a machine like it built."""
    import platform

    from torch._inductor.cpu_vec_isa import x86_isa_checker

    return " ".join([platform.machine(), torch.backends.cpu.get_cpu_capability(), *x86_isa_checker()])


def _writable(folder: pathlib.Path) -> bool:
    """Whether files can be made in ``folder`` (or, where it is still to be made, in its nearest
    existing parent): a read-only mount or permissions say no."""
    folder = pathlib.Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def check_buildable(cache_dir: pathlib.Path, device: torch.device, missing: int, total: int) -> None:
    """Raise :class:`CannotBuild`, saying why, where the ``missing`` of ``total`` packages the cache
    lacks cannot be built here (no compiler, a read-only cache)."""
    cache_dir = pathlib.Path(cache_dir)
    what = f"the compile cache ({cache_dir}) lacks {missing} of the {total} packages this model needs"
    why = build_unavailable(device)
    if why is not None:
        raise CannotBuild(f"{why}: {what}, and they cannot be built here. Build them where a compiler is (the "
                          f"same torch and kind of {'GPU' if device.type == 'cuda' else 'CPU'}, the same model and "
                          "parameters) and copy the cache here")
    if not _writable(cache_dir / "aoti"):
        raise CannotBuild(f"{what}, and it is read-only: build them where it is writable, or point {CACHE_ENV} at "
                          "a writable folder")


class PackagedPiece:
    """``StaticPieces.<name>`` of ``model`` on ``cache`` at the shapes of ``inputs``, loaded from
    ``cache_dir`` (built there first if missing; :attr:`built` says which)."""

    def __init__(self, model: VLA, cache: KVCache, name: str, steps: int, inputs: tuple[Tensor, ...],
                 cache_dir: pathlib.Path):
        self.cache = cache
        module = _Piece(model, name, steps)
        self.path = package_path(cache_dir, model, name, steps, cache, inputs)
        self.built = not self.path.exists()
        if self.built:
            check_buildable(cache_dir, model.device, 1, 1)
            with build_lock(self.path.parent):
                if not self.path.exists():  # not built by another process while this one waited
                    build_package(model, cache, name, steps, inputs, self.path)
        state = dict(module.named_parameters())
        state.update(module.named_buffers())
        # through the library's C interface: the interpreter lock is released
        self.library = AOTILibrary(self.path, state, str(model.device))  # the package's compiled code

    def __call__(self, *inputs: Tensor):
        return self.library(self.cache.k, self.cache.v, *inputs)


def _loaded(path: pathlib.Path, state: dict[str, Tensor]):
    """``path`` through torch's package loader, its constants ``state``'s tensors: a callable on the
    flat inputs (the loader's own call parses its layouts on every call; they are read once here).
    What a package gives through :class:`AOTILibrary` is checked against it."""
    runner = torch._inductor.aoti_load_package(str(path))
    names = runner.get_constant_fqns()
    check_constants(path, names, state)
    runner.load_constants({n: state[n] for n in names}, check_full_update=True, user_managed=True)
    loader, outputs = runner.loader, pytree.treespec_loads(runner.loader.get_call_spec()[1])
    return lambda *inputs: pytree.tree_unflatten(loader.boxed_run(list(inputs)), outputs)


def package_path(cache_dir: pathlib.Path, model: VLA, name: str, steps: int, cache: KVCache,
                 inputs: tuple[Tensor, ...]) -> pathlib.Path:
    """Where the package of piece ``name`` at the shapes of ``inputs`` is kept."""
    return pathlib.Path(cache_dir) / "aoti" / f"{name}-{package_key(model, name, steps, cache, inputs)}.pt2"


#: the start of a deprecation warning torch raises while it compiles a package
LEAF_SPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def export_piece(model: VLA, cache: KVCache, name: str, steps: int, inputs: tuple[Tensor, ...]):
    """Piece ``name``'s graph at ``inputs``, with the pool's storage as inputs: what a package compiles."""
    with torch.no_grad():
        return torch.export.export(_Piece(model, name, steps), (cache.k, cache.v, *inputs), strict=False)


def build_package(model: VLA, cache: KVCache, name: str, steps: int, inputs: tuple[Tensor, ...],
                  path: pathlib.Path) -> None:
    """Export and compile piece ``name`` at ``inputs`` into ``path`` (written under a temporary name,
    then renamed: a second process building the same package never reads half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp.pt2")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            # torch's own deprecation, raised inside its compiler as it unpickles its graphs' tree
            # specs (a dozen lines on a cold start, nothing the user can act on)
            warnings.filterwarnings("ignore", message=LEAF_SPEC_WARNING, category=FutureWarning)
            program = export_piece(model, cache, name, steps, inputs)
            # a copy: the compiler adds its own entries to the dict it is given
            torch._inductor.aoti_compile_and_package(program, package_path=tmp,
                                                     inductor_configs=dict(PACKAGE_OPTIONS))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
