"""The serving engine: one model, one KV pool, one request manager, one frame at a time.

``Engine.step(observations, questions)`` runs one frame in the configured
setting (see ``scheduler.py``) and returns the action chunk of every
observation plus the text tokens produced in that frame. The engine holds the
primitives the settings are made of (prefill into slots, denoise a run of
slots, start requests, decode a round over the active slots); the settings
only decide when each is called and with which slots.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence

import numpy as np
import torch

from . import scheduler
from .cadence import LanguageCadence
from .engine_config import EngineConfig, served_cameras, slot_len
from .frame_result import FrameError, FrameResult, Question, tokens_beyond
from .heap import freed_memory_note
from .kv_pool import SCRATCH, KVPool
from .model.compiled import CompiledVLA, Progress
from .model.vla import VLA
from .model_runner import ModelRunner
from .observation import Observation, make_prefix_batch
from .requests import FinishReason, Request, RequestManager, TokenEvent, finish_event
from .tokenizer import Tokenizer

SETTINGS = scheduler.SETTINGS
log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: VLA, tokenizer: Tokenizer, config: EngineConfig = EngineConfig(),
                 normalizer=None):
        self.model, self.tokenizer, self.config, self.normalizer = model, tokenizer, config, normalizer
        #: when a frame without an explicit ``start_language`` starts language requests
        self.cadence = LanguageCadence(config.language_every_n_frames)
        mc = model.config
        self.max_cameras = served_cameras(config, mc.max_cameras)  #: cameras an observation may carry
        cache = model.new_cache(slots=config.max_active + config.max_observations_per_frame,
                                max_len=slot_len(config, mc))
        self.pool = KVPool(cache, on_move=self._slot_moved)
        self.requests = RequestManager(self.pool, tokenizer, max_active=config.max_active,
                                       queue_limit=config.queue_limit)
        self.frame_id = 0
        #: called as ``pause_point(work)`` before each piece of a frame ("prefill", "denoise",
        #: "decode": one denoise or decode step each): where the caller may hold the frame back
        #: for a moment (the ROS node lets its control tick run there); None: never
        self.pause_point: Callable[[str], None] | None = None
        self.last_observations: dict[str, Observation] = {}  # the newest of each robot
        self._observed_in: dict[str, int] = {}  # the frame each robot's newest observation came in
        self._noise_seeds: list[int] | None = None  # this frame's, one per observation
        self._noise = torch.Generator()  # re-seeded for each observation's noise (only ``act`` uses it)
        self._result: FrameResult | None = None
        self._timing = threading.Lock()  # phase times and chunks are added from both threads of ``parallel``
        self._starting: list[Request] = []
        #: S when a frame's plan gives none: the configured one, else the model's (the checkpoint's)
        self.default_denoise_steps = config.denoise_steps or model.config.denoise_steps
        self._denoise_steps = self.default_denoise_steps  # S of the running frame
        self.memory_note = freed_memory_note(config.keep_freed_memory)  #: a line for the log
        #: runs the pieces: compiled graphs or the model eager
        self.runner = ModelRunner(model, cache, config, max_cameras=self.max_cameras,
                                  denoise_steps=self.default_denoise_steps,
                                  vocab_limit=usable_vocabulary(tokenizer.vocab_size, mc.vocab_size))

    # ------------------------------------------------------------------ public
    def step(self, observations: Sequence[Observation] = (), questions: Sequence[Question] = (), *,
             start_language: bool | None = None, decode_steps: int | None = None,
             denoise_steps: int | None = None, robots: Sequence[str] | None = None,
             noise_seeds: Sequence[int] | None = None) -> FrameResult:
        """Run one frame. Every observation gets an action chunk; each starts a
        language request when due (``language_every_n_frames``, or
        ``start_language``); each question starts one on its robot's newest observation.
        ``decode_steps`` (k) and ``denoise_steps`` (S) are this frame's plan; None:
        the configured ones (the configuration itself never changes). ``robots``
        names each observation's robot (None: all of the one robot ""), and
        ``noise_seeds`` seeds each observation's action noise (None: by frame and
        position, :meth:`noise`): a robot's actions then do not depend on who else
        shares its frames."""
        c = self.config
        check_step(c, self.max_cameras, observations, questions, decode_steps, denoise_steps, robots, noise_seeds,
                   self.last_observations.keys())
        self._denoise_steps = denoise_steps or self.default_denoise_steps
        t0 = time.perf_counter()
        self.frame_id += 1
        copies0 = self.pool.copy_bytes
        self._result = FrameResult(self.frame_id, [])
        names = list(robots) if robots is not None else [""] * len(observations)
        self._noise_seeds = None if noise_seeds is None else list(noise_seeds)
        for name, obs in zip(names, observations):
            self.last_observations[name] = obs
            self._observed_in[name] = self.frame_id
        due = self.cadence.next(bool(observations)) if start_language is None else start_language
        new: list[tuple[Request, int | None]] = []  # (request, index of its observation in this frame)
        if due:
            new += [(self.requests.new(self.frame_id, c.max_decode, observation=o, robot=r), i)
                    for i, (o, r) in enumerate(zip(observations, names))]
        new += [self._question_request(q, names) for q in questions]
        k = c.steps_per_frame if decode_steps is None else decode_steps
        try:
            # no autograd in a frame: its many small tensor operations (and the compiled graphs'
            # operators) skip the dispatcher's autograd bookkeeping
            with torch.inference_mode():
                scheduler.run_frame(c.setting, self, list(observations), new, k)
        except Exception as e:
            res = self._finish_frame(t0, copies0)
            self._recover(new)
            raise FrameError(f"frame {res.frame_id} failed: {e!r}", res) from e
        return self._finish_frame(t0, copies0)

    def _question_request(self, q: Question, names: list[str]) -> tuple[Request, int | None]:
        """A question's request, on its robot's newest observation (and the index of that
        observation in this frame, whose prefix it shares, or None)."""
        c, obs = self.config, self.last_observations[q.robot]  # there is one (check_step)
        ids, limit = self.tokenizer.encode(q.text), c.max_question_tokens
        idx = max((i for i, r in enumerate(names) if r == q.robot), default=None)
        return self.requests.new(self._observed_in[q.robot], q.max_tokens or c.max_decode, client_id=q.client_id,
                                 robot=q.robot, question_ids=ids[:limit], observation=obs,
                                 note=question_cut(limit) if q.cut or len(ids) > limit else ""), idx

    def forget_observations(self) -> None:
        """No question is answered from the observations seen so far (after a warm-up)."""
        self.last_observations.clear()
        self._observed_in.clear()

    def _finish_frame(self, t0: float, copies0: int) -> FrameResult:
        res, self._result = self._result, None
        res.total_ms = (time.perf_counter() - t0) * 1e3
        res.copy_bytes = self.pool.copy_bytes - copies0
        return res

    def _recover(self, new: list[tuple[Request, int | None]]) -> None:
        """After a failed frame: free the scratch slots, and put every request that
        was about to start (or had just arrived) back at the head of the queue."""
        for s in self.pool.slots_of(SCRATCH):
            self.pool.release(s)
        waiting = {r.id for r in self.requests.queue}
        back = [r for r in self._starting + [r for r, _ in new]
                if r.id not in self.requests.active and not r.done and r.id not in waiting]
        seen = set()
        for r in reversed(back):
            if r.id not in seen:
                seen.add(r.id)
                self.requests.queue.appendleft(r)
        self._starting = []

    def drain(self, max_frames: int = 10_000) -> list[Request]:
        """Language-only frames until no request is active or queued."""
        finished = []
        for _ in range(max_frames):
            if not self.requests.active and not self.requests.queue:
                break
            finished += self.step(start_language=False).finished
        return finished

    def cancel_all(self) -> list[TokenEvent]:
        return self.requests.cancel_all()

    @property
    def active_requests(self) -> int:
        return len(self.requests.active)

    @property
    def queued_requests(self) -> int:
        return len(self.requests.queue)

    # ------------------------------------------------------------------ compiled pieces (see ModelRunner)
    @property
    def compiled(self) -> CompiledVLA | None:
        return self.runner.compiled

    @property
    def compile_reason(self) -> str:
        """Why the model runs eager ("" when compiled): for the caller to log once."""
        return self.runner.compile_reason

    def warm_up(self, progress: Progress | None = None, note: Callable[[str], None] | None = None) -> None:
        """Compile every bucket (see :meth:`ModelRunner.warm_up`); nothing when eager."""
        self.runner.warm_up(progress, note)

    @property
    def recompiles(self) -> int:
        """Graphs compiled after warm-up (0 in a steady state, and when eager)."""
        return self.runner.recompiles

    # ------------------------------------------------------------------ primitives (used by scheduler.py)
    def prefill(self, observations: list[Observation], dests: list[list[int]]) -> torch.Tensor:
        """Write each observation's prefix into its slots; returns last-token logits."""
        t0 = time.perf_counter()
        self._pause("prefill")
        observations = [self._model_state(o) for o in observations]
        batch = make_prefix_batch(observations, self.tokenizer, self.model.config, self.config.camera_names)
        res = self.runner.prefill(batch, self.pool.cache, dests)
        for length, slots in zip(res.lengths.tolist(), dests):
            for s in slots:
                self.pool.set_length(s, length)
            if len(slots) > 1:
                self.pool.record_copy(length * (len(slots) - 1))  # one prefix stored more than once
        self._add_time("prefill_ms", t0)
        return res.logits

    def _model_state(self, obs: Observation) -> Observation:
        """``obs`` with its state as the model takes it (:meth:`prompt_state`)."""
        state = self.prompt_state(obs.state)
        return obs if state is obs.state else dataclasses.replace(obs, state=state)

    def prompt_state(self, state: np.ndarray | None) -> np.ndarray | None:
        """The state as the model was trained on it: π0.5 normalises the robot's state with
        the checkpoint's statistics before it is binned into the prompt (``state`` itself
        without statistics)."""
        n = self.normalizer
        if n is None or state is None or getattr(n, "state_stats", None) is None:
            return state
        return n.normalize_state(state).astype(np.float32)

    def act(self, start: int, count: int, observation_ids: list[int]) -> None:
        """Denoise action chunks for slots ``start .. start+count`` (read in place) into the
        frame's result (its ``actions``, in the order of the frame's observations)."""
        t0 = time.perf_counter()
        mc = self.model.config
        noise, pause = self.noise(observation_ids), None if self.pause_point is None else lambda: self._pause("denoise")
        chunks = self.runner.denoise(self.pool.cache, self.pool.view(range(start, start + count)), noise,
                                     self._denoise_steps, pause)
        out = [a for a in chunks.float().cpu().numpy()]
        if self.normalizer is not None:
            # a non-finite chunk is passed on as it is (the caller must refuse it);
            # unnormalising it would raise and lose the frame's text with it
            out = [self.normalizer.unnormalize_actions(a) if np.isfinite(a).all() else a for a in out]
        assert all(a.shape[0] == mc.action_horizon for a in out)
        self._add_time("denoise_ms", t0, actions=out)

    def noise(self, observation_ids: list[int]) -> torch.Tensor:
        """The frame's noise for these observations, [n, H, D]: each the same in every setting;
        seeded by the step's ``noise_seeds`` when given, else by the seed, the frame and the
        position."""
        mc = self.model.config
        seeds = self._noise_seeds
        out = torch.empty(len(observation_ids), mc.action_horizon, mc.action_dim)
        for row, i in zip(out, observation_ids):
            seed = seeds[i] if seeds is not None else self.config.seed * 1_000_003 + self.frame_id * 1_009 + i
            torch.randn(mc.action_horizon, mc.action_dim, generator=self._noise.manual_seed(seed), out=row)
        return out

    def begin(self, request: Request, slot: int, logits: torch.Tensor) -> None:
        """Store a request whose prefix is in ``slot``; its question (if any) is
        appended there first; its first token comes from the last prompt position.
        Stored only once the question is in: a failure before (the frame's) leaves the
        request waiting and ``slot`` a scratch slot, both as the frame's recovery expects."""
        if request.question_ids:
            t0 = time.perf_counter()
            ids = torch.tensor([request.question_ids])
            logits = self.model.extend(self.pool.cache, self.pool.view(range(slot, slot + 1)), ids)[0]
            self.pool.advance(slot, len(request.question_ids))
            self._add_time("prefill_ms", t0)
        token = int(self.runner.greedy(logits))
        self.requests.store(request, slot)
        self._result.started.append(request.id)
        self._emit(self.requests.update(request.id, token, self.tokenizer.eos_id))

    def decode(self, max_steps: int | None) -> None:
        """Advance every running request by one token per step, all in one batched
        forward per step over the view of slots ``0 .. span``; up to ``max_steps``
        steps (None: until all are done). Compiled, a call runs up to ``steps_per_frame``
        steps in one graph (the tokens chosen in it, the same as step by step); eager,
        one. The tokens are handed out step by step either way."""
        t0 = time.perf_counter()
        step = 0
        while max_steps is None or step < max_steps:
            running = list(self.requests.running())
            if not running:
                break
            self._pause("decode")
            span = self.pool.span()
            live, tokens, remaining = [False] * span, [0] * span, [0] * span
            for r in running:
                live[r.slot], tokens[r.slot] = True, r.pending_token
                remaining[r.slot] = r.max_tokens - len(r.tokens)
            want = self.config.max_decode if max_steps is None else max_steps - step
            chosen = self.runner.decode(self.pool.cache, self.pool.view(range(span), live), tokens, remaining,
                                        self.tokenizer.eos_id, want)
            step += self._take(running, chosen)
        self._add_time("decode_ms", t0)

    def _take(self, running: list[Request], chosen: list[list[int]]) -> int:
        """Each running request's tokens of ``chosen[slot]`` in step order, until it finishes;
        returns the steps that produced a token."""
        rows = [(r, r.slot) for r in running]
        steps = len(chosen[rows[0][1]])
        for t in range(steps):
            rows = [(r, s) for r, s in rows if not r.done]
            if not rows:
                return t
            for r, s in rows:
                self.pool.advance(r.slot)
                self._emit(self.requests.update(r.id, chosen[s][t], self.tokenizer.eos_id))
            self._result.batch_sizes.append(len(rows))
        return steps

    def admit(self, new: list[Request], *, unlimited: bool = False) -> list[Request]:
        """Who starts this frame (queued first, then ``new``); the rest wait or are
        rejected, and rejections are reported in this frame's result."""
        free = len(self.requests.queue) + len(new) if unlimited else None
        starting, rejected = self.requests.admit(new, free_places=free)
        for r in rejected:
            self._result.finished.append(r)
            self._result.tokens.append(finish_event(
                r, f"the queue of waiting requests is full (queue_limit {self.requests.queue_limit})"))
        self._starting = starting
        return starting

    def _pause(self, work: str) -> None:
        if self.pause_point is not None:
            t0 = time.perf_counter()
            self.pause_point(work)
            self._add_time("paused_ms", t0)

    def _add_time(self, phase: str, t0: float, actions: Sequence[np.ndarray] = ()) -> None:
        """Add the time since ``t0`` to the frame result's ``phase``, and ``actions`` to its chunks
        (from either thread of ``parallel``)."""
        ms = (time.perf_counter() - t0) * 1e3
        with self._timing:
            setattr(self._result, phase, getattr(self._result, phase) + ms)
            self._result.actions += actions

    def _slot_moved(self, owner, src: int, dst: int) -> None:
        self.requests.moved(owner, dst)

    def _emit(self, event: TokenEvent) -> None:
        self._result.tokens.append(event)
        if event.done:
            self._result.finished.append(self.requests.remove(event.request_id))


