"""Language request arrivals for benchmarks: when requests come and how long they are.

Every frame brings one observation per agent (the action path never pauses);
a workload says how many language requests arrive in each frame and the
token budget of each. Specs, as given on the command line:

* ``uniform:R``        - R requests per frame on average, evenly spaced
  (``uniform:1`` one per frame, ``uniform:0.5`` one every other frame);
* ``poisson:L``        - a Poisson number of requests per frame with mean L;
* ``random-length:A-B`` - one request per frame, its length uniform in [A, B]
  (B capped at the run's N; A must not exceed N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    kind: str
    rate: float = 1.0
    low: int = 0
    high: int = 0

    @classmethod
    def parse(cls, spec: str) -> "Workload":
        kind, _, arg = spec.partition(":")
        try:
            if kind == "uniform":
                w = cls(kind, rate=float(arg or 1))
            elif kind == "poisson":
                w = cls(kind, rate=float(arg or 1))
            elif kind == "random-length":
                lo, _, hi = arg.partition("-")
                w = cls(kind, low=int(lo), high=int(hi))
            else:
                raise ValueError(kind)
        except ValueError:
            raise ValueError(f"bad arrivals spec {spec!r}: use uniform:R, poisson:L or random-length:A-B") from None
        if kind != "random-length" and not (math.isfinite(w.rate) and w.rate >= 0):
            raise ValueError(f"arrival rate must be a finite number >= 0 in {spec!r}")
        if kind == "random-length" and not 1 <= w.low <= w.high:
            raise ValueError(f"random-length needs 1 <= A <= B in {spec!r}")
        return w

    def check(self, max_tokens: int) -> None:
        """ValueError when runs with ``max_tokens`` (N) cannot draw this workload's lengths."""
        if self.kind == "random-length" and self.low > max_tokens:
            raise ValueError(f"{self} asks for at least {self.low} tokens, more than N = {max_tokens} (max_decode)")

    @property
    def requests_per_frame(self) -> float:
        """Requests arriving per frame, on average."""
        return 1.0 if self.kind == "random-length" else self.rate

    def mean_tokens(self, max_tokens: int) -> float:
        """A request's token budget, on average, in runs with ``max_tokens`` (N)."""
        if self.kind == "random-length":
            return (self.low + min(self.high, max_tokens)) / 2
        return float(max_tokens)

    def __str__(self) -> str:
        return f"{self.kind}:{self.low}-{self.high}" if self.kind == "random-length" else f"{self.kind}:{self.rate:g}"

    def schedule(self, frames: int, max_tokens: int, seed: int = 0) -> list[list[int]]:
        """For each frame, the token budgets of the requests arriving in it."""
        self.check(max_tokens)
        rng = np.random.default_rng(seed)
        out: list[list[int]] = []
        for t in range(frames):
            if self.kind == "uniform":
                n = math.floor((t + 1) * self.rate + 1e-9) - math.floor(t * self.rate + 1e-9)
                out.append([max_tokens] * n)
            elif self.kind == "poisson":
                out.append([max_tokens] * int(rng.poisson(self.rate)))
            else:
                out.append([int(rng.integers(self.low, min(self.high, max_tokens) + 1))])
        return out
