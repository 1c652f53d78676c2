"""The inference node (``oxygen_inference``): one model, one engine, a control-loop timer.

Inputs
    ``observation_topic`` (``oxygen_ros/Observation``, from the camera node) and
    ``question_topic`` (``oxygen_ros/Question``: a client id and a question).
Outputs
    ``actions_topic`` (``oxygen_ros/ActionChunk``), ``text_topic``
    (``oxygen_ros/TextToken``), ``/diagnostics`` (``diagnostic_msgs/DiagnosticArray``,
    once a second) and, when ``joint_names`` is set, ``trajectory_topic``
    (``trajectory_msgs/JointTrajectory``).

How it runs
    The model is loaded and warmed up (``warmup_frames`` frames on a black
    image) in the constructor, never in a control tick. A timer at
    ``control_rate_hz`` drives the output: every tick publishes an
    ``ActionChunk`` with the newest chunk's actions from the one due at this
    tick onward (see :mod:`oxygen_ros.core.chunk_clock`), so a consumer taking
    the first action of each message gets one action per control period. A
    tick never waits for the model: frames run on one worker thread, the only
    thread that touches the engine. The worker starts a frame as soon as it is
    idle and there is something to do - a newer observation (fresher than
    ``max_observation_age``), waiting questions, or (``decode_when_idle``)
    language requests still decoding while no new observation comes, at most
    once per control period and not when the next observation is expected
    before such a frame would end (actions first). Text tokens are published as each frame returns
    them. Ticks are the only place actions are published, so the stream stays
    steady whatever the frame latency.

The offset / stamp choice
    ``offset`` = index of the action due at the tick's *scheduled* time,
    counted from the chunk's origin; ``header.stamp`` = the time at which
    ``actions[0]`` of the message is due (``origin + offset * period``, at most
    one period before the tick). With ``chunk_origin: observation`` (default)
    the origin is the observation's capture stamp, so the actions that fell
    into the inference latency are skipped (delay compensation); a stamp not
    on this node's clock (a replayed bag, an unset stamp) falls back to
    ``frame_end``: the chunk is anchored at the first tick after the frame
    finished, which publishes offset 0.

Parameters
    See :data:`PARAMETERS` (name, default, description, run-time changeable)
    and ``config/agent.yaml``. They are validated at start (a
    :class:`ParameterError` naming the parameter) and, for the run-time
    changeable ones, in the parameter callback (the refusal reason names the
    parameter); the others are read-only. Overrides naming no parameter of
    this node (a typo in the YAML) are logged as a warning.

Reliability (nothing that arrives stops the control loop)
    * Inputs: an Observation that does not convert (bad image, names and
      images disagreeing, state NaN/inf, longer than MAX_STATE_DIM or than the
      checkpoint's state statistics) is refused with its reason and never
      reaches the model; an instruction whose prompt would exceed the model's
      ``max_token_len`` is cut so that it fits (the state is kept) with a
      warning; control characters are removed. A question without text is
      answered ``rejected``; a longer one than the engine's
      ``max_question_tokens`` is cut with a warning.
    * Staleness: a frame never starts from an observation older than
      ``max_observation_age``; when the chunk runs out, a tick publishes
      nothing (``hold_action: none``) or the chunk's last row as a hold
      message (``last``: offset = H, one row); underruns are counted.
    * Overload: each frame's decode steps come from a
      :class:`~oxygen_ros.core.budget.DecodeBudget` against
      ``frame_deadline_ms`` (default: half the time a chunk covers), so
      language shrinks (to zero steps) before an action is late.
    * Faults: an exception in a frame is logged with its cause and the next
      frame runs; chunks with non-finite values are dropped; after
      ``max_consecutive_failures`` failed frames in a row the current chunk is
      dropped and no ActionChunk is published (diagnostics: ERROR) until a frame
      succeeds. A model that does not load stops the start with its cause.

Shutdown
    :meth:`InferenceNode.shutdown` (also run by ``destroy_node``) stops the
    timers and the worker (the frame in flight completes), then finishes every
    running or queued request and publishes its ``cancelled`` token.
"""

# No `from __future__ import annotations` here: rclpy finds the TimerInfo
# argument of a timer callback by comparing the annotation with the class.

import collections
import dataclasses
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, TextToken
from oxygen_ros.msg import Observation as ObservationMsg
from oxygen_ros.msg import Question as QuestionMsg

from ..core.chunk_clock import (
    NS_PER_S,
    Chunk,
    ChunkClock,
    Due,
    chunk_origin,
    period_ns,
)
from ..core.requests import TokenEvent
from ..core.stats import Rolling, WindowRate, action_frequency, percentile
from ..core.tick_guard import TickGuard
from . import conversions
from .camera_node import (
    ParameterError,  # one error type for every node: names the parameter
)
from .camera_node import clean_instruction as clean_text
from .inference_parameters import (
    CHARS_PER_TOKEN,
    IMPLICIT_PARAMETERS,
    PARAMETERS,
    RUNTIME_PARAMETERS,
    SPECS,
    check_parameter,
)
from .process import init_control_process, report_leftover_threads, settle_garbage_collector

try:  # rclpy >= Iron passes the timer's scheduled time to callbacks that ask for it
    from rclpy.timer import TimerInfo
except ImportError:  # pragma: no cover - Humble
    TimerInfo = None

NODE_NAME = "oxygen_inference"


# --------------------------------------------------------------------------
# Model loading
# --------------------------------------------------------------------------


