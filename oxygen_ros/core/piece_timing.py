"""A frame's pieces timed alone (no ROS): the figures behind the benchmark's upper bound.

:class:`PieceTimer` sets up one observation's prefix in a cache of its own, then
each :meth:`~PieceTimer.sample` times one call of every piece: the prefill of
one observation, the denoise call (S steps), a decode call of one step at each
batch size, and, compiled with ``round_steps`` K > 1, a decode call of K steps
at each batch size. Samples can be taken in a hot loop
(:func:`~oxygen_ros.core.benchmark.measure_components`) or one at a time between
other work: ``oxygen-bench`` takes one after each round of its runs' frames, so
that the pieces and the frames they bound are timed at the same moments of a
machine whose speed drifts (this 2-core VM's did by up to 2x within minutes),
with the caches in the state frames leave them in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from . import timing
from .model.cache import SlotView
from .model.compiled import CompiledVLA, Progress
from .model.vla import VLA
from .observation import Observation, make_prefix_batch
from .tokenizer import Tokenizer


class PieceTimer:
    """``model``'s pieces on a prefix of ``observation`` (``cameras`` of them present), each
    timed once per :meth:`sample`; :meth:`result` gives the medians (see
    :func:`~oxygen_ros.core.benchmark.measure_components` for the options)."""

    def __init__(self, model: VLA, tokenizer: Tokenizer, observation: Observation, *,
                 batch_sizes: Sequence[int] = (1, 2, 4, 8), decode_context: int = 16, denoise_steps: int = 1,
                 compile: bool = False, slot_len: int | None = None, warm_all: bool = True, round_steps: int = 0,
                 cameras: int | None = None, warmup: int = 3, progress: Progress | None = None,
                 note: Callable[[str], None] | None = None):
        started = time.perf_counter()
        c = model.config
        self.device, self.compiled, self.denoise_steps = model.device, compile, denoise_steps
        self.cameras = cameras or c.max_cameras
        batch = make_prefix_batch([observation], tokenizer, c)
        cache = model.new_cache(slots=max(batch_sizes) + 1, max_len=slot_len or c.prefix_len + decode_context + 2)
        run = model
        if compile:
            run = CompiledVLA(model, cache, steps=denoise_steps, max_observations=1, max_cameras=self.cameras,
                              decode_steps=max(1, round_steps))
            if warm_all:  # progress, note: as CompiledVLA.warm_up's (a line per bucket built or loaded)
                run.warm_up(progress, note)
        self.run, self.cache, self.warm_all = run, cache, warm_all
        self.length = length = int(run.prefill(batch, cache, [[0]]).lengths[0])
        for s in range(1, max(batch_sizes)):  # every decode row reads the same prefix
            cache.k[:, s, :, :length] = cache.k[:, 0, :, :length]
            cache.v[:, s, :, :length] = cache.v[:, 0, :, :length]
        noise = torch.randn(1, c.action_horizon, c.action_dim)
        view = SlotView.of(0, [length])
        #: (name, call): what one sample times, in this order
        self.calls: list[tuple[str, Callable[[], object]]] = [
            ("prefill", lambda: run.prefill(batch, cache, [[0]])),
            ("denoise", lambda: run.denoise(cache, view, noise, denoise_steps))]
        self.rounds = run.decode_steps if compile and run.decode_steps > 1 else 0
        for b in batch_sizes:
            rows = SlotView.of(0, [length + decode_context] * b)
            tokens = torch.full((b,), 5, dtype=torch.long)
            self.calls.append((f"decode {b}", self._decode(rows, tokens, 1)))
            if self.rounds:
                self.calls.append((f"round {b}", self._decode(rows, tokens, self.rounds)))
        self.batch_sizes = tuple(batch_sizes)
        self.times: dict[str, list[float]] = {name: [] for name, _ in self.calls}
        for _ in range(warmup):  # allocation, kernel choice, a compiled graph's first run
            self.sample(record=False)
        #: seconds this setting-up took (compiled: mostly loading, or building, its packages)
        self.setup_s = time.perf_counter() - started

    def _decode(self, view: SlotView, tokens: torch.Tensor, steps: int) -> Callable[[], object]:
        """A decode of ``steps`` steps at ``tokens``' batch size: eager, a decode step (``steps`` 1);
        compiled, a decode call of ``steps`` steps in which no row ends early, as the engine runs it."""
        run, cache = self.run, self.cache
        if not self.compiled:
            return lambda: run.decode_step(cache, view, tokens)
        allowed = torch.ones(run.model.config.vocab_size, dtype=torch.bool)
        left = torch.full(tokens.shape, run.decode_steps, dtype=torch.long)
        return lambda: run.decode(cache, view, tokens, left, allowed, -1, steps)

    def sample(self, record: bool = True) -> None:
        """One timed call of every piece, recorded once all are timed (a sample that an interrupt
        cut short records none: every piece keeps as many samples as the others)."""
        seconds = {name: timing.elapsed_s(call, self.device) for name, call in self.calls}
        if record:
            for name, s in seconds.items():
                self.times[name].append(s)

    def result(self) -> dict:
        """Medians of the samples so far, in milliseconds: ``prefill_ms``, ``denoise_step_ms`` (the
        denoise call over its steps), ``decode_step_ms`` {batch: one step}, ``decode_round_step_ms``
        {batch: a K-step call over K} (compiled, K > 1), and what was timed."""
        if not self.times["prefill"]:
            raise ValueError("no sample taken yet")
        ms = {name: statistics.median(t) * 1e3 for name, t in self.times.items()}
        return {"prefill_ms": ms["prefill"], "denoise_step_ms": ms["denoise"] / self.denoise_steps,
                "decode_step_ms": {b: ms[f"decode {b}"] for b in self.batch_sizes},
                "decode_round_step_ms": {b: ms[f"round {b}"] / self.rounds for b in self.batch_sizes}
                if self.rounds else {},
                "decode_round_steps": self.rounds, "samples": len(self.times["prefill"]),
                "prefix_tokens": self.length, "slot_len": self.cache.max_len, "cameras": self.cameras,
                "compiled": self.compiled,
                "recompiles": self.run.recompiles if self.compiled and self.warm_all else 0}
