"""The inference node's parameters: name, default, description, run-time changeable,
and the checks that refuse a bad value with a message naming the parameter.

``config/agent.yaml`` lists every one of them with its description (a test
keeps the two in step). ROS-light: needs ``rclpy`` only for the parameter
types and topic-name validation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from rclpy.parameter import Parameter

from ..core.chunk_clock import ORIGINS
from .camera_node import ParameterError

SETTINGS = ("baseline", "parallel", "shared_kv", "oxygen")
DTYPES = ("float32", "bfloat16")
HOLD_ACTIONS = ("none", "last")
#: Characters of a question / instruction kept per token of its limit before
#: tokenising (no SentencePiece piece is longer): a megabyte of text costs nothing.
CHARS_PER_TOKEN = 100
#: Parameters rclpy declares itself (not ours, never "unknown").
IMPLICIT_PARAMETERS = ("use_sim_time", "start_type_description_service")




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
              "clock, when a frame would start from them) are not used; <= 0: no age check.", True, "finite"),
    ParamSpec("hold_action", "none", "What a control tick publishes when the newest chunk has no action left "
              "(an underrun: camera drop-out, stale observations, frames too slow): 'none' publishes nothing; "
              "'last' repeats the chunk's last row as a hold message (offset = the chunk's horizon H, one row, "
              "header.stamp = the tick), only for absolute (position) actions. Underruns are counted either way.",
              True, "none | last"),
    ParamSpec("frame_deadline_ms", 0.0, "Deadline of one frame for the language budget: the decode steps of a "
              "frame shrink (down to 0) so that prefill + denoise + decoding fit in it, and grow back with "
              "headroom. 0: half the time a chunk covers (horizon / control_rate_hz / 2: a frame started right "
              "after the previous one must end while the previous chunk still has actions).", True,
              ">= 0 (0: automatic)"),
    ParamSpec("decode_budget", True, "Let the language budget shrink each frame's decode steps under overload "
              "(see frame_deadline_ms). false: every frame decodes steps_per_frame steps, whatever the frame "
              "time (deterministic text in lockstep replays; an overloaded frame may then make an action late).",
              True),
    ParamSpec("max_consecutive_failures", 3, "Frames failing in a row (an exception, non-finite actions) after "
              "which the action output stops: the current chunk is dropped, no ActionChunk is published and "
              "diagnostics report ERROR until a frame succeeds again.", True, ">= 1"),
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
    ParamSpec("yield_to_ticks", True, "Between the pieces of a frame (prefill, each denoise and decode step), "
              "let a control tick that falls due before the next piece would end run first: the worker and the "
              "tick share one Python interpreter lock, and a tick waiting for it is late. Costs a frame about one "
              "piece per tick inside it."),
    ParamSpec("decode_when_idle", True, "Run language-only frames (at most one per control period, never "
              "when the next observation is due before one would end) while requests are decoding and no new "
              "observation arrives. false: text advances only with observation frames (deterministic "
              "replays).", True),
    ParamSpec("warmup_frames", 2, "Frames run on a black image at start-up, before the first tick.",
              constraints=">= 0"),
    ParamSpec("control_frame", "", "header.frame_id of ActionChunk and JointTrajectory messages."),
)

RUNTIME_PARAMETERS = frozenset(p.name for p in PARAMETERS if p.runtime)
TOPIC_PARAMETERS = ("observation_topic", "question_topic", "actions_topic", "text_topic", "trajectory_topic")


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_parameter(name: str, value: Any, current: Optional[dict] = None) -> Any:
    """Validate one parameter value; return it normalised (ints to floats where
    a float is wanted). Raises :class:`ParameterError` naming the parameter.
    ``current``: the other parameters' values, for cross-checks."""
    spec = SPECS.get(name)
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
    elif name in ("max_decode", "max_active", "threads", "max_consecutive_failures"):
        need(value >= 1, "must be >= 1")
    elif name == "hold_action":
        need(value in HOLD_ACTIONS, f"must be one of {', '.join(HOLD_ACTIONS)}")
    elif name == "frame_deadline_ms":
        need(value >= 0.0, "must be >= 0 ms (0: automatic)")
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
    elif name in TOPIC_PARAMETERS:
        from rclpy.exceptions import InvalidTopicNameException
        from rclpy.validate_topic_name import validate_topic_name
        need(bool(value), "must be a topic name")
        try:
            validate_topic_name(value)
        except InvalidTopicNameException as exc:
            raise ParameterError(name, f"{value!r} is not a valid topic name: {exc}") from None
    return value


SPECS = {p.name: p for p in PARAMETERS}
