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
    parameter); the others are read-only.

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
    ORIGINS,
    Chunk,
    ChunkClock,
    chunk_origin,
    period_ns,
)
from ..core.requests import TokenEvent
from ..core.stats import Rolling, WindowRate, action_frequency, percentile
from . import conversions
from .camera_node import (
    ParameterError,  # one error type for every node: names the parameter
)

try:  # rclpy >= Iron passes the timer's scheduled time to callbacks that ask for it
    from rclpy.timer import TimerInfo
except ImportError:  # pragma: no cover - Humble
    TimerInfo = None

NODE_NAME = "oxygen_inference"
SETTINGS = ("baseline", "parallel", "shared_kv", "oxygen")
DTYPES = ("float32", "bfloat16")




# --------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any  # its Python type is the parameter's type (float params also take ints)
    description: str
    runtime: bool = False  # may change while running (else read-only)
    constraints: str = ""


def _str_array():
    return Parameter.Type.STRING_ARRAY


PARAMETERS: tuple = (
    ParamSpec("model_path", "", "Checkpoint directory (native, openpi-PyTorch or LeRobot pi05); "
              "empty: the embedded default model."),
    ParamSpec("tokenizer_path", "", "SentencePiece tokenizer.model; empty: the checkpoint's (or the shipped one)."),
    ParamSpec("norm_stats_path", "", "Normalisation statistics (norm_stats.json or LeRobot stats); "
              "empty: found next to the checkpoint."),
    ParamSpec("preset", "tiny", "Model preset built with random weights, used only when model_path is empty "
              "and no default model is shipped.", constraints="tiny | pi05"),
    ParamSpec("device", "cpu", "Torch device of the model.", constraints="cpu | cuda | cuda:N"),
    ParamSpec("dtype", "float32", "Model precision.", constraints="float32 | bfloat16"),
    ParamSpec("setting", "oxygen", "Frame setting: oxygen (shared prefill + cross-frame batched decoding), "
              "shared_kv, parallel or baseline.", constraints="oxygen | shared_kv | parallel | baseline"),
    ParamSpec("control_rate_hz", 50.0, "Control-loop rate: ActionChunk messages per second, and the time "
              "between two actions of a chunk is 1/control_rate_hz.", True, "0 < x <= 1000"),
    ParamSpec("denoise_steps", 10, "Flow-matching integration steps per action chunk (S).", True, "1..1000"),
    ParamSpec("max_decode", 30, "Maximum new tokens per language request (N).", constraints=">= 1"),
    ParamSpec("steps_per_frame", 5, "Decode steps per frame for every running request (k; oxygen setting).",
              True, "0..max_decode"),
    ParamSpec("max_active", 8, "Language requests decoding at once (KV slots held).", constraints=">= 1"),
    ParamSpec("queue_limit", 16, "Language requests waiting for a slot; past it new ones are rejected.",
              constraints=">= 0"),
    ParamSpec("language_every_n_frames", 1, "Start a language request on every n-th observation frame; "
              "0: only on demand (questions).", True, ">= 0"),
    ParamSpec("max_observation_age", 1.0, "Observations older than this (s, by their stamp on this node's "
              "clock) are not used; <= 0: no age check.", True, "finite"),
    ParamSpec("seed", 0, "Seed of the action noise (and of the random preset weights).", constraints=">= 0"),
    ParamSpec("threads", 1, "Torch intra-op threads.", constraints=">= 1"),
    ParamSpec("joint_names", _str_array(), "Joint names; when set, the first len(joint_names) action "
              "dimensions are also published as a JointTrajectory. Empty: no JointTrajectory.",
              constraints="unique, non-empty, at most the model's action dimension"),
    ParamSpec("observation_topic", "/oxygen/observation", "Observation input topic."),
    ParamSpec("question_topic", "/oxygen/question", "Question input topic."),
    ParamSpec("actions_topic", "/oxygen/actions", "ActionChunk output topic."),
    ParamSpec("text_topic", "/oxygen/text", "TextToken output topic."),
    ParamSpec("trajectory_topic", "/oxygen/joint_trajectory", "JointTrajectory output topic (with joint_names)."),
    ParamSpec("chunk_origin", "observation", "Time origin of a chunk's actions: 'observation' (the "
              "observation's capture stamp: the actions that fell into the latency are skipped; falls back "
              "to frame_end for stamps not on this clock) or 'frame_end' (the first tick after the frame).",
              True, "observation | frame_end"),
    ParamSpec("decode_when_idle", True, "Run language-only frames (at most one per control period, never "
              "when the next observation is due before one would end) while requests are decoding and no new "
              "observation arrives. false: text advances only with observation frames (deterministic "
              "replays).", True),
    ParamSpec("warmup_frames", 2, "Frames run on a black image at start-up, before the first tick.",
              constraints=">= 0"),
    ParamSpec("control_frame", "", "header.frame_id of ActionChunk and JointTrajectory messages."),
)