def load_model(p: dict):
    """The LoadedCheckpoint the parameters ask for (errors name the parameter)."""
    import pathlib

    import torch

    from ..core.checkpoints import (
        DEFAULT_MODEL_DIR,
        CheckpointError,
        LoadedCheckpoint,
        load_checkpoint,
    )
    from ..core.model.config import preset
    from ..core.model.vla import build_model
    from ..core.normalization import load_norm_stats
    from ..core.tokenizer import Tokenizer

    for name in ("model_path", "tokenizer_path", "norm_stats_path"):
        if p[name] and not pathlib.Path(p[name]).exists():
            raise ParameterError(name, f"{p[name]} does not exist")
    if p["device"].startswith("cuda") and not torch.cuda.is_available():
        raise ParameterError("device", f"{p['device']} requested but torch sees no CUDA device")
    tokenizer_path = p["tokenizer_path"] or None
    stats_path = p["norm_stats_path"] or None
    try:
        if p["model_path"]:
            return load_checkpoint(p["model_path"], device=p["device"], dtype=p["dtype"],
                                   tokenizer_path=tokenizer_path, norm_stats_path=stats_path)
        if (pathlib.Path(DEFAULT_MODEL_DIR) / "config.json").is_file():
            return load_checkpoint(DEFAULT_MODEL_DIR, device=p["device"], dtype=p["dtype"],
                                   tokenizer_path=tokenizer_path, norm_stats_path=stats_path)
    except CheckpointError as exc:
        raise ParameterError("model_path", str(exc)) from exc
    config = preset(p["preset"])
    model = build_model(config, seed=p["seed"], device=p["device"], dtype=p["dtype"])
    tokenizer = Tokenizer(tokenizer_path) if tokenizer_path else Tokenizer.default()
    normalizer = load_norm_stats(stats_path) if stats_path else None
    return LoadedCheckpoint(model.eval(), config, tokenizer, normalizer, "random",
                            f"preset {p['preset']} (random weights, seed {p['seed']})")


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------


@dataclass
class FrameRecord:
    """Timings of one observation frame, for diagnostics and the agent's report.
    ``*_ns`` are on ``time.monotonic_ns``."""

    frame_id: int
    observation_seq: int
    received_ns: int  # the observation callback
    dequeued_ns: int  # the worker took it (after any frame that was running)
    started_ns: int  # Engine.step called (after the message -> Observation conversion)
    finished_ns: int
    engine_ms: float
    paused_ms: float = 0.0  # of engine_ms, spent letting control ticks run (``yield_to_ticks``)
    first_published_ns: Optional[int] = None  # first ActionChunk carrying this frame


@dataclass
class _Job:
    observation: Optional[tuple] = None  # (msg, received ROS ns, received monotonic ns)
    questions: list = field(default_factory=list)  # (client_id, text)


_RELIABLE = dict(reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                 history=HistoryPolicy.KEEP_LAST)


class ModelLoadError(RuntimeError):
    """The model could not be loaded for a reason other than a bad parameter."""


