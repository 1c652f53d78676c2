"""The inference node's start-up: the model its parameters ask for, the engine, the warm-up."""

from __future__ import annotations

import pathlib
import time

import numpy as np
import torch

from ..core import checkpoints
from ..core.engine import Engine, EngineConfig
from ..core.model.warm_up_progress import bucket_lines
from ..core.normalization import MODEL_ACTION_DIM, STATE_NEEDS_STATISTICS
from ..core.observation import Observation
from ..core.tokenizer import default_tokenizer_path
from .inference_parameters import PARAMETERS, SPECS
from .parameters import ParameterError
from .robots import robot_topic


class ModelLoadError(RuntimeError):
    """The model could not be loaded for a reason other than a bad parameter."""


def load_model(p: dict) -> checkpoints.LoadedCheckpoint:
    """The LoadedCheckpoint the parameters ask for (errors name the parameter); the
    precedence is :func:`oxygen_ros.core.checkpoints.load_model`'s."""
    for name in ("model_path", "tokenizer_path", "norm_stats_path"):
        if p[name] and not pathlib.Path(p[name]).exists():
            raise ParameterError(name, f"{p[name]} does not exist")
    if p["device"].startswith("cuda") and not torch.cuda.is_available():
        raise ParameterError("device", f"{p['device']} requested but torch sees no CUDA device")
    try:
        return checkpoints.load_model(p["model_path"] or None, fallback_preset=p["preset"], device=p["device"],
                                      dtype=p["dtype"], seed=p["seed"], tokenizer_path=p["tokenizer_path"] or None,
                                      norm_stats_path=p["norm_stats_path"] or None,
                                      sizes=checkpoints.parse_sizes(p["model_sizes"]))
    except checkpoints.SizesError as exc:  # sizes that do not fit: the given ones if any, else the checkpoint's
        raise ParameterError("model_sizes" if p["model_sizes"] else "model_path", str(exc)) from exc
    except checkpoints.CheckpointError as exc:
        raise ParameterError(exc.parameter or "model_path", str(exc)) from exc


def model_notes(p: dict, loaded: checkpoints.LoadedCheckpoint, action_dim: int,
                resolve=str) -> list[tuple[bool, str]]:
    """What the start-up says of the model loaded, (a warning?, the line) each: a preset not used,
    a horizon not stated, the demo model driving a trajectory or held, the tokenizer, the rate its chunks play at, in
    which units its actions go out, and which of them the trajectory carries (``resolve``: the node's
    ``resolve_topic_name``, so that the topics named are the remapped ones)."""
    warnings = (unused_preset(p, loaded), unstated_horizon(loaded), demo_model_trajectory(p, loaded, resolve),
                demo_model_hold(p, loaded))
    notes = [(True, line) for line in warnings if line]
    notes += [(False, line) for line in (tokenizer_note(p, loaded), rate_note(p, loaded)) if line]
    notes += [units_note(p, loaded), trajectory_note(p, action_dim, resolve)]
    return [note for note in notes if note is not None]


def served_topics(p: dict, key: str, resolve=str) -> str:
    """Topic parameter ``key`` of every robot served, as ``resolve`` (the node's ``resolve_topic_name``)
    names it: remapped, in the namespace; comma-separated."""
    return ", ".join(resolve(robot_topic(r, p[key])) for r in p["robots"] or [""])


def unused_preset(p: dict, loaded: checkpoints.LoadedCheckpoint) -> str | None:
    """The warning for a ``preset`` other than the default that did not apply (a checkpoint
    loaded: ``model_path``, or the embedded default model), else None."""
    default = SPECS["preset"].default
    if p["preset"] == default or loaded.layout == "random":
        return None
    return (f"preset {p['preset']!r} not used: {loaded.source} loaded. The preset (random weights) applies "
            "only when model_path is empty and no default model is shipped")


def units_note(p: dict, loaded: checkpoints.LoadedCheckpoint) -> tuple[bool, str] | None:
    """(a warning?, the line) saying in which units actions go out: the robot's, through the
    checkpoint's normalisation statistics, or the model's own, all its dimensions, for a trained
    checkpoint without statistics (on a robot that is rarely what it expects); None for random weights."""
    n, mc = loaded.normalizer, loaded.config
    if n is not None:
        where = f" ({n.source or p['norm_stats_path']})" if n.source or p["norm_stats_path"] else ""
        if n.state_stats is None:
            return True, (f"normalisation statistics{where}: no state entry, actions {n.action_dim} dimensions "
                          f"({n.action_mode}); actions go out in the robot's units. An observation that carries a "
                          f"state is refused: {STATE_NEEDS_STATISTICS}")
        return False, (f"normalisation statistics{where}: state {n.state_dim}, actions {n.action_dim} dimensions "
                       f"({n.action_mode}); actions go out in the robot's units")
    if loaded.layout == "random":
        return None
    return True, (f"{loaded.source} has no normalisation statistics (norm_stats.json): actions go out as the "
                  f"model makes them, all {mc.action_dim} dimensions, in the units it was trained in; a robot "
                  "trained with statistics needs them (norm_stats_path)")