def check_step(c: EngineConfig, max_cameras: int, observations: Sequence[Observation], questions: Sequence[Question],
               decode_steps: int | None, denoise_steps: int | None, robots: Sequence[str] | None,
               noise_seeds: Sequence[int] | None, observed: Collection[str]) -> None:
    """ValueError naming what is wrong with the arguments of one :meth:`Engine.step`, raised
    before the step changes anything (``observed``: the robots with an observation already)."""
    if decode_steps is not None and decode_steps < 0:
        raise ValueError(f"decode_steps must be >= 0, got {decode_steps}")
    if denoise_steps is not None and denoise_steps < 1:
        raise ValueError(f"denoise_steps must be >= 1, got {denoise_steps}")
    if len(observations) > c.max_observations_per_frame:
        raise ValueError(f"{len(observations)} observations in one frame, at most "
                         f"{c.max_observations_per_frame} (max_observations_per_frame)")
    for what, values in (("robots", robots), ("noise_seeds", noise_seeds)):
        if values is not None and len(values) != len(observations):
            raise ValueError(f"{len(values)} {what} for {len(observations)} observations")
    for obs in observations:
        obs.check_cameras(max_cameras, c.camera_names)
    names = set(robots) if robots is not None else {""} if observations else set()
    for q in questions:
        if tokens_beyond(q.max_tokens, c.max_decode):
            raise ValueError(f"question max_tokens must be in 1..{c.max_decode} (max_decode), got {q.max_tokens}")
        if q.robot not in names and q.robot not in observed:
            whose = f"robot {q.robot!r}" if q.robot else "the robot"
            raise ValueError(f"a question needs an observation to answer from; none from {whose} has arrived yet")


def usable_vocabulary(tokenizer_size: int, model_size: int) -> int:
    """How many of the model's token ids text may use: a tokenizer larger than the
    model's vocabulary is refused; a smaller one is accepted, and logits past its
    size are never chosen (said once in the log), so no frame fails on an id the
    tokenizer cannot decode."""
    if tokenizer_size > model_size:
        raise ValueError(f"tokenizer has {tokenizer_size} tokens, the model's vocabulary only {model_size}")
    if tokenizer_size < model_size:
        log.warning("tokenizer has %d tokens, the model's vocabulary %d: ids %d..%d are masked out of decoding",
                    tokenizer_size, model_size, tokenizer_size, model_size - 1)
    return tokenizer_size


def question_cut(limit: int) -> str:
    """What the answer to a question cut to ``limit`` tokens says of it (its last event's detail)."""
    return f"the question was cut to fit max_question_tokens ({limit})"


__all__ = ["Engine", "EngineConfig", "FrameResult", "FrameError", "Question", "SETTINGS", "FinishReason"]
