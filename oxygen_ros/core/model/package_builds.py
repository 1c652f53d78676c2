"""A cold start's packages built several at a time, each in a worker process of its own.

Building one package (export, then AOTInductor's lowering and C++ compile,
``packaged.build_package``) keeps one core busy for tens of seconds, and a
warm-up with an empty cache builds one per bucket. A package holds code
only: its weights are the model's own, pointed at after loading. So a worker
builds it on a model of the same sizes and dtype with random weights, and a
cache of the same shape; the warm-up then loads it from the cache as if it
had built it itself.

Workers: one per core this process may use, at most one per package. On
CUDA, or for a model whose weights are too large to hold once more per
worker (:data:`WORKER_WEIGHT_LIMIT`), the packages are built one after the
other in this process, as before.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..signal_delivery import raise_not_lost, redelivered_after_finalizer
from .aoti_library import probe_package
from .build_lock import build_lock
from .cache import KVCache
from .config import ModelConfig
from .load_probe import probes
from .packaged import build_package, check_buildable
from .precision import TORCH_DTYPES
from .vla import VLA, build_model

#: bytes of weights a worker may build for itself (random, of the model's sizes); larger models
#: build their packages in this process
WORKER_WEIGHT_LIMIT = 1 << 30


@dataclass(frozen=True)
class Build:
    """One package to build: piece ``name`` with ``steps`` denoise steps at ``inputs``, into ``path``."""

    what: str  # the bucket, as the warm-up's progress names it
    name: str
    steps: int
    inputs: tuple[Tensor, ...]
    path: pathlib.Path


def worker_count(model: VLA, builds: int) -> int:
    """Processes to build ``builds`` packages of ``model`` with (1: in this process)."""
    if model.device.type != "cpu" or builds < 2:
        return 1
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if weights > WORKER_WEIGHT_LIMIT:
        return 1
    return max(1, min(builds, len(os.sched_getaffinity(0))))


def build_missing(model: VLA, cache: KVCache, builds: Sequence[Build], cache_dir: pathlib.Path,
                  done: Callable[[Build], None], note: Callable[[str], None] | None = None) -> list[Build]:
    """Build those of ``builds`` whose package is not in ``cache_dir`` yet (``done(build)`` after
    each) and return them. ``note(text)`` says first what it does: load them all from the cache,
    or compile how many. Raises ``compile_setup.CannotBuild``, building nothing and saying nothing
    before (the refusal is the one line), where they cannot be built here
    (``packaged.check_buildable``). Waits for another process building into the same cache
    (``build_lock.py``; ``note`` says so), then builds what it did not. On a probed device the
    first is built and tried alone: a library that would crash this process stops the warm-up
    before the others are built (``load_probe.py``)."""
    say = note or (lambda text: None)
    missing = [b for b in builds if not b.path.exists()]
    if not missing:
        say(f"loading the {len(builds)} compiled shape buckets from the compile cache ({cache_dir})")
        return []
    check_buildable(cache_dir, model.device, len(missing), len(builds))
    say(f"compiling {len(missing)} of the {len(builds)} shape buckets, those not in the compile cache "
        f"({cache_dir}; several at a time, a minute or two when it is empty) ...")
    with build_lock(missing[0].path.parent, note):
        missing = [b for b in missing if not b.path.exists()]  # another process's are there now
        ahead = missing[:1] if probes(model.device) else []
        build_packages(model, cache, ahead, done)
        for b in ahead:
            probe_package(b.path, model.device)
        build_packages(model, cache, missing[len(ahead):], done)
    return missing


def build_packages(model: VLA, cache: KVCache, builds: Sequence[Build], done: Callable[[Build], None],
                   workers: int | None = None) -> None:
    """Build every package of ``builds`` (for ``model`` on ``cache``), calling ``done(build)`` as each
    is written; ``workers`` processes (None: :func:`worker_count`). A build that fails raises here
    (after the others have stopped)."""
    workers = worker_count(model, len(builds)) if workers is None else max(1, min(workers, len(builds)))
    if workers == 1:
        for b in builds:
            build_package(model, cache, b.name, b.steps, b.inputs, b.path)
            done(b)
        return
    dtype = next(n for n, t in TORCH_DTYPES.items() if t == model.dtype)
    spec = (model.config, dtype, tuple(cache.k.shape))
    # spawn, not fork: the parent has torch's (and maybe DDS's) threads running
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_start_worker, initargs=spec)
    try:
        jobs = [(i, b.name, b.steps, b.inputs, str(b.path)) for i, b in enumerate(builds)]
        for i in pool.imap_unordered(_build_in_worker, jobs):
            done(builds[i])
        pool.close()
    except BaseException:
        # Ctrl-C, or a build that failed: the builds running and queued stop now (a pool that is
        # only shut down waits for every queued build, a minute and more on a cold start)
        pool.terminate()
        raise
    finally:
        pool.join()


_worker: dict[str, object] = {}  # the worker process's model and cache


def leave_on_sigterm() -> None:
    """SIGTERM (the pool's ``terminate()``) makes a worker leave through the build's clean-up (no
    half-written package file is left in the cache), not at once; also when it lands in a
    finalizer, where Python drops the exception (``signal_delivery.py``): the worker then built
    on, and the pool waited for it without end."""
    signal.signal(signal.SIGTERM, _leave)


def _leave(signum, frame) -> None:
    if not redelivered_after_finalizer(signum, frame):
        raise_not_lost(signum, SystemExit(1))


def _start_worker(config: ModelConfig, dtype: str, cache_shape: tuple[int, ...]) -> None:
    # Ctrl-C is the parent's to handle (it terminates the pool: no traceback from each worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    leave_on_sigterm()
    torch.set_num_threads(1)  # one core each: the workers share the machine
    layers, slots, kv_heads, max_len, head_dim = cache_shape
    model = build_model(config, dtype=dtype)
    cache = model.new_cache(slots - 1, max_len)  # new_cache adds the trash slot
    if tuple(cache.k.shape) != tuple(cache_shape):
        raise RuntimeError(f"a worker's cache {tuple(cache.k.shape)} differs from the engine's {cache_shape}")
    _worker["model"], _worker["cache"] = model, cache


class BuildFailed(RuntimeError):
    """A worker's build that failed, with the error's type and text: some of torch's compile
    errors cannot be pickled back to the parent, which then saw only "cannot pickle 'module'
    object"."""


def _build_in_worker(job: tuple[int, str, int, tuple[Tensor, ...], str]) -> int:
    """Build one job (index, name, steps, inputs, path); its index, once written."""
    index, name, steps, inputs, path = job
    build_or_fail(_worker["model"], _worker["cache"], name, steps, inputs, pathlib.Path(path))
    return index


def build_or_fail(model: VLA, cache: KVCache, name: str, steps: int, inputs: tuple[Tensor, ...],
                  path: pathlib.Path) -> None:
    """:func:`build_package`, its failure raised as :class:`BuildFailed` (what a worker hands back)."""
    try:
        build_package(model, cache, name, steps, inputs, path)
    except Exception as e:
        raise BuildFailed(f"building {name}: {type(e).__name__}: {e}") from None