def trajectory_note(p: dict, action_dim: int, resolve=str) -> tuple[bool, str] | None:
    """(a warning?, the line) when ``joint_names`` names fewer joints than the actions have
    dimensions: the JointTrajectory then carries the first of each action. A warning when the
    actions are the model's whole padded width (statistics padded past the robot's joints, as
    openpi's base statistics are: the rest is padding the controller never sees), else an info
    line (a gripper driven apart from the arm). None when the names cover the actions."""
    n = len(p["joint_names"])
    if not 0 < n < action_dim:
        return None
    carries = "carries" if len(p["robots"]) < 2 else "carry"
    line = (f"joint_names names {n} joints and the actions have {action_dim} dimensions: "
            f"{served_topics(p, 'trajectory_topic', resolve)} {carries} the first {n} of each action, "
            f"{served_topics(p, 'actions_topic', resolve)} all {action_dim}")
    if action_dim < MODEL_ACTION_DIM:
        return False, line
    return True, (line + ", the model's whole padded width: are these the statistics of the robot the checkpoint "
                  "was trained for (norm_stats_path)? Statistics padded past its joints make the ActionChunk carry "
                  "padding as actions")


def _embedded(loaded: checkpoints.LoadedCheckpoint) -> bool:
    """Whether ``loaded`` is the embedded default model (trained on the synthetic scene: its actions
    are the demo gripper's displacements)."""
    return loaded.source == str(checkpoints.DEFAULT_MODEL_DIR)


def tokenizer_note(p: dict, loaded: checkpoints.LoadedCheckpoint) -> str:
    """The start-up line naming the tokenizer file in use and whose choice it was (a checkpoint's
    own, the embedded default model's, the one shipped with the package, or parameter
    tokenizer_path): a wrong one decodes nonsense without an error."""
    tok = loaded.tokenizer
    if p["tokenizer_path"]:
        whose = "parameter tokenizer_path"
    elif _embedded(loaded):
        whose = "the embedded default model's"
    else:
        whose = "the package's" if tok.path.resolve() == default_tokenizer_path().resolve() else "the checkpoint's"
    return f"tokenizer {tok.path} ({whose}; {tok.vocab_size} pieces)"


def rate_note(p: dict, loaded: checkpoints.LoadedCheckpoint) -> str | None:
    """The start-up line of a checkpoint (not the embedded default model, not random weights):
    its chunks play at ``control_rate_hz``, which must be its training data's rate; no layout
    records that rate."""
    if loaded.layout == "random" or _embedded(loaded):
        return None
    hz, horizon = p["control_rate_hz"], loaded.config.action_horizon
    return (f"a chunk's {horizon} actions go out one per tick at control_rate_hz {hz:g} Hz ({horizon / hz:.2f} s): "
            f"set it to the rate {loaded.source}'s training data was recorded at (DROID 15 Hz, LIBERO 10 Hz, "
            "ALOHA 50 Hz), else the arm moves faster or slower than it was taught")


def demo_model_trajectory(p: dict, loaded: checkpoints.LoadedCheckpoint, resolve=str) -> str | None:
    """The warning for the embedded default model publishing JointTrajectory (``joint_names``
    set): its actions are the synthetic scene's gripper displacements, not joint positions."""
    if not p["joint_names"] or not _embedded(loaded):
        return None
    return ("the embedded default model was trained on the synthetic scene: its actions are displacements "
            "(dx, dy) of the demo's gripper, not positions of your joints, and its JointTrajectory on "
            f"{served_topics(p, 'trajectory_topic', resolve)} must not drive a real arm's controller (model_path: your "
            "checkpoint)")


def demo_model_hold(p: dict, loaded: checkpoints.LoadedCheckpoint) -> str | None:
    """The warning for ``hold_action: last`` with the embedded default model: a hold repeats a
    chunk's last action, which holds a position, and this model's actions are displacements."""
    if p["hold_action"] != "last" or not _embedded(loaded):
        return None
    return ("hold_action 'last' repeats a chunk's last action on an underrun, which holds a position; the embedded "
            "default model's actions are displacements (dx, dy) of the demo's gripper: repeated, they keep it moving "
            "for as long as the underrun lasts. Keep hold_action 'none' with it")


def unstated_horizon(loaded: checkpoints.LoadedCheckpoint) -> str | None:
    """The warning for a checkpoint that does not state its action horizon (an openpi
    checkpoint without config.json): π0.5's default is used, which may not be its own."""
    if "action_horizon" not in loaded.config.extra.get("defaulted", ()):
        return None
    return (f"{loaded.source} does not state its action horizon: pi0.5's default H={loaded.config.action_horizon} "
            "is used; if the checkpoint was trained with another (its training config's action_horizon), set "
            "model_sizes: [\"action_horizon=N\"]")


