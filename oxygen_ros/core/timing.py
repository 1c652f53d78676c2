"""The median time of a call on a device, for the benchmarks (no ROS).

:func:`median_ms` runs a call a few times untimed (allocation, kernel choice,
a compiled graph's first run), then times it ``repeats`` times. On CUDA, where
work runs asynchronously, the device is synchronised before and after each
timed call, so that the time is the work's, not its launch's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: str | torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def elapsed_s(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds one call of ``fn`` takes on ``device`` (its queued work waited for before and after)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3, device: str | torch.device = "cpu") -> float:
    """Median milliseconds of ``repeats`` timed calls of ``fn`` on ``device``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(elapsed_s(fn, device) for _ in range(repeats)) * 1e3
