"""Measurements behind ``oxygen-bench`` and ``oxygen-calibrate`` (ROS-free).

:func:`run_setting` drives an :class:`Engine` through a workload and reports
the paper's figures for that run (:func:`run_interleaved`: several runs, a
frame of each in turn); :func:`measure_components` times the three
model operations (prefill, one denoise step, one batched decode step against
batch size); :func:`upper_bound` is the batching upper bound: a frame that
costs only the shared prefill, S denoise steps and k decode steps at batch 1.
Warm-up frames are run first and never measured; with ``compile`` on, the
engine's warm-up (compiling every bucket) runs before them and is reported as
``compile_s``, and ``recompiles`` counts graphs built after it (0 expected).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .engine import Engine, EngineConfig, Question
from .model.compiled import Progress
from .model.vla import VLA
from .observation import Observation
from .piece_timing import PieceTimer
from .requests import FinishReason
from .sim.scene import render, sample_scene
from . import timing
from .tokenizer import Tokenizer, prompt_ids
from .workloads import Workload


def denoise_sweep(requested: Sequence[int] | None, config) -> list[int]:
    """The denoise step counts S of a sweep: those ``requested``, else the checkpoint's
    (``config.denoise_steps``); runs with one S (the pieces, the tick probe) take the first."""
    return list(requested or [config.denoise_steps])


def frame_observations(observations: Sequence[Observation], f: int, agents: int) -> list[Observation]:
    """Frame ``f``'s observations, one per agent: the next ``agents`` of ``observations`` in turn."""
    return [observations[(f * agents + a) % len(observations)] for a in range(agents)]


def synthetic_observations(count: int, size: int, cameras: int = 1, seed: int = 0) -> list[Observation]:
    """Scenes of the synthetic task, one image per camera."""
    rng = np.random.default_rng(seed)
    names = ["base"] + [f"cam{i}" for i in range(1, cameras)]
    out = []
    for _ in range(count):
        scene = sample_scene(rng)
        image = render(scene, size)
        out.append(Observation({n: image for n in names}, scene.instruction, scene.state))
    return out


#: words appended to an instruction to lengthen its prompt one token at a time
FILLERS = ("go", "a", "x")


def with_prompt_tokens(obs: Observation, tokenizer: Tokenizer, n: int) -> Observation:
    """``obs`` with its instruction cut (last words dropped) or padded (filler words added) so that
    its prompt is exactly ``n`` tokens."""
    def count(ws: list[str]) -> int:
        return len(prompt_ids(tokenizer, " ".join(ws), obs.state))

    words = obs.instruction.split()
    while words and count(words) > n:
        words.pop()
    if count(words) > n:
        raise ValueError(f"--prompt-tokens {n}: the prompt's template and state alone take {count(words)} tokens")
    while count(words) < n:
        fits = [f for f in FILLERS if count(words + [f]) <= n]
        if not fits:
            raise ValueError(f"--prompt-tokens {n}: no filler word reaches exactly {n} tokens")
        words.append(fits[0])
    return Observation(obs.images, " ".join(words), obs.state)


def shortest_prompt(observations: Sequence[Observation], tokenizer: Tokenizer) -> int:
    """The fewest prompt tokens :func:`with_prompt_tokens` can give every one of ``observations``:
    the prompt's template and state alone, the longest of them."""
    return max(len(prompt_ids(tokenizer, "", o.state)) for o in observations)


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


@dataclass(frozen=True)
class RunSpec:
    setting: str
    max_decode: int  # N
    steps_per_frame: int  # k
    denoise_steps: int  # S
    frames: int
    warmup: int
    arrivals: str
    agents: int = 1
    max_active: int = 16
    queue_limit: int = 64
    seed: int = 0
    compile: str = "off"  # EngineConfig.compile
    cameras: int | None = None  # EngineConfig.max_cameras: the observations' camera count
    keep_freed_memory: bool = True  # EngineConfig.keep_freed_memory


def run_setting(model: VLA, tokenizer: Tokenizer, spec: RunSpec, observations: list[Observation],
                on_frame: Callable[[], None] | None = None) -> dict:
    """One benchmark run: warm-up frames, then ``spec.frames`` measured frames.

    Requests still running when the measured frames end are not waited for
    (their tokens produced so far count, as in a live system).
    """
    return run_interleaved(model, tokenizer, [spec], observations, on_frame)[0]