def model_load_error(p: dict, exc: BaseException) -> ModelLoadError:
    """The error that says which model did not load, and why."""
    return ModelLoadError(f"could not load the model ({p['model_path'] or 'embedded default'} on {p['device']}, "
                          f"{p['dtype']}): {exc!r}")


def engine_config(p: dict) -> EngineConfig:
    """The engine's static configuration from the parameters (denoise_steps 0: the checkpoint's)."""
    try:
        return EngineConfig(setting=p["setting"], max_decode=p["max_decode"], steps_per_frame=p["steps_per_frame"],
                            denoise_steps=p["denoise_steps"] or None, max_active=p["max_active"],
                            queue_limit=p["queue_limit"], max_question_tokens=p["max_question_tokens"],
                            max_observations_per_frame=min(p["max_observations_per_frame"], max(1, len(p["robots"]))),
                            max_cameras=p["max_cameras"] or None,
                            language_every_n_frames=p["language_every_n_frames"], seed=p["seed"],
                            compile=p["compile"], keep_freed_memory=p["keep_freed_memory"])
    except ValueError as exc:  # a cross-check not covered by the parameter checks
        name = next((q.name for q in PARAMETERS if q.name in str(exc)), "setting")
        raise ParameterError(name, str(exc)) from exc


def warm_up(engine: Engine, frames: int, decode_steps: int) -> float:
    """Run ``frames`` frames on a black image (nothing of them is kept); the time taken in ms."""
    size = engine.model.config.vision.image_size
    obs = Observation({"warmup": np.zeros((size, size, 3), np.uint8)}, "warm up")
    t0 = time.perf_counter()
    for _ in range(frames):
        engine.step([obs], start_language=True, decode_steps=max(1, decode_steps))
    engine.cancel_all()
    engine.forget_observations()  # questions must never be answered from the warm-up image
    return (time.perf_counter() - t0) * 1e3


def compile_pieces(engine: Engine, choice: str, log) -> None:
    """Compile every shape bucket now (a line saying what it does, from the cache or compiled, then
    a line per bucket), or say once why the model runs eager: a warning when ``compile`` was
    ``on``, a line of information otherwise."""
    if engine.compiled is not None:
        engine.warm_up(bucket_lines(log.info), log.info)
    if engine.compiled is None:
        (log.warning if choice == "on" else log.info)(f"running eager: {engine.compile_reason}")


def _whose(size: str, given: dict, defaulted=()) -> str:
    if size in given:
        return "parameter model_sizes"
    return "pi0.5's default: the checkpoint does not state it" if size in defaulted else "the checkpoint's"


def startup_summary(loaded: checkpoints.LoadedCheckpoint, p: dict, resolve=str) -> str:
    """The start-up log line: the model, the setting and which S and H are used (and whose), and the
    topics (``resolve``: the node's ``resolve_topic_name``, so that remapped names are the ones shown)."""
    mc = loaded.config
    given = checkpoints.parse_sizes(p.get("model_sizes", []))
    defaulted = mc.extra.get("defaulted", ())
    s, whose = (p["denoise_steps"], "parameter denoise_steps") if p["denoise_steps"] else (
        mc.denoise_steps, _whose("denoise_steps", given, defaulted))
    sizes = f" with sizes {checkpoints.format_sizes(given)} (parameter model_sizes)" if given else ""
    head = (f"{loaded.source} ({loaded.layout}, {p['device']}, {p['dtype']}){sizes}: setting {p['setting']}, "
            f"H={mc.action_horizon} actions ({_whose('action_horizon', given, defaulted)}) at "
            f"{p['control_rate_hz']:g} Hz, S={s} "
            f"denoise steps ({whose}), k={p['steps_per_frame']}, N={p['max_decode']}; ")
    unstated = {"max_token_len": f"prompt length {mc.max_token_len}", "max_cameras": f"{mc.max_cameras} cameras"}
    unstated = [text for size, text in unstated.items() if size in defaulted and size not in given]
    if unstated:
        head += f"{' and '.join(unstated)} (pi0.5's defaults: the checkpoint does not state them); "
    robots = p["robots"] or [""]
    topics = "; ".join(f"{resolve(robot_topic(r, p['observation_topic']))} -> {resolve(robot_topic(r, p['actions_topic']))}, "
                       f"{resolve(robot_topic(r, p['text_topic']))}" for r in robots)
    if p["robots"]:
        n = min(p["max_observations_per_frame"], len(robots))
        head += f"{len(robots)} robots, up to {n} observations a frame: "
    return head + topics
