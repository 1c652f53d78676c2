"""The inference node's parameters: name, default, description, type, check, run-time changeable.

``config/agent.yaml`` lists every one of them with its description (a test
keeps the two in step). The checks are those of :mod:`oxygen_ros.ros.parameters`,
the same at start and for a change at run time.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.checkpoints.given_sizes import FLAT_KEYS, SizesError, parse_sizes
from ..core.chunk_clock import ORIGINS
from ..core.model.compile_setup import COMPILE_CHOICES
from ..core.model.config import PRESETS
from ..core.scheduler import SETTINGS
from .parameters import (
    ParamSpec,
    at_least_one,
    in_range,
    non_negative,
    one_of,
    topic_name,
    unique_names,
)
from .robots import robot_names_check

DTYPES = ("float32", "bfloat16")
HOLD_ACTIONS = ("none", "last")


def _device(value: str, values: Mapping | None = None) -> str | None:
    ok = value in ("cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())
    return None if ok else f"must be cpu, cuda or cuda:N, got {value!r}"


def _model_sizes(value: list[str], values: Mapping | None = None) -> str | None:
    try:
        parse_sizes(value)
    except SizesError as exc:
        return str(exc)
    return None


def _control_rate(value: float, values: Mapping | None = None) -> str | None:
    return None if 0.0 < value <= 1000.0 else f"must be > 0 and <= 1000 Hz, got {value!r}"


def _steps_per_frame(value: int, values: Mapping | None = None) -> str | None:
    if value < 0:
        return f"must be >= 0, got {value!r}"
    values = values or {}
    max_decode = values.get("max_decode")
    if isinstance(max_decode, int) and value > max_decode:
        return f"must not exceed max_decode ({max_decode}), got {value!r}"
    if _never_decodes({**values, "steps_per_frame": value}):
        return ("0 with decode_when_idle false would never decode past a request's first token (with 0, "
                "only language-only frames decode): set decode_when_idle true or steps_per_frame >= 1")
    return None


def _decode_when_idle(value: bool, values: Mapping | None = None) -> str | None:
    if _never_decodes({**(values or {}), "decode_when_idle": value}):
        return "false with steps_per_frame 0 would never decode past a request's first token: set steps_per_frame >= 1"
    return None


def _never_decodes(values: Mapping) -> bool:
    """k 0 and no language-only frames in the oxygen setting: no request decodes past its first token."""
    return (values.get("steps_per_frame") == 0 and values.get("decode_when_idle") is False
            and values.get("setting", "oxygen") == "oxygen")


def _deadline(value: float, values: Mapping | None = None) -> str | None:
    return None if value >= 0.0 else f"must be >= 0 ms (0: automatic), got {value!r}"


_TOPIC = "a ROS topic name"

PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("model_path", "", "Checkpoint directory (native, openpi-PyTorch or LeRobot pi05); "
              "empty: the embedded default model.", "str"),
    ParamSpec("model_sizes", [], "Model sizes as KEY=VALUE items (e.g. [\"vision.heads=2\", "
              "\"max_token_len=48\"]): they win over the checkpoint's config.json (its oxygen_sizes) and its "
              "tensor shapes, or change the preset's; see docs/checkpoints.md. Empty: the checkpoint's own.",
              "str_list", _model_sizes, constraints="KEY=VALUE items, KEY one of " + ", ".join(FLAT_KEYS)),
    ParamSpec("tokenizer_path", "", "SentencePiece tokenizer.model; empty: the checkpoint's (or the shipped one).",
              "str"),
    ParamSpec("norm_stats_path", "", "Normalisation statistics (norm_stats.json or LeRobot stats); "
              "empty: found next to the checkpoint.", "str"),
    ParamSpec("preset", "tiny", "Model preset built with random weights, used only when model_path is empty "
              "and no default model is shipped.", "str", one_of(sorted(PRESETS)), constraints=" | ".join(sorted(PRESETS))),
    ParamSpec("device", "cpu", "Torch device of the model.", "str", _device, constraints="cpu | cuda | cuda:N"),
    ParamSpec("dtype", "float32", "Model precision.", "str", one_of(DTYPES), constraints=" | ".join(DTYPES)),
    ParamSpec("setting", "oxygen", "Frame setting: oxygen (shared prefill + cross-frame batched decoding), "
              "shared_kv, parallel or baseline.", "str", one_of(SETTINGS),
              constraints=" | ".join(SETTINGS)),
    ParamSpec("control_rate_hz", 50.0, "Control-loop rate: ActionChunk messages per second, and the time "
              "between two actions of a chunk is 1/control_rate_hz.", "float", _control_rate, True, "0 < x <= 1000"),
    ParamSpec("denoise_steps", 0, "Flow-matching integration steps per action chunk (S); 0: the checkpoint's "
              "own (its config's denoise_steps, 10 for pi0.5).", "int", in_range(0, 1000), True,
              "0..1000 (0: the checkpoint's)"),
    ParamSpec("max_decode", 30, "Maximum new tokens per language request (N).", "int", at_least_one,
              constraints=">= 1"),
    ParamSpec("steps_per_frame", 5, "Decode steps per frame for every running request (k; oxygen setting); "
              "0: only language-only frames decode (one step each, see decode_when_idle).",
              "int", _steps_per_frame, True, "0..max_decode"),
    ParamSpec("max_active", 8, "Language requests decoding at once (KV slots held).", "int", at_least_one,
              constraints=">= 1"),
    ParamSpec("queue_limit", 16, "Language requests waiting for a slot; past it new ones are rejected.",
              "int", non_negative, constraints=">= 0"),
    ParamSpec("max_question_tokens", 32, "Most tokens of a question (/oxygen/question, the Ask action): a longer "
              "one is cut to them and its answer's reason says so. Each KV slot holds this many positions for a "
              "question.", "int", at_least_one, constraints=">= 1"),
    ParamSpec("language_every_n_frames", 1, "Start a language request on every n-th observation frame; "
              "0: only on demand (questions).", "int", non_negative, True, ">= 0"),
    ParamSpec("max_observation_age", 1.0, "Observations older than this (s, by their stamp on this node's "
              "clock, when a frame would start from them) are not used, nor answered from: a question to a robot "
              "whose newest observation is older is refused; <= 0: no age check.", "float",
              dynamic=True, constraints="finite"),
    ParamSpec("hold_action", "none", "What a control tick publishes when the newest chunk has no action left "
              "(an underrun: camera drop-out, stale observations, frames too slow): 'none' publishes nothing; "
              "'last' repeats the chunk's last row as a hold message (offset = the chunk's horizon H, one row, "
              "header.stamp = the tick), only for absolute (position) actions. Underruns are counted either way.",
              "str", one_of(HOLD_ACTIONS), True, " | ".join(HOLD_ACTIONS)),
    ParamSpec("frame_deadline_ms", 0.0, "Deadline of one frame for the language budget: the decode steps of a "
              "frame shrink (down to 0) so that prefill + denoise + decoding fit in it, and grow back with "
              "headroom. 0: half the time a chunk covers (horizon / control_rate_hz / 2: a frame started right "
              "after the previous one must end while the previous chunk still has actions).", "float", _deadline,
              True, ">= 0 (0: automatic)"),
    ParamSpec("decode_budget", True, "Let the language budget shrink each frame's decode steps under overload "
              "(see frame_deadline_ms). false: every frame decodes steps_per_frame steps, whatever the frame "
              "time (deterministic text in lockstep replays; an overloaded frame may then make an action late).",
              "bool", dynamic=True),
    ParamSpec("max_consecutive_failures", 3, "Frames in a row that failed to give the robot its chunk (an "
              "exception before its actions were denoised, non-finite actions; a fault in language work after "
              "them does not count) after which the action output stops: the current chunk is dropped, no "
              "ActionChunk is published and diagnostics report ERROR until a frame succeeds again.", "int",
              at_least_one, True, ">= 1"),
    ParamSpec("seed", 0, "Seed of the action noise (and of the random preset weights).", "int", non_negative,
              constraints=">= 0"),
    ParamSpec("threads", 1, "Torch intra-op threads.", "int", at_least_one, constraints=">= 1"),
    ParamSpec("worker_niceness", 0, "Linux: how much lower than the node's the CPU priority of the inference "
              "worker thread (the frames) is, so that the control tick, the subscriptions and the robots' "
              "controllers take a core from a frame when they wake; 0: the same priority. Raising niceness "
              "needs no privilege.", "int", in_range(0, 19), constraints="0..19"),
    ParamSpec("control_priority", 50, "Linux: the real-time priority (SCHED_FIFO, 1..99) of the control tick's "
              "own thread, as ros2_control's controller manager asks for its loop, so that a tick takes a core "
              "from the frames, the camera side and the middleware the moment it falls due (with control_process, "
              "the whole control process, its middleware threads too). Needs an rtprio limit or "
              "CAP_SYS_NICE; without, the node says so once and ticks at normal priority. 0: never ask.",
              "int", in_range(0, 99), constraints="0..99"),
    ParamSpec("control_process", True, "Run the control tick (every robot's ActionChunk and JointTrajectory "
              "publishers, at control_priority) in a process of its own, started with the node: a tick in the "
              "node's process waits for the interpreter lock its frames, observations and diagnostics hold. "
              "false, use_sim_time, or a process that fails to start (said once): a thread of the node's "
              "process.", "bool"),
    ParamSpec("joint_names", [], "Joint names; when set, the first len(joint_names) action "
              "dimensions are also published as a JointTrajectory. Empty: no JointTrajectory.", "str_list",
              unique_names, constraints="unique, non-empty, at most the model's action dimension"),
    ParamSpec("robots", [], "Robots served by this node, each on its own topics: robot r subscribes its "
              "observation_topic and question_topic under r (/left/oxygen/observation), publishes its "
              "actions_topic, text_topic and trajectory_topic under r, serves its ask_action under r, and has "
              "its own chunk clock, underruns and "
              "failures; the newest observation of every robot is prefilled and denoised in one batched frame "
              "(at most max_observations_per_frame, the longest unserved first). Empty: one robot on the "
              "topics as they are.", "str_list", robot_names_check,
              constraints="unique ROS name tokens (a letter, then letters, digits or _)"),
    ParamSpec("max_observations_per_frame", 4, "Observations one frame prefills and denoises together (with "
              "several robots); robots waiting beyond it are served in the next frame, the longest unserved "
              "first.", "int", at_least_one, constraints=">= 1"),
    ParamSpec("max_cameras", 0, "Cameras an observation carries at most (more are refused, naming this "
              "parameter); 0: the model's camera slots. With compile on, the prefill's graphs take this many "
              "camera slots: set it to the robot's camera count when the model has more slots.", "int",
              non_negative, constraints=">= 0"),
    ParamSpec("observation_topic", "oxygen/observation", "Observation input topic.", "str", topic_name,
              constraints=_TOPIC),
    ParamSpec("question_topic", "oxygen/question", "Question input topic.", "str", topic_name, constraints=_TOPIC),
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk output topic.", "str", topic_name, constraints=_TOPIC),
    ParamSpec("text_topic", "oxygen/text", "TextToken output topic.", "str", topic_name, constraints=_TOPIC),
    ParamSpec("trajectory_topic", "oxygen/joint_trajectory", "JointTrajectory output topic (with joint_names).",
              "str", topic_name, constraints=_TOPIC),
    ParamSpec("autostart", True, "Managed (lifecycle) node only: configure and activate at start; false: wait "
              "for the lifecycle transitions (ros2 lifecycle set, a lifecycle manager).", "bool"),
    ParamSpec("ask_action", "oxygen/ask", "oxygen_ros/action/Ask action server (questions with feedback and "
              "cancel).", "str", topic_name, constraints="a valid action name"),
    ParamSpec("chunk_origin", "observation", "Time origin of a chunk's actions: 'observation' (the "
              "observation's capture stamp: the actions that fell into the latency are skipped; falls back "
              "to frame_end, counted and logged, for a stamp not on this clock or older than the whole chunk) "
              "or 'frame_end' (the first tick after the frame).",
              "str", one_of(ORIGINS), True, " | ".join(ORIGINS)),
    ParamSpec("yield_to_ticks", True, "Between the pieces of a frame (prefill, each denoise and decode step), "
              "let a control tick that falls due before the next piece would end run first: the worker and the "
              "tick share one Python interpreter lock, and a tick waiting for it is late. Costs a frame about one "
              "piece per tick inside it. Only for a tick in the node's process (control_process false).", "bool"),
    ParamSpec("decode_when_idle", True, "Run language-only frames (at most one per control period, never "
              "when the next observation is due before one would end) while requests are decoding and no new "
              "observation arrives. false: text advances only with observation frames (deterministic "
              "replays).", "bool", _decode_when_idle, dynamic=True,
              constraints="not false while steps_per_frame is 0"),
    ParamSpec("compile", "auto", "Run prefill, the denoise loop and a frame's decode steps as compiled graphs, "
              "one per shape bucket, all compiled at start-up (CUDA graphs on a GPU): on | off | auto (auto: on for "
              "CUDA, eager on CPU, where a cold compile takes minutes). Where compiling is impossible the node "
              "says why and runs eager.", "str", one_of(COMPILE_CHOICES), constraints=" | ".join(COMPILE_CHOICES),
              bool_as=("off", "on")),
    ParamSpec("keep_freed_memory", True, "Keep the memory a frame frees in the process for the next frame "
              "(glibc: no trim, blocks up to 32 MB from the heap), so that a frame's large tensors do not fault "
              "their pages in again each frame; the resident size stays at its high-water mark. false: the C "
              "library's defaults. Process-wide.", "bool"),
    ParamSpec("warmup_frames", 2, "Frames run on a black image at start-up, before the first tick.", "int",
              non_negative, constraints=">= 0"),
    ParamSpec("control_frame", "", "header.frame_id of ActionChunk and JointTrajectory messages.", "str"),
)

SPECS = {p.name: p for p in PARAMETERS}
