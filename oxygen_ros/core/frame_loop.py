"""The frame policy of a serving loop, without ROS: which frame runs next, and with what plan.

A :class:`FrameLoop` sits between the inputs (observations and questions as
they arrive) and one :class:`~oxygen_ros.core.engine.Engine`. It decides:

* the next job (:meth:`FrameLoop.next_job`): an observation frame from the
  newest observation (none older than ``max_observation_age``), the waiting
  questions, or a language-only frame when requests are still decoding and
  no observation came (``decode_when_idle``: at most once per control period,
  never when the next observation is expected before such a frame would end);
* the frame's plan (:meth:`FrameLoop.plan`): whether it starts a language
  request (every ``language_every_n_frames``-th observation frame) and its
  decode steps ``k`` under the deadline (:class:`~oxygen_ros.core.budget.DecodeBudget`);
* input fitting (:class:`~oxygen_ros.core.input_fit.InstructionFitter`,
  :func:`~oxygen_ros.core.input_fit.fit_question`) and the state check;
* failures in a row (:class:`~oxygen_ros.core.failures.FailureCount`) and the
  frame records the agent's report reads (:class:`~oxygen_ros.core.frame_records.FrameRecords`).

It is not locked by itself: its owner serialises the calls that touch state
shared with the inputs and the tick (the ROS node holds its lock around
them); :meth:`FrameLoop.fit_observation` and :meth:`FrameLoop.questions` use
only what the thread running the frames uses, and may run outside. Times
are ``time.monotonic_ns`` unless named ``*_ros_ns`` (the owner's clock, on
which observation stamps are compared).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from .budget import DecodeBudget
from .cadence import LanguageCadence
from .chunk_clock import NS_PER_S, period_ns
from .engine import Engine, FrameResult, Question
from .failures import FailureCount
from .frame_records import FrameRecords
from .input_fit import FittedInstruction, InstructionFitter, fit_question
from .observation import Observation, ObservationError
from .stats import Rolling
from .throttle import Throttle


@dataclass(frozen=True)
class LoopSettings:
    """The loop's settings, the one place each is set: changed only through
    :meth:`FrameLoop.configure`, which passes them on (``steps_per_frame`` to the
    budget's ``k_max``, ``max_consecutive_failures`` to the failure count,
    ``language_every_n_frames`` to the cadence)."""

    control_rate_hz: float = 50.0
    steps_per_frame: int = 5  # k_max of the budget
    language_every_n_frames: int = 1  # 0: only on demand (questions)
    max_observation_age: float = 1.0  # s; <= 0: no age check
    frame_deadline_ms: float = 0.0  # 0: half the time a chunk covers
    decode_budget: bool = True  # False: every frame decodes steps_per_frame steps
    decode_when_idle: bool = True
    max_consecutive_failures: int = 3
    denoise_steps: int | None = None  # S; None: the engine's (the checkpoint's unless configured)


@dataclass
class Arrival:
    """An observation as it arrived: ``payload`` is the owner's (its converted Observation), not looked into."""

    payload: Any
    seq: int
    stamp_ros_ns: int  # capture stamp (0: unset)
    received_ros_ns: int
    received_ns: int


@dataclass
class Job:
    observation: Arrival | None = None
    questions: list = field(default_factory=list)  # (client_id, text, max_tokens or None)
    cancels: list = field(default_factory=list)  # client ids whose requests end now


@dataclass(frozen=True)
class FramePlan:
    start_language: bool
    decode_steps: int
    denoise_steps: int | None