class InferenceNode(Node):
    """See the module doc. ``kwargs`` go to ``rclpy.node.Node`` (context,
    parameter_overrides, cli_args, namespace, ...)."""

    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self._shutdown_done = False
        self._worker: Optional[threading.Thread] = None
        self._own_timers: list = []
        try:
            self._start()
        except BaseException as exc:
            if isinstance(exc, Exception):  # the cause, in the node's log (main prints it too)
                self.get_logger().fatal(f"start-up failed: {exc}" if isinstance(exc, ParameterError)
                                        else f"start-up failed: {exc!r}\n{traceback.format_exc()}")
            self._stop_worker()
            super().destroy_node()
            raise

    # ------------------------------------------------------------------ start-up
    def _start(self) -> None:
        self.params = self._declare_and_read_parameters()
        p = self.params
        import torch

        torch.set_num_threads(p["threads"])
        t0 = time.perf_counter()
        try:
            self.loaded = load_model(p)
        except ParameterError:
            raise
        except Exception as exc:  # torch / safetensors / out of memory: say which model and why
            raise ModelLoadError(f"could not load the model ({p['model_path'] or 'embedded default'} on "
                                 f"{p['device']}, {p['dtype']}): {exc!r}") from exc
        self.get_logger().info(f"model loaded in {(time.perf_counter() - t0) * 1e3:.0f} ms")
        mc = self.loaded.config
        self.horizon = mc.action_horizon
        if p["joint_names"]:
            action_dim = self.loaded.normalizer.action_dim if self.loaded.normalizer is not None else mc.action_dim
            if len(p["joint_names"]) > action_dim:
                raise ParameterError("joint_names", f"{len(p['joint_names'])} names for actions with "
                                     f"{action_dim} dimensions")
        from ..core.engine import Engine, EngineConfig

        try:
            config = EngineConfig(setting=p["setting"], max_decode=p["max_decode"],
                                  steps_per_frame=p["steps_per_frame"], denoise_steps=p["denoise_steps"],
                                  max_active=p["max_active"], queue_limit=p["queue_limit"],
                                  max_observations_per_frame=1,
                                  language_every_n_frames=p["language_every_n_frames"], seed=p["seed"])
        except ValueError as exc:  # a cross-check not covered by check_parameter
            name = next((q.name for q in PARAMETERS if q.name in str(exc)), "setting")
            raise ParameterError(name, str(exc)) from exc
        self.engine = Engine(self.loaded.model, self.loaded.tokenizer, config, normalizer=self.loaded.normalizer)
        self._warm_up(p["warmup_frames"])
        self._tick_guard = TickGuard() if p["yield_to_ticks"] else None
        self.engine.pause_point = None if self._tick_guard is None else self._tick_guard.pause_point

        # state shared between the tick, the subscriptions, the worker and diagnostics
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._chunks = ChunkClock()
        self._period_ns = period_ns(p["control_rate_hz"])
        self._grid0: Optional[int] = None  # tick grid origin when TimerInfo is unavailable
        self._last_scheduled: Optional[int] = None
        self._pending_obs: Optional[tuple] = None
        self._pending_questions: collections.deque = collections.deque()
        self._stop = False
        self._busy = False
        self._last_frame_end = 0  # monotonic ns
        self._last_obs_mono: Optional[int] = None
        self._obs_frames = 0
        self._pending_config: dict = {}
        self.records: "collections.OrderedDict[int, FrameRecord]" = collections.OrderedDict()
        self._max_records = 100_000
        # statistics
        self.frame_ms = Rolling(200)  # observation frames: engine time
        self.language_frame_ms = Rolling(50)  # language-only frames: engine time
        self.obs_interval_ms = Rolling(50)  # spacing of arriving observations
        self.tick_lateness_ms = Rolling(60_000)  # 20 min at 50 Hz (the agent's report reads them all)
        self.tokens_rate = WindowRate(5.0)
        self.counters = collections.Counter()
        self._last_batch = 0.0
        self._diag_prev = {"underruns": 0, "missed_ticks": 0, "observations_stale": 0, "hold_ticks": 0,
                           "frame_errors": 0, "actions_non_finite": 0}
        # reliability: the language budget, repeated failures, newest observation, prompt fitting
        from ..core.budget import DecodeBudget

        self.budget = DecodeBudget(p["steps_per_frame"], self._deadline_ms())
        self._last_k = p["steps_per_frame"]
        self.k_history: collections.deque = collections.deque(maxlen=1000)  # (frame_id, k granted, observation?)
        self._consecutive_failures = 0
        self._faulted = False
        self._last_failure = ""
        self._newest_obs_stamp_ns: Optional[int] = None  # capture stamp of the newest observation received
        self._fit_cache: Optional[tuple] = None  # (instruction, state length, characters kept)

        depth = lambda n: QoSProfile(depth=n, **_RELIABLE)  # noqa: E731
        self._pub_actions = self.create_publisher(ActionChunk, p["actions_topic"], depth(10))
        self._pub_text = self.create_publisher(TextToken, p["text_topic"], depth(1000))
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", depth(10))
        self._pub_traj = (self.create_publisher(JointTrajectory, p["trajectory_topic"], depth(10))
                          if p["joint_names"] else None)
        inputs = MutuallyExclusiveCallbackGroup()
        self.create_subscription(ObservationMsg, p["observation_topic"], self._on_observation, depth(2),
                                 callback_group=inputs)
        self.create_subscription(QuestionMsg, p["question_topic"], self._on_question, depth(100),
                                 callback_group=inputs)
        self._tick_timer = self.create_timer(self._period_ns / NS_PER_S, self._tick_callback(),
                                             callback_group=MutuallyExclusiveCallbackGroup())
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics,
                                             callback_group=MutuallyExclusiveCallbackGroup())
        self._own_timers = [self._tick_timer, self._diag_timer]
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._worker = threading.Thread(target=self._worker_loop, name="oxygen-inference-worker", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"{self.loaded.source} ({self.loaded.layout}, {p['device']}, {p['dtype']}): setting {p['setting']}, "
            f"H={self.horizon} actions at {p['control_rate_hz']:g} Hz, k={p['steps_per_frame']}, "
            f"N={p['max_decode']}; {p['observation_topic']} -> {p['actions_topic']}, {p['text_topic']}")

    def _deadline_ms(self) -> float:
        """The frame deadline of the language budget (see ``frame_deadline_ms``)."""
        p = self.params
        if p["frame_deadline_ms"] > 0:
            return p["frame_deadline_ms"]
        return self.horizon / p["control_rate_hz"] * 1e3 / 2

    def _declare_and_read_parameters(self) -> dict:
        values = {}
        for spec in PARAMETERS:
            descriptor = ParameterDescriptor(description=spec.description, read_only=not spec.runtime,
                                             additional_constraints=spec.constraints)
            if isinstance(spec.default, Parameter.Type):
                self.declare_parameter(spec.name, spec.default, descriptor)
                try:
                    raw = self.get_parameter(spec.name).value
                except ParameterUninitializedException:
                    raw = []  # `joint_names: []` in YAML leaves it unset
            else:
                # dynamic typing so that `control_rate_hz: 50` (an int) is accepted for a
                # double and every type error is reported by check_parameter with the name
                descriptor.dynamic_typing = True
                raw = self.declare_parameter(spec.name, spec.default, descriptor).value
            values[spec.name] = raw
        out = {}
        for spec in PARAMETERS:
            out[spec.name] = check_parameter(spec.name, values[spec.name], values)
        unknown = sorted(n for n in getattr(self, "_parameter_overrides", {})
                         if n not in SPECS and n not in IMPLICIT_PARAMETERS and not n.startswith("qos_overrides."))
        if unknown:  # a typo in the YAML would otherwise go unnoticed (a wildcard section may hold others' too)
            self.get_logger().warning(f"unknown parameter(s) {unknown} ignored; known: see config/agent.yaml")
        return out

    def _warm_up(self, frames: int) -> None:
        if frames <= 0:
            return
        from ..core.observation import Observation

        size = self.loaded.config.vision.image_size
        obs = Observation({"warmup": np.zeros((size, size, 3), np.uint8)}, "warm up")
        t0 = time.perf_counter()
        for _ in range(frames):
            self.engine.step([obs], start_language=True,
                             decode_steps=max(1, self.params["steps_per_frame"]))
        self.engine.cancel_all()
        self.engine.last_observation = None  # questions must never be answered from the warm-up image
        self.get_logger().info(f"warmed up: {frames} frames in {(time.perf_counter() - t0) * 1e3:.0f} ms")

    # ------------------------------------------------------------------ parameters at run time
    def _on_set_parameters(self, parameters) -> SetParametersResult:
        changes = {}
        try:
            current = dict(self.params)
            for param in parameters:
                if param.name not in SPECS:
                    continue  # e.g. use_sim_time
                if param.name not in RUNTIME_PARAMETERS:  # read-only ones are refused by rclpy already
                    raise ParameterError(param.name, "cannot change while running")
                value = check_parameter(param.name, param.value, current)
                current[param.name] = changes[param.name] = value
        except ParameterError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        with self._lock:
            self.params.update(changes)
            if "control_rate_hz" in changes:
                self._period_ns = period_ns(changes["control_rate_hz"])
                self._grid0 = self._last_scheduled = None
                self._tick_timer.timer_period_ns = self._period_ns
            if "denoise_steps" in changes:
                self._pending_config["denoise_steps"] = changes["denoise_steps"]
            if "steps_per_frame" in changes:
                self.budget.k_max = changes["steps_per_frame"]
            if {"control_rate_hz", "frame_deadline_ms"} & set(changes):
                self.budget.deadline_ms = self._deadline_ms()
            self._cond.notify_all()
        if changes:
            self.get_logger().info("parameters changed: " + ", ".join(f"{k}={v}" for k, v in changes.items()))
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ inputs
    def _on_observation(self, msg: ObservationMsg) -> None:
        received = (msg, self.get_clock().now().nanoseconds, time.monotonic_ns())
        with self._cond:
            self.counters["observations_received"] += 1
            if self._last_obs_mono is not None:
                self.obs_interval_ms.add((received[2] - self._last_obs_mono) / 1e6)
            self._last_obs_mono = received[2]
            if self._pending_obs is not None:
                self.counters["observations_superseded"] += 1
            self._pending_obs = received
            stamp = conversions.stamp_to_ns(msg.header.stamp)
            if stamp > 0 and (self._newest_obs_stamp_ns is None or stamp > self._newest_obs_stamp_ns):
                self._newest_obs_stamp_ns = stamp
            self._cond.notify_all()

    def _on_question(self, msg: QuestionMsg) -> None:
        with self._cond:
            self.counters["questions_received"] += 1
            self._pending_questions.append((msg.client_id, msg.text))
            self._cond.notify_all()

    # ------------------------------------------------------------------ control tick
    def _tick_callback(self) -> Callable:
        if TimerInfo is not None:
            def tick(info) -> None:
                self._on_tick(info.expected_call_time.nanoseconds, info.actual_call_time.nanoseconds)

            tick.__annotations__ = {"info": TimerInfo, "return": None}
        else:  # pragma: no cover - Humble
            def tick() -> None:
                self._on_tick(None, self.get_clock().now().nanoseconds)
        return tick

    def _on_tick(self, scheduled_ns: Optional[int], actual_ns: int) -> None:
        mono = time.monotonic_ns()
        try:
            self._tick(scheduled_ns, actual_ns)
        finally:
            if self._tick_guard is not None:  # a frame waiting for this tick may go on
                late = actual_ns - scheduled_ns if scheduled_ns is not None else 0
                self._tick_guard.tick_served(mono - late + self._period_ns)

    def _tick(self, scheduled_ns: Optional[int], actual_ns: int) -> None:
        with self._lock:
            if scheduled_ns is None:  # round to the tick grid
                if self._grid0 is None:
                    self._grid0 = actual_ns
                k = round((actual_ns - self._grid0) / self._period_ns)
                scheduled_ns = self._grid0 + k * self._period_ns
            if self._last_scheduled is not None and scheduled_ns - self._last_scheduled > self._period_ns * 3 // 2:
                # rcl skips the ticks of a timer that is late by more than a period
                self.counters["missed_ticks"] += round((scheduled_ns - self._last_scheduled) / self._period_ns) - 1
            self._last_scheduled = scheduled_ns
            if self._busy is False and (self._pending_questions or self.engine_has_work):
                self._cond.notify_all()  # idle decoding is paced by the ticks
            if self._faulted:  # repeated frame failures: no action output at all
                self._chunks.ticks += 1
                self.counters["ticks_faulted"] += 1
                due = None
            else:
                due = self._chunks.tick(scheduled_ns)
                if due is not None and due.first:
                    record = self.records.get(due.chunk.frame_id)
                    if record is not None:
                        record.first_published_ns = time.monotonic_ns()
                if due is None and self._chunks.chunk is not None and self.params["hold_action"] == "last":
                    # an underrun (counted): repeat the last row, marked as a hold (offset = H, one row)
                    c = self._chunks.chunk
                    due = Due(c, c.horizon, scheduled_ns, False)
                    self.counters["hold_ticks"] += 1
        self.tick_lateness_ms.add((actual_ns - scheduled_ns) / 1e6)
        if due is None:
            return
        try:
            self._publish_due(due)
        except Exception as exc:  # never let one message end the control loop
            self.counters["publish_errors"] += 1
            self.get_logger().error(f"could not publish actions: {exc!r}", throttle_duration_sec=5.0)

    def _publish_due(self, due: "Due") -> None:
        c = due.chunk
        hold = due.offset >= c.horizon
        actions = c.actions[-1:] if hold else due.actions
        msg = conversions.action_chunk_msg(
            conversions.ns_to_time_msg(due.stamp_ns), c.frame_id, c.observation_seq,
            conversions.ns_to_time_msg(c.observation_stamp_ns), due.offset, c.period_ns / NS_PER_S, actions,
            header_frame_id=self.params["control_frame"])
        self._pub_actions.publish(msg)
        if self._pub_traj is not None:
            names = self.params["joint_names"]
            self._pub_traj.publish(conversions.joint_trajectory_msg(
                msg.header.stamp, names, actions[:, :len(names)], c.period_ns / NS_PER_S,
                frame_id=self.params["control_frame"]))
        self.counters["actions_published"] += 1

    @property
    def engine_has_work(self) -> bool:
        """Language requests running or queued (read without the worker's lock; advisory)."""
        return bool(self.engine.requests.active or self.engine.requests.queue)

    # ------------------------------------------------------------------ worker
    def _next_job(self) -> Optional[_Job]:
        """Called with the lock held: what the worker should run now, if anything."""
        job = _Job()
        if self._pending_obs is not None:
            obs, self._pending_obs = self._pending_obs, None
            msg, received_ros, _ = obs
            stamp = conversions.stamp_to_ns(msg.header.stamp)
            max_age = self.params["max_observation_age"]
            # its age now, when a frame would start from it (it may have waited for a long frame)
            age_s = (max(received_ros, self.get_clock().now().nanoseconds) - stamp) / NS_PER_S
            if max_age > 0 and stamp > 0 and age_s > max_age:
                self.counters["observations_stale"] += 1
                self.get_logger().warning(
                    f"observation {msg.seq} is {age_s:.3f} s old (max_observation_age {max_age:g} s): not used",
                    throttle_duration_sec=5.0)
            else:
                job.observation = obs
        while self._pending_questions:
            job.questions.append(self._pending_questions.popleft())
        if job.observation is not None or job.questions:
            return job
        now = time.monotonic_ns()
        if (self.params["decode_when_idle"] and self.engine_has_work
                and now - self._last_frame_end >= self._period_ns and not self._observation_due_soon(now)):
            return job  # a language-only frame
        return None

    def _observation_due_soon(self, now_ns: int) -> bool:
        """Would a language-only frame started now still run when the next observation
        is expected (from the observations' recent spacing)? Actions come first."""
        if self._last_obs_mono is None or len(self.obs_interval_ms) < 5:
            return False
        interval_ns = self.obs_interval_ms.percentile(50) * 1e6
        expected = self._last_obs_mono + interval_ns
        language_ns = (self.language_frame_ms.mean() if len(self.language_frame_ms) else 0.0) * 1e6
        return expected - 1.5 * language_ns <= now_ns < expected + interval_ns / 2

    def _worker_loop(self) -> None:
        while True:
            with self._cond:
                job = None
                while not self._stop:
                    if self._pending_config:  # between frames: only this thread uses the engine
                        changes, self._pending_config = self._pending_config, {}
                        self.engine.config = dataclasses.replace(self.engine.config, **changes)
                    job = self._next_job()
                    if job is not None:
                        break
                    self._cond.wait(timeout=self._period_ns / NS_PER_S)
                if self._stop:
                    if job is not None:  # put its questions back: shutdown cancels them
                        self._pending_questions.extendleft(reversed(job.questions))
                    return
                self._busy = True
            try:
                self._run_frame(job)
            except Exception as exc:  # keep serving; the error is reported
                self.counters["frame_errors"] += 1
                self.get_logger().error(f"frame failed: {exc}\n{traceback.format_exc()}",
                                        throttle_duration_sec=2.0)
                self._frame_failed(f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._busy = False
                    self._last_frame_end = time.monotonic_ns()

    def _run_frame(self, job: _Job) -> None:
        dequeued = time.monotonic_ns()
        observations, received = [], None
        if job.observation is not None:
            msg, received_ros, received_mono = job.observation
            try:
                obs = conversions.msg_to_observation(msg)
                obs.check_cameras(self.loaded.config.max_cameras)
                self._check_state(obs)
                obs = self._fit_instruction(obs, int(msg.seq))
            except ValueError as exc:  # ObservationError, ImageError: never fed to the model
                self.counters["observations_invalid"] += 1
                self.get_logger().warning(f"observation {msg.seq} refused: {exc}", throttle_duration_sec=5.0)
            else:
                observations = [obs]
                received = (msg, received_ros, received_mono)
        questions, refused = [], []
        for client, text in job.questions:
            question = self._question(client, text)
            if question is None:
                refused.append(client)
            else:
                questions.append(question)
        if questions and not observations and self.engine.last_observation is None:
            refused += [q.client_id for q in questions]
            self.counters["questions_rejected_no_observation"] += len(questions)
            self.get_logger().warning("question(s) refused: no observation has arrived yet",
                                      throttle_duration_sec=5.0)
            questions = []
        if refused:  # every question gets an answer: here its `rejected` end
            self._publish_tokens([TokenEvent(0, client, 0, 0, -1, "", True, "rejected") for client in refused],
                                 self.get_clock().now().nanoseconds)
        if not observations and not questions and not self.engine_has_work:
            return
        p = self.params
        if observations:
            n = p["language_every_n_frames"]
            start_language = n > 0 and self._obs_frames % n == 0
            self._obs_frames += 1
        else:
            start_language = False
        with self._lock:
            k = self.budget.next_k() if p["decode_budget"] else self.budget.k_max
            if not observations and self.budget.k_max > 0:
                # a language-only frame has no action to protect (it only runs when the
                # next observation is not due before it ends): at least one step, so
                # text never starves once the budget has shrunk to zero
                k = max(1, k)
            self._last_k = k
        started = time.monotonic_ns()
        try:
            result = self.engine.step(observations, questions, start_language=start_language, decode_steps=k)
        except Exception as exc:
            # the engine's FrameError carries what the frame produced before failing:
            # tokens already decoded still go to their clients
            partial = getattr(exc, "result", None)
            if partial is not None and partial.tokens:
                self._publish_tokens(partial.tokens, self.get_clock().now().nanoseconds)
            raise
        finally:
            if self._tick_guard is not None:
                self._tick_guard.frame_done()
        finished = time.monotonic_ns()
        now_ros = self.get_clock().now().nanoseconds
        steps = len(result.batch_sizes)
        with self._lock:
            if observations:
                self.budget.observe(result.prefill_ms + result.denoise_ms, result.decode_ms, steps)
            elif self.budget.action_ms is not None:  # language only: the decode step estimate
                self.budget.observe(self.budget.action_ms, result.decode_ms, steps)
            self.k_history.append((result.frame_id, k, bool(observations)))
        if received is not None and not np.all(np.isfinite(result.actions[0])):
            self.counters["actions_non_finite"] += 1
            self._publish_tokens(result.tokens, now_ros)  # the text is still good
            self._frame_failed(f"frame {result.frame_id} (observation {received[0].seq}): non-finite actions, "
                               "not published")
            return
        if received is not None:
            msg, received_ros, received_mono = received
            stamp = conversions.stamp_to_ns(msg.header.stamp)
            chunk = Chunk(result.actions[0], self._period_ns,
                          chunk_origin(p["chunk_origin"], stamp_ns=stamp, received_ns=received_ros,
                                       period_ns=self._period_ns, horizon=self.horizon),
                          frame_id=result.frame_id, observation_seq=int(msg.seq), observation_stamp_ns=stamp,
                          ready_ns=now_ros)
            record = FrameRecord(result.frame_id, int(msg.seq), received_mono, dequeued, started, finished,
                                 result.total_ms, result.paused_ms)
            with self._lock:
                self._chunks.push(chunk)
                self.records[result.frame_id] = record
                while len(self.records) > self._max_records:
                    self.records.popitem(last=False)
            self.frame_ms.add(result.total_ms)
            self.counters["frames"] += 1
            self._frame_succeeded()
        else:
            self.language_frame_ms.add(result.total_ms)
            self.counters["language_frames"] += 1
        if result.batch_sizes:
            self._last_batch = sum(result.batch_sizes) / len(result.batch_sizes)
        self._publish_tokens(result.tokens, now_ros)

    # ------------------------------------------------------------------ input checks (worker thread)
    def _check_state(self, obs) -> None:
        """A state longer than the checkpoint's state statistics is refused (NaN / inf,
        more than MAX_STATE_DIM values and non-vectors are refused by Observation itself)."""
        from ..core.observation import ObservationError

        normalizer = self.loaded.normalizer
        dim = getattr(normalizer, "state_dim", None) if normalizer is not None else None
        if obs.state is not None and dim is not None and obs.state.shape[0] > dim:
            raise ObservationError("state", f"has {obs.state.shape[0]} values, the checkpoint's state statistics "
                                   f"cover {dim}")

    def _fit_instruction(self, obs, seq: int):
        """The observation with its instruction cleaned of control characters and, when
        the prompt (instruction and state) would be longer than the model's
        ``max_token_len``, cut so that it fits (the state is kept), with a warning."""
        from ..core.tokenizer import prompt_ids

        tok, max_len = self.engine.tokenizer, self.loaded.config.max_token_len
        original = obs.instruction
        text = _clean(original[:max_len * CHARS_PER_TOKEN])
        n_state = 0 if obs.state is None else obs.state.shape[0]

        def fits(n: int) -> bool:
            return len(prompt_ids(tok, text[:n], obs.state)) <= max_len

        keep = len(text)
        if not fits(keep):
            cached = self._fit_cache
            if cached is not None and cached[:2] == (text, n_state) and fits(cached[2]):
                keep = cached[2]
            else:
                lo, hi = 0, len(text)  # the longest prefix that fits (fits(lo) is kept true)
                if not fits(0):
                    lo = hi = 0
                    self.get_logger().error(
                        f"the prompt does not fit max_token_len={max_len} tokens even without an instruction "
                        f"(state of {n_state} values): it is cut", throttle_duration_sec=5.0)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if fits(mid):
                        lo = mid
                    else:
                        hi = mid - 1
                keep = lo
                self._fit_cache = (text, n_state, keep)
        truncated = keep < len(text) or len(original) > max_len * CHARS_PER_TOKEN
        if truncated:
            self.counters["instructions_truncated"] += 1
            self.get_logger().warning(
                f"observation {seq}: instruction of {len(original)} characters cut to {keep} so that the "
                f"prompt fits max_token_len={max_len} tokens", throttle_duration_sec=5.0)
        if truncated or text != original:
            return dataclasses.replace(obs, instruction=text[:keep])
        return obs

    def _question(self, client: str, text: str):
        """A Question from a message, or None (refused, logged) when it has no text.
        Control characters are removed; a question longer than the engine's
        ``max_question_tokens`` is cut to it with a warning."""
        from ..core.engine import Question

        limit = self.engine.config.max_question_tokens
        cleaned = _clean(text[:limit * CHARS_PER_TOKEN]).strip()
        if not cleaned:
            self.counters["questions_rejected_empty"] += 1
            self.get_logger().warning(f"question from {client!r} refused: no text", throttle_duration_sec=5.0)
            return None
        tokens = len(self.engine.tokenizer.encode(cleaned))
        if tokens > limit or len(text) > limit * CHARS_PER_TOKEN:
            self.counters["questions_truncated"] += 1
            self.get_logger().warning(f"question from {client!r} ({len(text)} characters, {tokens}+ tokens) cut "
                                      f"to {limit} tokens", throttle_duration_sec=5.0)
        return Question(text=cleaned, client_id=client)

    # ------------------------------------------------------------------ failures
    def _frame_failed(self, reason: str) -> None:
        """Count a failed frame; after ``max_consecutive_failures`` in a row, stop the
        action output (the current chunk is dropped) until a frame succeeds."""
        with self._lock:
            self._consecutive_failures += 1
            self._last_failure = reason
            n, limit = self._consecutive_failures, self.params["max_consecutive_failures"]
            stop = n >= limit and not self._faulted
            if stop:
                self._faulted = True
                self._chunks.chunk = self._chunks.origin_ns = None
        if stop:
            self.get_logger().error(f"{n} frames failed in a row (last: {reason}): action output stopped until a "
                                    "frame succeeds")
        else:
            self.get_logger().error(f"frame failed ({n} in a row): {reason}", throttle_duration_sec=2.0)

    def _frame_succeeded(self) -> None:
        with self._lock:
            n, was_faulted = self._consecutive_failures, self._faulted
            self._consecutive_failures, self._faulted = 0, False
        if was_faulted:
            self.get_logger().info(f"a frame succeeded after {n} failures: action output resumed")

    def _publish_tokens(self, events, stamp_ns: int) -> None:
        if not events:
            return
        stamp = conversions.ns_to_time_msg(stamp_ns)
        for event in events:
            self._pub_text.publish(conversions.text_token_msg(stamp, event))
        real = sum(1 for e in events if e.token_id >= 0)
        self.tokens_rate.add(time.monotonic(), real)
        self.counters["text_tokens_published"] += len(events)

    # ------------------------------------------------------------------ diagnostics
    def frame_records(self) -> dict:
        """A copy of the recent observation frames' timings, by engine frame id."""
        with self._lock:
            return {k: dataclasses.replace(r) for k, r in self.records.items()}

    def tick_counts(self) -> dict:
        """Control ticks so far: all, those that published, underruns, before the first chunk."""
        with self._lock:
            c = self._chunks
            return {"ticks": c.ticks, "published": c.published, "underruns": c.underruns, "waiting": c.waiting}

    def diagnostics(self) -> dict:
        """The figures published on /diagnostics, as a dict."""
        now_ros = self.get_clock().now().nanoseconds
        with self._lock:
            age_ns = self._chunks.age_ns(now_ros)
            underruns, ticks, waiting = self._chunks.underruns, self._chunks.ticks, self._chunks.waiting
            faulted, failures, last_failure = self._faulted, self._consecutive_failures, self._last_failure
            newest = self._newest_obs_stamp_ns
            k, k_max, deadline = self._last_k, self.budget.k_max, self.budget.deadline_ms
        mean_frame_ms = self.frame_ms.mean()
        pool = self.engine.pool
        c = self.counters
        return {
            "action_frequency_hz": action_frequency(self.horizon, mean_frame_ms / 1e3),
            "frame_latency_ms": mean_frame_ms,
            "frame_latency_p99_ms": self.frame_ms.percentile(99),
            "chunk_age_ms": math.nan if age_ns is None else age_ns / 1e6,
            "underruns": underruns,
            "ticks": ticks,
            "ticks_waiting": waiting,
            "missed_ticks": self.counters["missed_ticks"],
            "tick_lateness_p99_ms": percentile(self.tick_lateness_ms.values()[-500:], 99),
            "active_batch": len(self.engine.requests.active),
            "queued_requests": len(self.engine.requests.queue),
            "decode_batch_mean": self._last_batch,
            "tokens_per_s": self.tokens_rate.rate(time.monotonic()),
            "kv_bytes_reserved": pool.bytes_reserved,
            "kv_bytes_in_use": pool.bytes_in_use,
            "setting": self.params["setting"],
            "k": k,  # decode steps granted to the last frame by the language budget
            "k_max": k_max,  # steps_per_frame
            "frame_deadline_ms": deadline,
            "control_rate_hz": self.params["control_rate_hz"],
            "horizon": self.horizon,
            "hold_action": self.params["hold_action"],
            "hold_ticks": c["hold_ticks"],
            "observation_age_ms": math.nan if newest is None else (now_ros - newest) / 1e6,
            "faulted": faulted,
            "consecutive_failures": failures,
            "last_failure": last_failure,
            "ticks_faulted": c["ticks_faulted"],
            "actions_non_finite": c["actions_non_finite"],
            "frames": c["frames"],
            "language_frames": c["language_frames"],
            "frame_errors": c["frame_errors"],
            "observations_received": c["observations_received"],
            "observations_superseded": c["observations_superseded"],
            "observations_stale": c["observations_stale"],
            "observations_invalid": c["observations_invalid"],
            "instructions_truncated": c["instructions_truncated"],
            "questions_received": c["questions_received"],
            "questions_rejected": c["questions_rejected_empty"] + c["questions_rejected_no_observation"],
            "questions_truncated": c["questions_truncated"],
            "actions_published": c["actions_published"],
            "text_tokens_published": c["text_tokens_published"],
            "publish_errors": c["publish_errors"],
        }

    def _publish_diagnostics(self) -> None:
        try:
            self._publish_diagnostics_now()
        except Exception as exc:  # diagnostics must never end the node
            self.get_logger().error(f"diagnostics failed: {exc!r}", throttle_duration_sec=10.0)

    def diagnostic_status(self, d: Optional[dict] = None) -> tuple:
        """(level, message) of the status published now: ERROR when the action output is
        stopped, WARN for what happened since the last status (underruns, stale
        observations, holds, frame errors, a shrunken language budget, ...), else OK."""
        d = self.diagnostics() if d is None else d
        keys = ("underruns", "missed_ticks", "observations_stale", "hold_ticks", "frame_errors", "actions_non_finite")
        new = {key: d[key] - self._diag_prev.get(key, 0) for key in keys}
        self._diag_prev = {key: d[key] for key in keys}
        problems = []
        if d["faulted"]:
            problems.append(f"action output stopped: {d['consecutive_failures']} frames failed in a row "
                            f"(last: {d['last_failure']})")
        if new["underruns"]:
            problems.append(f"{new['underruns']} underruns")
        if new["hold_ticks"]:
            problems.append(f"holding the last action ({new['hold_ticks']} ticks)")
        age = d["observation_age_ms"]
        max_age = self.params["max_observation_age"]
        if d["observations_received"] and max_age > 0 and not math.isnan(age) and age > max_age * 1e3:
            problems.append(f"no fresh observation for {age / 1e3:.1f} s (camera drop-out?)")
        if new["observations_stale"]:
            problems.append(f"{new['observations_stale']} stale observations not used")
        if new["missed_ticks"]:
            problems.append(f"{new['missed_ticks']} ticks missed (timer late)")
        if d["frames"] == 0:
            problems.append("no observation frame yet")
        if new["frame_errors"]:
            problems.append(f"{new['frame_errors']} frame errors")
        if new["actions_non_finite"]:
            problems.append(f"{new['actions_non_finite']} chunks with non-finite actions dropped")
        if d["k"] < d["k_max"]:
            problems.append(f"language budget k={d['k']} of {d['k_max']} (frames near the "
                            f"{d['frame_deadline_ms']:.0f} ms deadline)")
        f = d["action_frequency_hz"]
        if not math.isnan(f) and f < d["control_rate_hz"]:
            problems.append(f"action frequency {f:.0f} Hz below the control rate")
        if d["faulted"]:
            level = DiagnosticStatus.ERROR
        else:
            level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        message = "; ".join(problems) if problems else (
            f"f={f:.0f} Hz, frame {d['frame_latency_ms']:.1f} ms, {d['tokens_per_s']:.0f} tok/s")
        return level, message

    def _publish_diagnostics_now(self) -> None:
        d = self.diagnostics()
        status = DiagnosticStatus(name=f"{self.get_name()}: engine", hardware_id=self.params["device"])
        status.level, status.message = self.diagnostic_status(d)
        status.values = [KeyValue(key=k, value=_fmt(v)) for k, v in d.items()]
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self._pub_diag.publish(array)

    # ------------------------------------------------------------------ shutdown
    def _stop_worker(self, timeout: float = 60.0) -> None:
        cond = getattr(self, "_cond", None)
        if cond is not None:
            with cond:
                self._stop = True
                cond.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout)
            if self._worker.is_alive():
                self.get_logger().error(f"worker did not stop within {timeout:.0f} s")

    def shutdown(self) -> None:
        """Stop the timers and the worker; publish ``cancelled`` for every unfinished request."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        t0 = time.perf_counter()
        for timer in self._own_timers:
            timer.cancel()
        self._stop_worker()
        self.stop_ms = (time.perf_counter() - t0) * 1e3  # timers and worker stopped
        if self._worker is not None and self._worker.is_alive():
            return  # the engine is still in use; do not touch it
        events = list(self.engine.cancel_all())
        with self._lock:
            pending = list(self._pending_questions)
            self._pending_questions.clear()
        events += [TokenEvent(0, client, 0, 0, -1, "", True, "cancelled") for client, _ in pending]
        if events:
            try:
                self._publish_tokens(events, self.get_clock().now().nanoseconds)
            except Exception as exc:  # context already shut down
                print(f"{NODE_NAME}: could not publish {len(events)} cancellations: {exc}", file=sys.stderr)
            else:
                self.get_logger().info(f"shutdown: {len(events)} requests cancelled; timers and worker stopped "
                                       f"in {self.stop_ms:.0f} ms")
                try:  # the process may exit right after: let reliable subscribers receive them
                    from rclpy.duration import Duration

                    self._pub_text.wait_for_all_acked(Duration(seconds=1.0))
                except Exception:  # noqa: BLE001 - best effort
                    pass
        else:
            try:
                self.get_logger().info(f"shutdown: no request to cancel; timers and worker stopped in "
                                       f"{self.stop_ms:.0f} ms")
            except Exception:  # noqa: BLE001 - the context may be gone already
                pass

    def destroy_node(self):
        try:
            self.shutdown()
        finally:
            super().destroy_node()


def _clean(text: str) -> str:
    """Text for the tokenizer: control characters removed (tabs and newlines become
    spaces) and anything that is not valid UTF-8 (lone surrogates) replaced."""
    return clean_text(text).encode("utf-8", "replace").decode("utf-8")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def main(args=None) -> int:
    """``ros2 run oxygen_ros inference_node [--ros-args ...]``."""
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    init_control_process(args)
    node = executor = None
    code = 0
    try:
        node = InferenceNode()
        settle_garbage_collector()
        # single-threaded: every callback is short (the frames run on the worker thread), and
        # rclpy's MultiThreadedExecutor spends most of a core rebuilding its wait set
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        while rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    except ParameterError as exc:
        print(f"{NODE_NAME}: {exc}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception as exc:  # a model that does not load, a fault outside the frames: say why, exit non-zero
        print(f"{NODE_NAME}: {exc!r}\n{traceback.format_exc()}", file=sys.stderr)
        code = 1
    finally:
        if node is not None:
            node.destroy_node()
        if executor is not None:
            executor.shutdown(timeout_sec=1.0)
        rclpy.try_shutdown()
    report_leftover_threads(NODE_NAME)
    return code


if __name__ == "__main__":
    sys.exit(main())