def run_interleaved(model: VLA, tokenizer: Tokenizer, specs: Sequence[RunSpec], observations: list[Observation],
                    on_frame: Callable[[], None] | None = None,
                    after_round: Callable[[list["Run"], int], None] | None = None) -> list[dict]:
    """Several runs side by side: every engine is built (and compiled) first, then frame ``f`` of
    each run in turn, so that a change in the machine's load reaches them all alike. Each run's
    figures count its own frames only (see :class:`Run`). ``after_round(runs, f)`` is called
    after frame ``f`` of every run (the benchmark times the pieces alone there)."""
    runs = [Run(model, tokenizer, spec, observations) for spec in specs]
    f = 0
    try:
        while not all(r.done for r in runs):
            for r in runs:
                if not r.done:
                    r.frame()
                    if on_frame:
                        on_frame()
            if after_round:
                after_round(runs, f)
            f += 1
    except KeyboardInterrupt:
        raise Interrupted([r.result() for r in runs if r.measured]) from None
    return [r.result() for r in runs]


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C during the runs' frames. ``runs``: the results of the frames measured so far
    (``frames_measured`` in each; a run that measured none is left out): the runs take turns
    frame by frame, so every one of them stops part-way."""

    def __init__(self, runs: list[dict]):
        super().__init__("interrupted")
        self.runs = runs


class Run:
    """One benchmark run, a frame at a time. Its clock stops between its frames: the language
    throughput is over the time of its measured frames, and a request's latency leaves out the
    time spent outside this run (other runs' frames) between its arrival and its end."""

    def __init__(self, model: VLA, tokenizer: Tokenizer, spec: RunSpec, observations: list[Observation]):
        self.model, self.spec, self.observations = model, spec, observations
        self.engine = engine_for(model, tokenizer, spec)
        self.compile_s = timing.median_ms(self.engine.warm_up, repeats=1, warmup=0, device=model.device) / 1e3
        self.workload = Workload.parse(spec.arrivals)
        self.schedule = self.workload.schedule(spec.warmup + spec.frames, spec.max_decode, seed=spec.seed)
        self.f = 0
        self.latencies, self.tokens, self.batches, self.copies, self.served = [], 0, [], [], []
        self.finished, self.measured_ids = [], set()
        # language load of the measured frames: requests that arrived, were rejected (the queue
        # full), the queue's length when measuring began, and the frames that decoded anything
        self.arrived, self.rejected, self.decoding_frames = 0, 0, 0
        self.queued_at_start = 0
        self.own_s = 0.0  # time of the measured frames
        self.starts, self.away = [], []  # each frame's start, and the time spent outside this run before it
        self._last_end: float | None = None

    @property
    def done(self) -> bool:
        return self.f >= len(self.schedule)

    @property
    def measured(self) -> int:
        """Frames measured so far."""
        return len(self.latencies)

    def frame(self) -> None:
        spec, f = self.spec, self.f
        t0 = time.perf_counter()
        self.away.append((self.away[-1] if self.away else 0.0) + (t0 - (self._last_end or t0)))
        self.starts.append(t0)
        obs = frame_observations(self.observations, f, spec.agents)
        if f == spec.warmup:
            self.queued_at_start = self.engine.queued_requests
        res = self.engine.step(obs, [Question("", max_tokens=n) for n in self.schedule[f]])
        if f >= spec.warmup:
            self.latencies.append(res.total_ms)
            self.served.append(len(res.actions))
            self.tokens += sum(1 for e in res.tokens if e.token_id >= 0)
            self.batches.append(statistics.fmean(res.batch_sizes) if res.batch_sizes else 0.0)  # B: 0 when idle
            self.copies.append(res.copy_bytes)
            self.measured_ids.update(res.started)
            self.finished += [r for r in res.finished if r.id in self.measured_ids]
            self.arrived += len(self.schedule[f])
            self.rejected += sum(r.finish_reason == FinishReason.REJECTED for r in res.finished)
            self.decoding_frames += bool(res.batch_sizes)
        self._last_end = time.perf_counter()
        if f >= spec.warmup:
            self.own_s += self._last_end - t0
        self.f += 1

    def _own_latency_ms(self, created: float, finished: float) -> float:
        def away(t: float) -> float:
            return self.away[max(bisect.bisect_right(self.starts, t) - 1, 0)]

        return (finished - created - (away(finished) - away(created))) * 1e3

    def result(self) -> dict:
        spec, latencies, engine = self.spec, self.latencies, self.engine
        request_ms = [self._own_latency_ms(r.created, r.finished) for r in self.finished]
        mean_ms, median_ms = statistics.fmean(latencies), statistics.median(latencies)
        horizon = self.model.config.action_horizon
        return {
            "setting": spec.setting, "N": spec.max_decode, "k": spec.steps_per_frame, "S": spec.denoise_steps,
            "H": horizon, "arrivals": str(self.workload), "agents": spec.agents, "frames": spec.frames,
            "frames_measured": len(latencies), "warmup": spec.warmup, "seed": spec.seed,
            "max_active": spec.max_active, "queue_limit": spec.queue_limit, "cameras": spec.cameras,
            "frame_latency_ms": {"mean": mean_ms, "median": median_ms, "p99": percentile(latencies, 99)},
            "frame_latency_p99_ms": percentile(latencies, 99),
            "action_frequency_hz": spec.agents * horizon / (mean_ms / 1e3),
            "action_frequency_per_robot_hz": horizon / (mean_ms / 1e3),
            "observations_per_frame": statistics.fmean(self.served),
            "per_observation_ms": median_ms / spec.agents,
            "language_throughput_tps": self.tokens / self.own_s,
            "avg_batch_size": statistics.fmean(self.batches) if self.batches else 0.0,
            "avg_request_latency_ms": statistics.fmean(request_ms) if request_ms else None,
            "requests_finished": len(request_ms),
            **self._load(),
            # tokens a finished request decoded, on average: below N when the model ends answers early
            "tokens_per_request": statistics.fmean(len(r.tokens) for r in self.finished) if self.finished else None,
            # the share of them that ended at the model's end-of-sequence token, before their length
            "eos_share": (statistics.fmean(r.finish_reason == FinishReason.EOS for r in self.finished)
                          if self.finished else None),
            "kv_bytes_reserved": engine.pool.bytes_reserved, "slot_len": engine.pool.cache.max_len,
            "kv_copy_bytes_per_frame": statistics.fmean(self.copies),
            "compile": spec.compile, "compiled": engine.compiled is not None,
            "compile_reason": engine.compile_reason, "compile_s": self.compile_s, "recompiles": engine.recompiles,
            # packages the warm-up loaded, and of them those it compiled (the others came from the cache)
            "packages": engine.compiled.graphs if engine.compiled else 0,
            "packages_built": engine.compiled.built if engine.compiled else 0,
        }

    def _load(self) -> dict:
        """The language load of the measured frames, as the engine counts it: requests that
        arrived in them, started, were rejected (the queue full); the queue of waiting requests
        when measuring began and at its end; the requests decoding at the end; the share of
        the frames that decoded anything."""
        return {"requests_arrived": self.arrived, "requests_started": len(self.measured_ids),
                "requests_rejected": self.rejected, "queued_at_start": self.queued_at_start,
                "queued_at_end": self.engine.queued_requests, "active_at_end": self.engine.active_requests,
                "decoding_share": self.decoding_frames / len(self.latencies)}


#: what must match for two runs to differ only in their number of agents
SAME_BUT_AGENTS = ("setting", "N", "k", "S", "H", "arrivals", "frames", "warmup", "compile")


def compare_agents(runs: list[dict]) -> None:
    """Set each run's ``frame_ratio_vs_1_agent``: its median frame over the median frame of the
    1-agent run with the same other settings (None when the runs have no such run)."""
    def key(r: dict) -> tuple:
        return tuple(r.get(name) for name in SAME_BUT_AGENTS)

    single = {key(r): r for r in runs if r["agents"] == 1}
    for r in runs:
        one = single.get(key(r))
        r["frame_ratio_vs_1_agent"] = (r["frame_latency_ms"]["median"] / one["frame_latency_ms"]["median"]
                                       if one else None)


def engine_for(model: VLA, tokenizer: Tokenizer, spec: RunSpec) -> Engine:
    """The engine a benchmark run of ``spec`` runs its frames on."""
    config = EngineConfig(setting=spec.setting, max_decode=spec.max_decode, steps_per_frame=spec.steps_per_frame,
                          denoise_steps=spec.denoise_steps, max_active=spec.max_active,
                          queue_limit=spec.queue_limit, max_observations_per_frame=spec.agents,
                          language_every_n_frames=0, seed=spec.seed, compile=spec.compile,
                          max_cameras=spec.cameras, keep_freed_memory=spec.keep_freed_memory)
    return Engine(model, tokenizer, config)


def measure_components(model: VLA, tokenizer: Tokenizer, *, batch_sizes: Sequence[int] = (1, 2, 4, 8),
                       cameras: int | None = None, repeats: int = 30, decode_context: int = 16,
                       denoise_steps: int = 1, compile: bool = False, slot_len: int | None = None,
                       warm_all: bool = True, round_steps: int = 0, progress: Progress | None = None,
                       note: Callable[[str], None] | None = None) -> dict:
    """Median latency of: prefill of one observation, one denoise step (batch 1; the median of
    ``denoise_steps`` steps in one call, divided by them), and one decode step at each batch
    size (prefixes of real length plus ``decode_context`` decoded tokens), over ``repeats``
    samples that each time every piece once, in turn (:class:`~.piece_timing.PieceTimer`).
    ``compile``: the compiled pieces (:class:`CompiledVLA`, warmed up first) instead of the
    eager model; a decode step is then a decode call of one step, as the engine's graphs run it.
    ``slot_len``: the cache's slot length (default: just enough); pass an engine's
    (``Engine.pool.cache.max_len``) to time the pieces as its compiled graphs run them, over
    the whole slot, masked. ``warm_all=False``: build only the buckets timed (a large model's
    compile takes minutes a bucket), not every bucket first. ``round_steps`` K > 1 with ``compile``:
    also a decode call of K steps at each batch size (``decode_round_step_ms``: its time over K,
    what one step costs the engine when a frame runs its full k = K). ``progress``, ``note``: as
    :meth:`CompiledVLA.warm_up`'s, when compiled (a line per bucket built or loaded)."""
    timer = piece_timer(model, tokenizer, batch_sizes=batch_sizes, cameras=cameras, decode_context=decode_context,
                        denoise_steps=denoise_steps, compile=compile, slot_len=slot_len, warm_all=warm_all,
                        round_steps=round_steps, progress=progress, note=note)
    for _ in range(repeats):
        timer.sample()
    return timer.result()


def piece_timer(model: VLA, tokenizer: Tokenizer, *, cameras: int | None = None, **options) -> PieceTimer:
    """A :class:`PieceTimer` on a synthetic observation with ``cameras`` cameras (default: the
    model's every camera slot); ``options`` as :func:`measure_components`'s."""
    c = model.config
    cams = cameras or c.max_cameras
    obs = synthetic_observations(1, c.vision.image_size, cams)[0]
    return PieceTimer(model, tokenizer, obs, cameras=cams, **options)


def decode_call_ms(components: dict, k: int) -> float:
    """``k`` decode steps at batch 1 as an engine runs them: eager, ``k`` one-step calls;
    compiled, one call of ``k`` steps, on the line through the measured one-step call
    (``decode_step_ms[1]``) and ``K``-step call (``decode_round_step_ms[1]`` x ``K``) when
    both were measured (a call's fixed cost is paid once, each step adds the same)."""
    one = components["decode_step_ms"][1]
    big = components.get("decode_round_steps", 0)
    rounds = components.get("decode_round_step_ms") or {}
    if k <= 1 or big <= 1 or 1 not in rounds:
        return k * one
    per_step = (rounds[1] * big - one) / (big - 1)
    return one + (k - 1) * per_step


def upper_bound(components: dict, *, S: int, k: int, H: int, tokens_per_frame: float | None = None,
                decoding_share: float = 1.0) -> dict:
    """The frame if batching were free: shared prefill + S denoise steps + k decode
    steps at batch 1 (:func:`decode_call_ms`: compiled, one k-step call, as the engine
    runs them) in the share ``decoding_share`` of the frames that decode anything (0: no
    request came, the frame is prefill and denoise alone). Its throughput is
    ``tokens_per_frame`` (default k: batch 1; pass the batched run's measured tokens per
    frame, i.e. B·k plus first tokens) over that frame time."""
    t = (components["prefill_ms"] + S * components["denoise_step_ms"]
         + decoding_share * decode_call_ms(components, k))
    per_frame = k if tokens_per_frame is None else tokens_per_frame
    return {"frame_latency_ms": t, "action_frequency_hz": H / (t / 1e3),
            "language_throughput_tps": per_frame / (t / 1e3), "tokens_per_frame": per_frame, "S": S, "k": k,
            "decoding_share": decoding_share}
