"""The frame policy of a serving loop, without ROS: which frame runs next, and with what plan.

A :class:`FrameLoop` sits between the inputs (observations and questions as
they arrive) and one :class:`~oxygen_ros.core.engine.Engine`. It decides:

* the next job (:meth:`FrameLoop.next_job`): an observation frame from the
  newest observation of every robot that has one (none older than
  ``max_observation_age``; at most the engine's ``max_observations_per_frame``,
  the longest unserved robots first), the waiting questions, or a
  language-only frame when requests are still decoding and no observation
  came (``decode_when_idle``: at most once per control period, never when a
  robot's next observation is expected before such a frame would end);
* the frame's plan (:meth:`FrameLoop.plan`): whether it starts a language
  request (every ``language_every_n_frames``-th observation frame) and its
  decode steps ``k`` under the deadline (:class:`~oxygen_ros.core.budget.DecodeBudget`);
* input fitting (:class:`~oxygen_ros.core.input_fit.InstructionFitter`), the
  state check, and which questions a frame takes
  (:class:`~oxygen_ros.core.question_intake.QuestionIntake`);
* failures in a row (:class:`~oxygen_ros.core.failures.FailureCount`) and the
  frame records the agent's report reads (:class:`~oxygen_ros.core.frame_records.FrameRecords`),
  both per robot.

Robots: ``robots`` names them (default: one robot ``""``). Each keeps its own
inputs (:class:`~oxygen_ros.core.robot_inputs.RobotInputs`): a stale camera or a
flood of questions of one robot never takes another's observation's place, and
a robot's action noise is keyed by the robot and its own frame count.

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
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .budget import DecodeBudget, frame_deadline_ms
from .cadence import LanguageCadence
from .chunk_clock import NS_PER_S, period_ns
from .engine import Engine, FrameResult, Question
from .input_fit import InstructionFitter, fit_messages, oversized_images
from .normalization import STATE_WITHOUT_STATISTICS, statistics_without_state
from .observation import Observation, ObservationError
from .question_intake import QuestionIntake
from .requests import TokenEvent
from .robot_inputs import Arrival, RobotInputs, WaitingQuestion, stalest_first
from .stats import Rolling
from .throttle import Throttle

__all__ = ["Arrival", "FrameLoop", "FramePlan", "Job", "LoopSettings", "WaitingQuestion"]


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
class Job:
    observations: list = field(default_factory=list)  # Arrival, one per robot at most
    questions: list = field(default_factory=list)  # WaitingQuestion
    cancels: list = field(default_factory=list)  # (robot, client id): requests that end now

    @property
    def observation(self) -> Arrival | None:
        """The first observation (the only one with one robot), or None."""
        return self.observations[0] if self.observations else None


@dataclass(frozen=True)
class FramePlan:
    start_language: bool
    decode_steps: int
    denoise_steps: int | None


class FrameLoop:
    """See the module doc. ``log``: a :class:`logging.Logger`-like object (warning, error, info);
    ``clock``: the seconds its repeated warnings are spaced by."""

    def __init__(self, engine: Engine, settings: LoopSettings, max_token_len: int, *, horizon: int,
                 state_dim: int | None = None, log: Any = None, robots: Sequence[str] = ("",), seed: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.horizon, self.state_dim, self.seed = engine, horizon, state_dim, seed
        self.log = log if log is not None else logging.getLogger(__name__)
        self._throttle = Throttle(5.0, clock)  # repeated warnings: one every 5 s per kind
        self._failure_throttle = Throttle(2.0, clock)
        self.settings = settings
        self.budget = DecodeBudget(settings.steps_per_frame, self.deadline_ms())
        self.cadence = LanguageCadence(settings.language_every_n_frames)
        self.fitter = InstructionFitter(engine.tokenizer, max_token_len)
        self._image_size_noted = self._short_state_noted = self._no_state_noted = False
        self._description_owed = False  # a description was due while no slot was free
        self.counters: collections.Counter = collections.Counter()  # the whole loop's (every robot's)
        self.last_k = settings.steps_per_frame
        self.k_history: collections.deque = collections.deque(maxlen=1000)  # (frame_id, k, observation?)
        self.language_frame_ms = Rolling(50)
        if not robots or len(set(robots)) != len(robots):
            raise ValueError(f"robots must be distinct names, at least one, got {list(robots)}")
        self.robots = {name: RobotInputs(name, settings.max_consecutive_failures, total=self.counters)
                       for name in robots}
        self._last_frame_end_ns = 0

    # ------------------------------------------------------------------ robots
    def robot(self, name: str = "") -> RobotInputs:
        """The inputs of robot ``name`` (ValueError naming the known robots)."""
        try:
            return self.robots[name]
        except KeyError:
            raise ValueError(f"no robot {name!r} (robots: {list(self.robots)})") from None

    @property
    def first(self) -> RobotInputs:
        """The first robot (the only one, unless ``robots`` names several)."""
        return next(iter(self.robots.values()))

    # ------------------------------------------------------------------ settings
    @property
    def period_ns(self) -> int:
        """The control period (``control_rate_hz``)."""
        return period_ns(self.settings.control_rate_hz)

    def deadline_ms(self) -> float:
        """The frame deadline of the language budget (``frame_deadline_ms``, or half a chunk)."""
        return frame_deadline_ms(self.horizon, self.settings.control_rate_hz, self.settings.frame_deadline_ms)

    def configure(self, **changes: Any) -> None:
        """Apply changed settings (checked by the caller); they take effect from the next frame."""
        self.settings = dataclasses.replace(self.settings, **changes)
        self.budget.k_max = self.settings.steps_per_frame
        self.budget.deadline_ms = self.deadline_ms()
        for robot in self.robots.values():
            robot.failures.limit = self.settings.max_consecutive_failures
        self.cadence.every_n = self.settings.language_every_n_frames

    # ------------------------------------------------------------------ inputs
    def observation_arrived(self, arrival: Arrival) -> None:
        robot = self.robot(arrival.robot)
        robot.count["observations_received"] += 1
        if robot.arrived(arrival):
            robot.count["observations_superseded"] += 1

    def question_arrived(self, client_id: str, text: str, max_tokens: int | None = None, robot: str = "") -> None:
        r = self.robot(robot)
        r.count["questions_received"] += 1
        r.questions.append(WaitingQuestion(client_id, text, max_tokens, robot))

    def cancel(self, client_id: str, robot: str = "") -> bool:
        """Cancel ``client_id``'s question (of ``robot``): True when it ended here (it was still
        waiting: the owner announces its ``cancelled`` end), else its request ends in the
        engine at the next job (:attr:`Job.cancels`)."""
        r = self.robot(robot)
        waiting = [q for q in r.questions if q.client_id == client_id]
        for q in waiting:
            r.questions.remove(q)
        if not waiting:
            r.cancels.append(client_id)
        r.count["questions_cancelled"] += 1
        return bool(waiting)

    def has_work(self) -> bool:
        """Is there work for a frame: an observation, questions or cancels waiting, or requests decoding."""
        return any(r.pending is not None or r.questions or r.cancels for r in self.robots.values()) \
            or self.engine_has_work()

    def engine_has_work(self) -> bool:
        """Language requests running or queued in the engine."""
        return bool(self.engine.requests.active or self.engine.requests.queue)

    def wants_language_frame(self) -> bool:
        """Questions wait or requests decode (a tick wakes the worker for them)."""
        return any(r.questions for r in self.robots.values()) or self.engine_has_work()

    def questions_waiting(self) -> int:
        """Questions not yet taken by a job, of every robot (a paused node keeps them)."""
        return sum(len(r.questions) for r in self.robots.values())

    def take_questions(self) -> list[WaitingQuestion]:
        """The questions not yet taken by a job, of every robot (shutdown cancels them)."""
        out = []
        for r in self.robots.values():
            out += r.questions
            r.questions.clear()
        return out

    def take_cancels(self) -> list[tuple[str, str]]:
        """The cancels not yet taken by a job, of every robot, as (robot, client id) pairs."""
        out = []
        for robot in self.robots.values():
            out += [(robot.name, client) for client in robot.cancels]
            robot.cancels = []
        return out

    def end_requests(self, cancels: Sequence[tuple[str, str]]) -> list[TokenEvent]:
        """End the engine's requests of ``cancels`` ((robot, client id) pairs) now: their
        ``cancelled`` events. Only while no frame runs (a job's start; the owner while
        its worker is idle or stopped)."""
        events: list[TokenEvent] = []
        for robot in dict.fromkeys(r for r, _ in cancels):
            events += self.engine.requests.cancel_clients([c for r, c in cancels if r == robot], robot)
        return events

    def put_back(self, job: Job) -> None:
        """A job that will not run: its questions and cancels wait again (at the head)."""
        for q in reversed(job.questions):
            self.robot(q.robot).questions.appendleft(q)
        for robot, client in reversed(job.cancels):
            self.robot(robot).cancels.insert(0, client)

    # ------------------------------------------------------------------ the next job
    def next_job(self, now_ros_ns: int, now_ns: int) -> Job | None:
        """What to run now, if anything (see the module doc)."""
        job = Job()
        limit = self.engine.config.max_observations_per_frame
        for robot in stalest_first(self.robots.values(), len(self.robots)):
            if len(job.observations) >= limit:
                break  # the others keep their newest observation for the next frame
            arrival = robot.take(now_ns, self.seed)
            if self._fresh(arrival, now_ros_ns, robot):
                job.observations.append(arrival)
        for robot in self.robots.values():
            job.questions += robot.questions
            robot.questions.clear()
        job.cancels = self.take_cancels()
        if job.observations or job.questions or job.cancels:
            return job
        if (self.settings.decode_when_idle and self.engine_has_work()
                and now_ns - self._last_frame_end_ns >= self.period_ns and not self.observation_due_soon(now_ns)):
            return job  # a language-only frame
        return None

    def _fresh(self, arrival: Arrival, now_ros_ns: int, robot: RobotInputs) -> bool:
        stamp, max_age = arrival.stamp_ros_ns, self.settings.max_observation_age
        # its age now, when a frame would start from it (it may have waited for a long frame)
        age_s = (max(arrival.received_ros_ns, now_ros_ns) - stamp) / NS_PER_S
        if max_age > 0 and stamp > 0 and age_s > max_age:
            robot.count["observations_stale"] += 1
            whose = f"robot {robot.name}: " if robot.name else ""
            on_arrival = (arrival.received_ros_ns - stamp) / NS_PER_S
            why = (f"; it was {on_arrival:.3f} s old when it arrived (by its header stamp): is the sender's clock "
                   "behind this node's, or its network slow?" if on_arrival > max_age else "")
            self._warn(f"stale{robot.name}", f"{whose}observation {arrival.seq} is {age_s:.3f} s old "
                       f"(max_observation_age {max_age:g} s): not used{why}")
            return False
        return True

    def observation_due_soon(self, now_ns: int) -> bool:
        """Would a language-only frame started now still run when a robot's next observation
        is expected (from its observations' recent spacing)? Actions come first."""
        language_ms = self.language_frame_ms.mean() if len(self.language_frame_ms) else 0.0
        return any(r.observation_due_soon(now_ns, language_ms) for r in self.robots.values())

    # ------------------------------------------------------------------ inputs for the model
    def fit_observation(self, obs: Observation, seq: int) -> Observation:
        """The observation the model gets: cameras and state checked (ValueError when it
        must not reach the model), the instruction cleaned and cut to the prompt. The
        cameras are checked as the engine checks them (count and names), so that an
        observation it would refuse fails here, alone, not the frame of every robot."""
        obs.check_cameras(self.engine.max_cameras, self.engine.config.camera_names)
        if obs.state is not None and obs.state.size and statistics_without_state(self.engine.normalizer):
            raise ObservationError("state", STATE_WITHOUT_STATISTICS)
        n = None if obs.state is None or self.state_dim is None else obs.state.shape[0]
        if n is not None and n > self.state_dim:
            raise ObservationError("state", f"has {n} values, the checkpoint's state statistics cover "
                                   f"{self.state_dim}: pick the model's joints, in its order, with the camera "
                                   "node's state_joint_names")
        if n is not None and n < self.state_dim and not self._short_state_noted:
            self._short_state_noted = True  # said once: statistics padded past the robot's joints are legitimate
            self.log.warning(f"observation {seq}: the state has {n} value(s), the checkpoint's state statistics "
                             f"cover {self.state_dim}: the model gets it zero-padded. A joint missing from the "
                             "camera node's state_joint_names (or its state messages) makes every action wrong "
                             "(said once)")
        if self.state_dim and (obs.state is None or obs.state.size == 0) and not self._no_state_noted:
            self._no_state_noted = True  # said once
            self.log.warning(f"observation {seq}: no robot state, and the checkpoint was trained with one "
                             f"({self.state_dim} values, its statistics): the model gets zeros in its place and "
                             "its actions and text are likely wrong. Set the camera node's state_topic (and "
                             "state_joint_names) to the robot's joint states (said once)")
        if not self._image_size_noted and (note := oversized_images(obs, self.engine.model.config.vision.image_size)):
            self._image_size_noted = True  # said once
            self.log.info(note)
        fitted = self.fitter.fit(obs, self.engine.prompt_state(obs.state))
        self.counters["instructions_truncated"] += fitted.truncated
        for key, level, text in fit_messages(fitted, len(obs.instruction), seq, self.fitter.max_token_len):
            self._warn(key, text, level=level)
        return fitted.observation

    def questions(self, job: Job, observed: Iterable[str], now_ros_ns: int = 0
                  ) -> tuple[list[Question], list[WaitingQuestion]]:
        """The job's questions the engine can take, and those refused (:mod:`.question_intake`:
        no text, more tokens than ``max_decode``, nothing to answer from, or only an observation
        older than ``max_observation_age`` at ``now_ros_ns``). ``observed`` names the robots
        with an observation in this frame."""
        intake = QuestionIntake(self.engine, self.robot, self.settings.max_observation_age, self._warn)
        return intake.take(job.questions, observed, now_ros_ns)

    # ------------------------------------------------------------------ plan and outcome
    def plan(self, has_observation: bool) -> FramePlan:
        """The next frame's plan: start a language request? how many decode steps?

        A periodic description starts only when a slot is free and no request waits for one:
        descriptions due every frame queued behind each other faster than they decoded, filled
        the queue (so that a client's question was refused, 'queue full') and were decoded
        seconds after their image. One due with no slot free is skipped (counted:
        ``descriptions_skipped``), and the next frame with a slot free starts it."""
        s = self.settings
        due = self.cadence.next(has_observation)
        e = self.engine
        room = not e.queued_requests and e.active_requests < e.config.max_active
        self.counters["descriptions_skipped"] += due and not room
        start_language = (due or (has_observation and self._description_owed)) and room
        self._description_owed = (due or self._description_owed) and not start_language
        k = self.budget.next_k() if s.decode_budget else self.budget.k_max
        if not has_observation:
            # a language-only frame has no action to protect (it only runs when the
            # next observation is not due before it ends): at least one step, so
            # text never starves once the budget has shrunk to zero, or with k_max 0
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
    def frame_failed(self, reason: str, robot: str = "") -> bool:
        """Count a failed frame of ``robot``; True when its action output stops now (after
        ``max_consecutive_failures`` in a row): the owner drops its current chunk."""
        failures = self.robot(robot).failures
        stop = failures.failed(reason)
        n, whose = failures.in_a_row, f"robot {robot}: " if robot else ""
        if stop:
            self.log.error(f"{whose}{n} frames failed in a row (last: {reason}): action output stopped until "
                           "a frame succeeds")
        elif self._failure_throttle(f"failed{robot}") is not None:
            self.log.error(f"{whose}frame failed ({n} in a row): {reason}")
        return stop

    def frame_succeeded(self, robot: str = "") -> None:
        n, was_stopped = self.robot(robot).failures.succeeded()
        if was_stopped:
            whose = f"robot {robot}: " if robot else ""
            self.log.info(f"{whose}a frame succeeded after {n} failures: action output resumed")

    # ------------------------------------------------------------------ figures
    def figures(self, now_ros_ns: int, robot: str | None = None) -> dict:
        """The loop's figures for diagnostics (the last frame's k, the budget, and ``robot``'s
        failures and newest observation's age; None: the first robot's)."""
        r = self.first if robot is None else self.robot(robot)
        f = r.failures
        return {
            "k": self.last_k,  # decode steps granted to the last frame by the language budget
            "k_max": self.budget.k_max,  # steps_per_frame
            "frame_deadline_ms": self.budget.deadline_ms,
            "observation_age_ms": r.age_ms(now_ros_ns),
            "faulted": f.stopped,
            "consecutive_failures": f.in_a_row,
            "last_failure": f.last,
        }