RUNTIME_PARAMETERS = frozenset(p.name for p in PARAMETERS if p.runtime)
_TOPIC_PARAMETERS = ("observation_topic", "question_topic", "actions_topic", "text_topic", "trajectory_topic")


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_parameter(name: str, value: Any, current: Optional[dict] = None) -> Any:
    """Validate one parameter value; return it normalised (ints to floats where
    a float is wanted). Raises :class:`ParameterError` naming the parameter.
    ``current``: the other parameters' values, for cross-checks."""
    spec = _SPECS.get(name)
    if spec is None:
        raise ParameterError(name, "unknown parameter")
    default = spec.default
    if isinstance(default, Parameter.Type):  # string array
        value = [] if value is None else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ParameterError(name, f"must be a list of strings, got {value!r}")
        value = list(value)
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise ParameterError(name, f"must be a bool, got {value!r} ({_type_name(value)})")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParameterError(name, f"must be a number, got {value!r} ({_type_name(value)})")
        value = float(value)
        if not math.isfinite(value):
            raise ParameterError(name, f"must be finite, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParameterError(name, f"must be an integer, got {value!r} ({_type_name(value)})")
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ParameterError(name, f"must be a string, got {value!r} ({_type_name(value)})")

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ParameterError(name, f"{what}, got {value!r}")

    if name == "preset":
        from ..core.model.config import PRESETS
        need(value in PRESETS, f"must be one of {', '.join(sorted(PRESETS))}")
    elif name == "device":
        need(value == "cpu" or value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit()),
             "must be cpu, cuda or cuda:N")
    elif name == "dtype":
        need(value in DTYPES, f"must be one of {', '.join(DTYPES)}")
    elif name == "setting":
        need(value in SETTINGS, f"must be one of {', '.join(SETTINGS)}")
    elif name == "control_rate_hz":
        need(0.0 < value <= 1000.0, "must be > 0 and <= 1000 Hz")
    elif name == "denoise_steps":
        need(1 <= value <= 1000, "must be in 1..1000")
    elif name in ("max_decode", "max_active", "threads"):
        need(value >= 1, "must be >= 1")
    elif name in ("queue_limit", "language_every_n_frames", "seed", "warmup_frames"):
        need(value >= 0, "must be >= 0")
    elif name == "steps_per_frame":
        need(value >= 0, "must be >= 0")
        max_decode = (current or {}).get("max_decode")
        if max_decode is not None:
            need(value <= max_decode, f"must not exceed max_decode ({max_decode})")
    elif name == "chunk_origin":
        need(value in ORIGINS, f"must be one of {', '.join(ORIGINS)}")
    elif name == "joint_names":
        need(all(value), "joint names must be non-empty")
        need(len(set(value)) == len(value), "joint names must be unique")
    elif name in _TOPIC_PARAMETERS:
        from rclpy.exceptions import InvalidTopicNameException
        from rclpy.validate_topic_name import validate_topic_name
        need(bool(value), "must be a topic name")
        try:
            validate_topic_name(value)
        except InvalidTopicNameException as exc:
            raise ParameterError(name, f"{value!r} is not a valid topic name: {exc}") from None
    return value


_SPECS = {p.name: p for p in PARAMETERS}


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
    received_ns: int
    started_ns: int
    finished_ns: int
    engine_ms: float
    first_published_ns: Optional[int] = None  # first ActionChunk carrying this frame


