"""Flow-matching time: the Euler grid of π0.5's sampler and the sinusoidal embedding of t.

The action expert denoises from t = 1 (noise) towards t = 0 in S Euler steps
of ``dt = -1/S``; each step conditions the expert on ``time_embedding(t)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def flow_dt(steps: int, device: torch.device | str = "cpu") -> Tensor:
    """The Euler step ``-1/steps``, a float32 scalar."""
    if steps < 1:
        raise ValueError(f"denoise steps must be >= 1, got {steps}")
    # torch.full, not torch.tensor: a kernel, not a copy from the host (a CUDA graph may capture it)
    return torch.full((), -1.0 / steps, dtype=torch.float32, device=device)


def flow_times(steps: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """The Euler grid of openpi's π0.5 sampler: ``t`` starts at 1.0 and ``dt = -1/steps``
    is added in float32 each step (so t is 1.0, 0.89999998, 0.79999995, ... for 10 steps,
    not ``1 - k/steps``: the time embedding's shortest period amplifies the difference).
    Returns (times [steps] float32, dt, a float32 scalar)."""
    dt = flow_dt(steps, device)
    t = torch.full((), 1.0, dtype=torch.float32, device=device)
    times = []
    for _ in range(steps):
        times.append(t)
        t = t + dt
    return torch.stack(times), dt


def time_embedding(t: Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> Tensor:
    """Sinusoidal embedding of the flow-matching time t [B] -> [B, dim] (sin | cos)."""
    if dim % 2:
        raise ValueError(f"time embedding width must be even, got {dim}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.to(torch.float64)[:, None] * (2.0 * math.pi / period)[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)
