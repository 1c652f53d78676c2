"""``oxygen-bench --tick-probe SECONDS``: control ticks beside frames in one process, without ROS.

For each ``--compile`` mode, with and without the node's tick guard
(``yield_to_ticks``), the engine of an ``oxygen-bench`` run with the same
options runs frames back to back (5 ms rest after each, requests arriving as
``--arrivals`` says; ``--agents N``: N observations a frame, one per robot,
the first value of a list) while a thread of the same process ticks every
``--tick-period-ms`` (:mod:`~oxygen_ros.core.tick_probe`). The rows take turns
in one-second slices until each has run ``SECONDS``, so a change in the
machine's load reaches them all alike. The process hands the interpreter lock
over every 1 ms, as the inference node's does. Each row gives the ticks'
lateness (and the frames' median, with the guard including the time a frame
stepped aside for ticks): the part of the agent's tick jitter that comes from
sharing a process with the frames, without DDS, other nodes or processes::

    oxygen-bench --tick-probe 20 --settings oxygen --compile on,off --threads 1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..core.benchmark import RunSpec, denoise_sweep, engine_for, frame_observations, synthetic_observations
from ..core.engine import Question
from ..core.model.compile_setup import resolve_compile
from ..core.tick_guard import SWITCH_INTERVAL_S, TickGuard
from ..core.tick_probe import frames_beside_ticks, lateness_summary
from ..core.workloads import Workload
from .common import keeps_freed_memory

SLICE_S = 1.0  # each row's turn
REST_S = 0.005  # after each frame
WARMUP_FRAMES = 20


class _Row:
    """One engine (compile mode, guard on or off) and what its slices recorded."""

    def __init__(self, model, tok, args: argparse.Namespace, mode: str, guarded: bool, observations: list):
        steps = denoise_sweep(args.denoise_steps, model.config)[0]
        # the engine of the first run of ``oxygen-bench`` with these options (frames and warm-up unused)
        spec = RunSpec(args.settings[0], args.max_decode[0], args.steps_per_frame[0], steps, 0, 0, args.arrivals,
                       agents=args.agents[0], max_active=args.max_active, seed=args.seed, compile=mode,
                       cameras=args.cameras, keep_freed_memory=keeps_freed_memory(args))
        self.engine = engine_for(model, tok, spec)
        self.engine.warm_up()
        self.mode, self.guard = mode, TickGuard() if guarded else None
        self.engine.pause_point = self.guard.pause_point if self.guard else None
        self.observations = observations
        self.arrivals = Workload.parse(spec.arrivals).schedule(1000, spec.max_decode, seed=spec.seed)
        self.agents = spec.agents  # observations per frame, one per robot
        self.served: list[int] = []  # action chunks each frame produced
        self.f = 0
        self.late: list[np.ndarray] = []
        self.missed = 0  # periods the probe's ticks skipped (a tick a period or more late)
        self.frames_ms: list[float] = []
        for _ in range(WARMUP_FRAMES):
            self.frame()

    def frame(self) -> None:
        f, self.f = self.f, self.f + 1
        asks = [Question("", max_tokens=n) for n in self.arrivals[f % len(self.arrivals)]]
        res = self.engine.step(frame_observations(self.observations, f, self.agents), asks)
        self.served.append(len(res.actions))

    def run(self, seconds: float, period_s: float) -> None:
        late, frames_ms, missed = frames_beside_ticks(self.frame, seconds, period_s=period_s, rest_s=REST_S,
                                                      guard=self.guard)
        self.late.append(late)
        self.missed += missed
        self.frames_ms += frames_ms

    def result(self) -> dict:
        out = {"compile": self.mode, "compiled": self.engine.compiled is not None, "tick_guard": self.guard is not None,
               "agents": self.agents, "observations_per_frame": float(np.mean(self.served)),
               "frames": len(self.frames_ms),
               "frame_median_ms": float(np.median(self.frames_ms)),
               "recompiles": self.engine.recompiles}
        out.update(lateness_summary(np.concatenate(self.late), missed=self.missed))
        return out


def run_tick_probe(model, tok, args: argparse.Namespace) -> dict:
    """Every row (compile mode x guard on/off) in turns of :data:`SLICE_S` for ``args.tick_probe`` seconds each."""
    enabled = dict.fromkeys(resolve_compile(m, args.device).enabled for m in args.compile)  # in order, once
    modes = ["on" if e else "off" for e in enabled]
    c = model.config
    observations = synthetic_observations(32, c.vision.image_size, args.cameras, seed=args.seed)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        rows = [_Row(model, tok, args, mode, guarded, observations) for mode in modes for guarded in (True, False)]
        done = 0.0
        while done < args.tick_probe:
            turn = min(SLICE_S, args.tick_probe - done)
            for row in rows:
                row.run(turn, args.tick_period_ms / 1e3)
            done += turn
    finally:
        sys.setswitchinterval(previous)
    return {"setting": args.settings[0], "seconds": args.tick_probe, "tick_period_ms": args.tick_period_ms,
            "rows": [row.result() for row in rows]}


def print_tick_probe(result: dict) -> None:
    agents = result["rows"][0]["agents"] if result["rows"] else 1
    print(f"ticks every {result['tick_period_ms']} ms beside {result['setting']} frames of {agents} observation(s), "
          f"{result['seconds']} s per row (lateness, ms)")
    head = f"{'compile':>8} {'guard':>6} {'frames':>7} {'frame med':>10} {'late p50':>9} {'late p99':>9} " \
           f"{'late max':>9} {'> 2 ms':>7} {'missed':>7}"
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        print(f"{'on' if r['compiled'] else 'off':>8} {'on' if r['tick_guard'] else 'off':>6} {r['frames']:>7} "
              f"{r['frame_median_ms']:>10.2f} {r['late_p50_ms']:>9.3f} {r['late_p99_ms']:>9.3f} "
              f"{r['late_max_ms']:>9.2f} {r['share_over']:>7.1%} {r['missed']:>7}")