@dataclass
class _Job:
    observation: Optional[tuple] = None  # (msg, received ROS ns, received monotonic ns)
    questions: list = field(default_factory=list)  # (client_id, text)


_RELIABLE = dict(reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                 history=HistoryPolicy.KEEP_LAST)


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
        except BaseException:
            self._stop_worker()
            super().destroy_node()
            raise

    # ------------------------------------------------------------------ start-up
    def _start(self) -> None:
        self.params = self._declare_and_read_parameters()
        p = self.params
        import torch

        torch.set_num_threads(p["threads"])
        self.loaded = load_model(p)
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
        self._diag_prev = {"underruns": 0, "missed_ticks": 0}

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
                if param.name not in _SPECS:
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
            due = self._chunks.tick(scheduled_ns)
            if due is not None and due.first:
                record = self.records.get(due.chunk.frame_id)
                if record is not None:
                    record.first_published_ns = time.monotonic_ns()
            if self._busy is False and (self._pending_questions or self.engine_has_work):
                self._cond.notify_all()  # idle decoding is paced by the ticks
        self.tick_lateness_ms.add((actual_ns - scheduled_ns) / 1e6)
        if due is None:
            return
        c = due.chunk
        msg = conversions.action_chunk_msg(
            conversions.ns_to_time_msg(due.stamp_ns), c.frame_id, c.observation_seq,
            conversions.ns_to_time_msg(c.observation_stamp_ns), due.offset, c.period_ns / NS_PER_S, due.actions,
            header_frame_id=self.params["control_frame"])
        self._pub_actions.publish(msg)
        if self._pub_traj is not None:
            names = self.params["joint_names"]
            self._pub_traj.publish(conversions.joint_trajectory_msg(
                msg.header.stamp, names, due.actions[:, :len(names)], c.period_ns / NS_PER_S,
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
            age_s = (received_ros - stamp) / NS_PER_S
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
            finally:
                with self._cond:
                    self._busy = False
                    self._last_frame_end = time.monotonic_ns()

    def _run_frame(self, job: _Job) -> None:
        from ..core.engine import Question

        observations, received = [], None
        if job.observation is not None:
            msg, received_ros, received_mono = job.observation
            try:
                observations = [conversions.msg_to_observation(msg)]
                observations[0].check_cameras(self.loaded.config.max_cameras)
            except ValueError as exc:  # ObservationError, ImageError
                self.counters["observations_invalid"] += 1
                self.get_logger().warning(f"observation {msg.seq} refused: {exc}", throttle_duration_sec=5.0)
                observations = []
            else:
                received = (msg, received_ros, received_mono)
        questions = [Question(text=text, client_id=client) for client, text in job.questions]
        if questions and not observations and self.engine.last_observation is None:
            now = self.get_clock().now().nanoseconds
            for client, _ in job.questions:
                self._publish_tokens([TokenEvent(0, client, 0, 0, -1, "", True, "rejected")], now)
            self.counters["questions_rejected_no_observation"] += 1
            self.get_logger().warning("question(s) refused: no observation has arrived yet",
                                      throttle_duration_sec=5.0)
            questions = []
        if not observations and not questions and not self.engine_has_work:
            return
        p = self.params
        if observations:
            n = p["language_every_n_frames"]
            start_language = n > 0 and self._obs_frames % n == 0
            self._obs_frames += 1
        else:
            start_language = False
        started = time.monotonic_ns()
        try:
            result = self.engine.step(observations, questions, start_language=start_language,
                                      decode_steps=p["steps_per_frame"])
        except Exception as exc:
            # the engine's FrameError carries what the frame produced before failing:
            # tokens already decoded still go to their clients
            partial = getattr(exc, "result", None)
            if partial is not None and partial.tokens:
                self._publish_tokens(partial.tokens, self.get_clock().now().nanoseconds)
            raise
        finished = time.monotonic_ns()
        now_ros = self.get_clock().now().nanoseconds
        if received is not None:
            msg, received_ros, received_mono = received
            stamp = conversions.stamp_to_ns(msg.header.stamp)
            chunk = Chunk(result.actions[0], self._period_ns,
                          chunk_origin(p["chunk_origin"], stamp_ns=stamp, received_ns=received_ros,
                                       period_ns=self._period_ns, horizon=self.horizon),
                          frame_id=result.frame_id, observation_seq=int(msg.seq), observation_stamp_ns=stamp,
                          ready_ns=now_ros)
            record = FrameRecord(result.frame_id, int(msg.seq), received_mono, started, finished, result.total_ms)
            with self._lock:
                self._chunks.push(chunk)
                self.records[result.frame_id] = record
                while len(self.records) > self._max_records:
                    self.records.popitem(last=False)
            self.frame_ms.add(result.total_ms)
            self.counters["frames"] += 1
        else:
            self.language_frame_ms.add(result.total_ms)
            self.counters["language_frames"] += 1
        if result.batch_sizes:
            self._last_batch = sum(result.batch_sizes) / len(result.batch_sizes)
        self._publish_tokens(result.tokens, now_ros)

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
            "k": self.params["steps_per_frame"],
            "control_rate_hz": self.params["control_rate_hz"],
            "horizon": self.horizon,
            "frames": c["frames"],
            "language_frames": c["language_frames"],
            "frame_errors": c["frame_errors"],
            "observations_received": c["observations_received"],
            "observations_superseded": c["observations_superseded"],
            "observations_stale": c["observations_stale"],
            "observations_invalid": c["observations_invalid"],
            "actions_published": c["actions_published"],
            "text_tokens_published": c["text_tokens_published"],
        }

    def _publish_diagnostics(self) -> None:
        d = self.diagnostics()
        new_underruns = d["underruns"] - self._diag_prev["underruns"]
        new_missed = d["missed_ticks"] - self._diag_prev["missed_ticks"]
        self._diag_prev = {"underruns": d["underruns"], "missed_ticks": d["missed_ticks"]}
        status = DiagnosticStatus(name=f"{self.get_name()}: engine", hardware_id=self.params["device"])
        problems = []
        if new_underruns:
            problems.append(f"{new_underruns} underruns")
        if new_missed:
            problems.append(f"{new_missed} ticks missed (timer late)")
        if d["frames"] == 0:
            problems.append("no observation frame yet")
        if d["frame_errors"]:
            problems.append(f"{d['frame_errors']} frame errors")
        f = d["action_frequency_hz"]
        if not math.isnan(f) and f < d["control_rate_hz"]:
            problems.append(f"action frequency {f:.0f} Hz below the control rate")
        status.level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        status.message = "; ".join(problems) if problems else (
            f"f={f:.0f} Hz, frame {d['frame_latency_ms']:.1f} ms, {d['tokens_per_s']:.0f} tok/s")
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
        for timer in self._own_timers:
            timer.cancel()
        self._stop_worker()
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
                self.get_logger().info(f"shutdown: {len(events)} requests cancelled")
                try:  # the process may exit right after: let reliable subscribers receive them
                    from rclpy.duration import Duration

                    self._pub_text.wait_for_all_acked(Duration(seconds=1.0))
                except Exception:  # noqa: BLE001 - best effort
                    pass

    def destroy_node(self):
        try:
            self.shutdown()
        finally:
            super().destroy_node()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def main(args=None) -> int:
    """``ros2 run oxygen_ros inference_node [--ros-args ...]``."""
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    sys.setswitchinterval(0.001)  # the worker's Python code must not hold the GIL through a tick
    install_sigterm_as_keyboard_interrupt()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    node = None
    try:
        node = InferenceNode()
        settle_garbage_collector()
        executor = MultiThreadedExecutor(num_threads=2)
        executor.add_node(node)
        while rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    except ParameterError as exc:
        print(f"{NODE_NAME}: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


def settle_garbage_collector() -> None:
    """After start-up: collect once, then move every object alive now (model,
    modules, libraries) out of the collector's reach. A full collection of a
    process holding torch and rclpy otherwise pauses every thread for 100-200 ms
    every few seconds (measured on the tiny demo), which a 50 Hz control tick
    cannot hide. Call it from a process entry point, once the nodes exist."""
    import gc

    gc.collect()
    gc.freeze()


def install_sigterm_as_keyboard_interrupt() -> None:
    """Make SIGTERM (sent by launch after SIGINT, and by `kill`) end the process like Ctrl-C."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