class FrameLoop:
    """See the module doc. ``log``: a :class:`logging.Logger`-like object (warning, error, info)."""

    def __init__(self, engine: Engine, settings: LoopSettings, max_token_len: int, *, horizon: int,
                 state_dim: int | None = None, log: Any = None):
        self.engine, self.horizon, self.state_dim = engine, horizon, state_dim
        self.log = log if log is not None else logging.getLogger(__name__)
        self._throttle = Throttle(5.0)  # repeated warnings: one every 5 s per kind
        self._failure_throttle = Throttle(2.0)
        self.settings = settings
        self.budget = DecodeBudget(settings.steps_per_frame, self.deadline_ms())
        self.failures = FailureCount(settings.max_consecutive_failures)
        self.cadence = LanguageCadence(settings.language_every_n_frames)
        self.records = FrameRecords()
        self.fitter = InstructionFitter(engine.tokenizer, max_token_len)
        self.counters: collections.Counter = collections.Counter()
        self.last_k = settings.steps_per_frame
        self.k_history: collections.deque = collections.deque(maxlen=1000)  # (frame_id, k, observation?)
        self.newest_stamp_ros_ns: int | None = None
        self.obs_interval_ms, self.language_frame_ms = Rolling(50), Rolling(50)
        self._pending: Arrival | None = None
        self._questions: collections.deque = collections.deque()
        self._cancels: list[str] = []
        self._last_arrival_ns: int | None = None
        self._last_frame_end_ns = 0

    # ------------------------------------------------------------------ settings
    @property
    def period_ns(self) -> int:
        """The control period (``control_rate_hz``)."""
        return period_ns(self.settings.control_rate_hz)

    def deadline_ms(self) -> float:
        """The frame deadline of the language budget (``frame_deadline_ms``, or half a chunk)."""
        s = self.settings
        return s.frame_deadline_ms if s.frame_deadline_ms > 0 else self.horizon / s.control_rate_hz * 1e3 / 2

    def configure(self, **changes: Any) -> None:
        """Apply changed settings (checked by the caller); they take effect from the next frame."""
        self.settings = dataclasses.replace(self.settings, **changes)
        self.budget.k_max = self.settings.steps_per_frame
        self.budget.deadline_ms = self.deadline_ms()
        self.failures.limit = self.settings.max_consecutive_failures
        self.cadence.every_n = self.settings.language_every_n_frames

    # ------------------------------------------------------------------ inputs
    def observation_arrived(self, arrival: Arrival) -> None:
        self.counters["observations_received"] += 1
        if self._last_arrival_ns is not None:
            self.obs_interval_ms.add((arrival.received_ns - self._last_arrival_ns) / 1e6)
        self._last_arrival_ns = arrival.received_ns
        if self._pending is not None:
            self.counters["observations_superseded"] += 1
        self._pending = arrival
        stamp = arrival.stamp_ros_ns
        if stamp > 0 and (self.newest_stamp_ros_ns is None or stamp > self.newest_stamp_ros_ns):
            self.newest_stamp_ros_ns = stamp

    def question_arrived(self, client_id: str, text: str, max_tokens: int | None = None) -> None:
        self.counters["questions_received"] += 1
        self._questions.append((client_id, text, max_tokens))

    def cancel(self, client_id: str) -> bool:
        """Cancel ``client_id``'s question: True when it ended here (it was still waiting: the
        owner announces its ``cancelled`` end), else its request ends in the engine at the
        next job (:attr:`Job.cancels`)."""
        waiting = [q for q in self._questions if q[0] == client_id]
        for q in waiting:
            self._questions.remove(q)
        if not waiting:
            self._cancels.append(client_id)
        self.counters["questions_cancelled"] += 1
        return bool(waiting)

    def has_work(self) -> bool:
        """Is there work for a frame: an observation, questions or cancels waiting, or requests decoding."""
        return self._pending is not None or bool(self._questions or self._cancels) or self.engine_has_work()

    def engine_has_work(self) -> bool:
        """Language requests running or queued in the engine."""
        return bool(self.engine.requests.active or self.engine.requests.queue)

    def wants_language_frame(self) -> bool:
        """Questions wait or requests decode (a tick wakes the worker for them)."""
        return bool(self._questions) or self.engine_has_work()

    def take_questions(self) -> list:
        """The questions not yet taken by a job (shutdown cancels them)."""
        out = list(self._questions)
        self._questions.clear()
        return out

    def put_back(self, job: Job) -> None:
        """A job that will not run: its questions and cancels wait again (at the head)."""
        self._questions.extendleft(reversed(job.questions))
        self._cancels[:0] = job.cancels

    # ------------------------------------------------------------------ the next job
    def next_job(self, now_ros_ns: int, now_ns: int) -> Job | None:
        """What to run now, if anything (see the module doc)."""
        job = Job()
        if self._pending is not None:
            arrival, self._pending = self._pending, None
            if self._fresh(arrival, now_ros_ns):
                job.observation = arrival
        while self._questions:
            job.questions.append(self._questions.popleft())
        job.cancels, self._cancels = self._cancels, []
        if job.observation is not None or job.questions or job.cancels:
            return job
        if (self.settings.decode_when_idle and self.engine_has_work()
                and now_ns - self._last_frame_end_ns >= self.period_ns and not self.observation_due_soon(now_ns)):
            return job  # a language-only frame
        return None

    def _fresh(self, arrival: Arrival, now_ros_ns: int) -> bool:
        stamp, max_age = arrival.stamp_ros_ns, self.settings.max_observation_age
        # its age now, when a frame would start from it (it may have waited for a long frame)
        age_s = (max(arrival.received_ros_ns, now_ros_ns) - stamp) / NS_PER_S
        if max_age > 0 and stamp > 0 and age_s > max_age:
            self.counters["observations_stale"] += 1
            self._warn("stale", f"observation {arrival.seq} is {age_s:.3f} s old (max_observation_age "
                       f"{max_age:g} s): not used")
            return False
        return True

    def observation_due_soon(self, now_ns: int) -> bool:
        """Would a language-only frame started now still run when the next observation
        is expected (from the observations' recent spacing)? Actions come first."""
        if self._last_arrival_ns is None or len(self.obs_interval_ms) < 5:
            return False
        interval_ns = self.obs_interval_ms.percentile(50) * 1e6
        expected = self._last_arrival_ns + interval_ns
        language_ns = (self.language_frame_ms.mean() if len(self.language_frame_ms) else 0.0) * 1e6
        return expected - 1.5 * language_ns <= now_ns < expected + interval_ns / 2

    # ------------------------------------------------------------------ inputs for the model
    def fit_observation(self, obs: Observation, max_cameras: int, seq: int) -> Observation:
        """The observation the model gets: cameras and state checked (ValueError when it
        must not reach the model), the instruction cleaned and cut to the prompt."""
        obs.check_cameras(max_cameras)
        if obs.state is not None and self.state_dim is not None and obs.state.shape[0] > self.state_dim:
            raise ObservationError("state", f"has {obs.state.shape[0]} values, the checkpoint's state "
                                   f"statistics cover {self.state_dim}")
        fitted = self.fitter.fit(obs)
        self._report_fit(fitted, len(obs.instruction), seq)
        return fitted.observation

    def _report_fit(self, fitted: FittedInstruction, original: int, seq: int) -> None:
        max_len = self.fitter.max_token_len
        if fitted.overflow:
            n_state = 0 if fitted.observation.state is None else fitted.observation.state.shape[0]
            self._warn("overflow", f"the prompt does not fit max_token_len={max_len} tokens even without an "
                       f"instruction (state of {n_state} values): it is cut", level="error")
        if fitted.truncated:
            self.counters["instructions_truncated"] += 1
            self._warn("truncated", f"observation {seq}: instruction of {original} characters cut to "
                       f"{fitted.kept} so that the prompt fits max_token_len={max_len} tokens")

    def questions(self, job: Job, has_observation: bool) -> tuple[list[Question], list[str]]:
        """The job's questions the engine can take, and the clients refused (no text, or
        no observation to answer from yet)."""
        limit = self.engine.config.max_question_tokens
        accepted, refused = [], []
        for client, text, max_tokens in job.questions:
            fitted = fit_question(self.engine.tokenizer, text, limit)
            if not fitted.text:
                self.counters["questions_rejected_empty"] += 1
                self._warn("empty", f"question from {client!r} refused: no text")
                refused.append(client)
                continue
            if fitted.truncated:
                self.counters["questions_truncated"] += 1
                self._warn("question_cut", f"question from {client!r} ({len(text)} characters, "
                           f"{fitted.tokens}+ tokens) cut to {limit} tokens")
            accepted.append(Question(text=fitted.text, client_id=client, max_tokens=max_tokens))
        if accepted and not has_observation and self.engine.last_observation is None:
            refused += [q.client_id for q in accepted]
            self.counters["questions_rejected_no_observation"] += len(accepted)
            self._warn("no_observation", "question(s) refused: no observation has arrived yet")
            accepted = []
        return accepted, refused

    # ------------------------------------------------------------------ plan and outcome
    def plan(self, has_observation: bool) -> FramePlan:
        """The next frame's plan: start a language request? how many decode steps?"""
        s = self.settings
        start_language = self.cadence.next(has_observation)
        k = self.budget.next_k() if s.decode_budget else self.budget.k_max
        if not has_observation and self.budget.k_max > 0:
            # a language-only frame has no action to protect (it only runs when the
            # next observation is not due before it ends): at least one step, so
            # text never starves once the budget has shrunk to zero
            k = max(1, k)
        self.last_k = k
        return FramePlan(start_language, k, s.denoise_steps)

    def frame_ran(self, plan: FramePlan, result: FrameResult, has_observation: bool) -> None:
        """Feed a finished frame's times to the budget and the statistics."""
        steps = len(result.batch_sizes)
        if has_observation:
            self.budget.observe(result.prefill_ms + result.denoise_ms, result.decode_ms, steps)
        else:
            if self.budget.action_ms is not None:  # language only: the decode step estimate
                self.budget.observe(self.budget.action_ms, result.decode_ms, steps)
            self.language_frame_ms.add(result.total_ms)
            self.counters["language_frames"] += 1
        self.k_history.append((result.frame_id, plan.decode_steps, has_observation))

    def _warn(self, key: str, text: str, level: str = "warning") -> None:
        """Log ``text`` unless a message of this ``key`` went out less than 5 s ago."""
        if self._throttle(key) is not None:
            getattr(self.log, level)(text)

    def frame_ended(self, now_ns: int) -> None:
        self._last_frame_end_ns = now_ns

    # ------------------------------------------------------------------ failures
    def frame_failed(self, reason: str) -> bool:
        """Count a failed frame; True when the action output stops now (after
        ``max_consecutive_failures`` in a row): the owner drops the current chunk."""
        stop = self.failures.failed(reason)
        n = self.failures.in_a_row
        if stop:
            self.log.error(f"{n} frames failed in a row (last: {reason}): action output stopped until a "
                           "frame succeeds")
        elif self._failure_throttle("failed") is not None:
            self.log.error(f"frame failed ({n} in a row): {reason}")
        return stop

    def frame_succeeded(self) -> None:
        n, was_stopped = self.failures.succeeded()
        if was_stopped:
            self.log.info(f"a frame succeeded after {n} failures: action output resumed")

    # ------------------------------------------------------------------ figures
    def figures(self, now_ros_ns: int) -> dict:
        """The loop's figures for diagnostics (the last frame's k, the budget, failures, the
        newest observation's age)."""
        newest, f = self.newest_stamp_ros_ns, self.failures
        return {
            "k": self.last_k,  # decode steps granted to the last frame by the language budget
            "k_max": self.budget.k_max,  # steps_per_frame
            "frame_deadline_ms": self.budget.deadline_ms,
            "observation_age_ms": float("nan") if newest is None else (now_ros_ns - newest) / 1e6,
            "faulted": f.stopped,
            "consecutive_failures": f.in_a_row,
            "last_failure": f.last,
        }
