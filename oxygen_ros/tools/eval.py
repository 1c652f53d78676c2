"""oxygen-eval: the default (or any) model on held-out scenes of the reach task, through the engine.

Figures, over ``--scenes`` scenes drawn from a seed range disjoint from
training (``EVAL_SEED_BASE + seed``):

* ``description_exact``: the description generated for the scene's first
  frame is exactly ``describe(scene)``, the target's relation to the gripper
  included; ``text_accuracy``: it starts with the target's colour and shape,
  which the instruction names: that one the model can copy without looking
  (it stays 1.000 with ``--camera-size 1``, see :mod:`.eval_summary`);
* ``first_action_cosine``: mean cosine between the first action of the first
  chunk (robot units, 2-D) and the direction from the gripper to the target;
* ``closed_loop_success``: the policy, run in the :class:`Simulator` (the
  first ``--execute`` actions of each chunk, then a new observation), brings
  the gripper within reach of the target in at most ``--max-steps`` actions;
  ``closed_loop_success_same_colour``: the same over the scenes where a
  distractor has the target's colour (``by_distractor`` splits every figure
  by what tells the target apart);
* ``question_accuracy``: per kind of question (``target``, ``where``,
  ``count``, ``at_target``), the share of held-out questions answered exactly
  right, one of each kind per scene, asked as ``/oxygen/question`` asks them
  (:mod:`.eval_questions`; ``--no-questions`` skips them); ``target`` is
  answered by the instruction, the other kinds need the image.

The summary printed puts the figures that need the image on one line and
those the instruction alone can give on the next; ``--json`` has every figure.

Everything runs through :class:`Engine` in the given ``--setting`` with one
camera (``base``; the other camera slots are masked). Scenes are served with
continuous batching: up to ``--concurrency`` scenes are in flight, a finished
scene is replaced by the next at once, and each scene's first observation
starts a language request that decodes (``--steps-per-frame`` tokens per
frame under ``oxygen``) while that scene and the others keep acting.

    oxygen-eval --scenes 200 --json /tmp/eval.json
    oxygen-eval --scenes 50 --setting baseline
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.engine import Engine, EngineConfig
from ..core.model.compile_setup import COMPILE_CHOICES, use_compile_cache
from ..core.model.warm_up_progress import bucket_lines, packages_built_first
from ..core.observation import Observation
from ..core.sim import scene as sim
from ..core.training import EVAL_SEED_BASE
from ..core.scheduler import SETTINGS
from .arguments import DefaultsHelp, non_negative_int, output_file, plain, positive_int, write_output
from .common import add_model_args, keeps_freed_memory, load_model
from .eval_questions import ask_all, question_cases, scene_observation, summarise_questions
from .eval_summary import summary_lines

CAMERA_NAMES = ("base", "left_wrist", "right_wrist")


@dataclass
class Episode:
    index: int
    scene: sim.Scene
    simulator: sim.Simulator = field(init=False)
    request: object = None  # the language request of the first frame
    first_action: np.ndarray | None = None
    steps: int = 0
    success: bool = False
    done: bool = False

    def __post_init__(self) -> None:
        self.simulator = sim.Simulator(self.scene)


def held_out_scenes(count: int, seed: int = 0) -> list[sim.Scene]:
    """``count`` evaluation scenes (gripper at least 0.3 from the target), never seen in training."""
    rng = np.random.default_rng(EVAL_SEED_BASE + seed)
    return [sim.sample_scene(rng) for _ in range(count)]


def observe(episode: Episode, image_size: int, camera_size: int | None = None) -> Observation:
    """The episode's current scene as :func:`scene_observation` sees it."""
    return scene_observation(episode.simulator.scene, image_size, camera_size)


def names_target(text: str, scene: sim.Scene) -> bool:
    """The text starts with the target's colour and shape."""
    return text.split()[:2] == [scene.target.colour, scene.target.shape]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else 0.0


def _frame_requests(engine: Engine, result, frame_id: int) -> list:
    """The language requests a frame started, in the order of its observations."""
    pool = list(engine.requests.active.values()) + list(engine.requests.queue) + list(result.finished)
    return sorted({id(r): r for r in pool if r.frame_id == frame_id}.values(), key=lambda r: r.id)


def run_episodes(engine: Engine, scenes: Sequence[sim.Scene], *, image_size: int, concurrency: int,
                 execute: int, max_steps: int, camera_size: int | None = None) -> list[Episode]:
    """Serve every scene to completion with continuous batching (see the module docstring)."""
    pending = deque(Episode(i, s) for i, s in enumerate(scenes))
    running: list[Episode] = []
    episodes: list[Episode] = []
    while pending or running:
        new = []
        while pending and len(running) + len(new) < concurrency:
            new.append(pending.popleft())
        if new:  # first observations: actions plus a language request each
            result = engine.step([observe(e, image_size, camera_size) for e in new], start_language=True)
            requests = _frame_requests(engine, result, result.frame_id)
            if len(requests) != len(new):
                raise RuntimeError(f"frame {result.frame_id}: {len(new)} observations but {len(requests)} requests")
            for e, r, chunk in zip(new, requests, result.actions):
                e.request, e.first_action = r, np.asarray(chunk)[0, :2]
                _apply(e, chunk, execute, max_steps)
        if running:
            result = engine.step([observe(e, image_size, camera_size) for e in running], start_language=False)
            for e, chunk in zip(running, result.actions):
                _apply(e, chunk, execute, max_steps)
        running = [e for e in running + new if not e.done]
        episodes += [e for e in new]
    engine.drain()
    return sorted(episodes, key=lambda e: e.index)


def _apply(e: Episode, chunk: np.ndarray, execute: int, max_steps: int) -> None:
    for action in np.asarray(chunk)[:execute, :2]:
        e.simulator.step(action)
        e.steps += 1
        if e.simulator.reached():
            e.success = e.done = True
            return
        if e.steps >= max_steps:
            e.done = True
            return


def distractors(scene: sim.Scene) -> str:
    """What tells the target apart: ``single`` (no other object), ``same_colour`` (a distractor
    shares its colour: only the shape tells), ``same_shape``, or ``distinct``."""
    others = [o for i, o in enumerate(scene.objects) if i != scene.target_index]
    if not others:
        return "single"
    if any(o.colour == scene.target.colour for o in others):
        return "same_colour"
    if any(o.shape == scene.target.shape for o in others):
        return "same_shape"
    return "distinct"


def summarise(episodes: Sequence[Episode]) -> dict:
    texts = [e.request.text if e.request is not None else "" for e in episodes]
    named = [names_target(t, e.scene) for t, e in zip(texts, episodes)]
    exact = [t == sim.describe(e.scene) for t, e in zip(texts, episodes)]
    cos = [cosine(e.first_action, np.subtract(e.scene.target.position, e.scene.gripper)) for e in episodes]
    reasons = {}
    for e in episodes:
        reason = getattr(getattr(e.request, "finish_reason", None), "value", "none")
        reasons[reason] = reasons.get(reason, 0) + 1
    successes = [e for e in episodes if e.success]
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(episodes):
        groups.setdefault(distractors(e.scene), []).append(i)
    by_kind = {k: {"scenes": len(ix), "text_accuracy": float(np.mean([named[i] for i in ix])),
                   "description_exact": float(np.mean([exact[i] for i in ix])),
                   "first_action_cosine": float(np.mean([cos[i] for i in ix])),
                   "closed_loop_success": float(np.mean([episodes[i].success for i in ix]))}
               for k, ix in sorted(groups.items())}
    same_colour = by_kind.get("same_colour", {}).get("closed_loop_success")
    return {
        "scenes": len(episodes),
        "text_accuracy": float(np.mean(named)),
        "description_exact": float(np.mean(exact)),
        "first_action_cosine": float(np.mean(cos)),
        "first_action_cosine_min": float(np.min(cos)),
        "closed_loop_success": len(successes) / len(episodes),
        "closed_loop_success_same_colour": same_colour,
        "mean_steps_to_success": float(np.mean([e.steps for e in successes])) if successes else None,
        "finish_reasons": reasons,
        "by_distractor": by_kind,
    }


def check_execute(execute: int, horizon: int) -> None:
    """ValueError unless ``execute`` actions of each chunk can be run (0 runs none: no episode
    would ever end)."""
    if not 1 <= execute <= horizon:
        raise ValueError(f"execute must be in 1..{horizon} (the model's action horizon), got {execute}")


def check_action_dims(normalizer, model) -> None:
    """ValueError unless the actions carry the reach task's two, (dx, dy): a normaliser cuts them
    to its statistics' action dimension."""
    dims = normalizer.action_dim if normalizer is not None else model.config.action_dim
    if dims < 2:
        whose = "the normalisation statistics'" if normalizer is not None else "the model's"
        raise ValueError(f"the reach task's actions are (dx, dy); {whose} actions have {dims} dimension(s)")


def evaluate(model, tokenizer, normalizer, *, scenes: int = 200, seed: int = 0, setting: str = "oxygen",
             concurrency: int = 8, execute: int = 5, max_steps: int = 50, max_decode: int = 12,
             steps_per_frame: int = 5, denoise_steps: int | None = None, camera_size: int | None = None,
             with_texts: bool = False, compile: str = "off", questions: bool = True,
             keep_freed_memory: bool = True) -> dict:
    """Run the evaluation and return its figures (and, with ``with_texts``, every generated text and
    token: ``texts`` and ``tokens`` of the descriptions, ``question_tokens`` of the answers)."""
    check_execute(execute, model.config.action_horizon)
    check_action_dims(normalizer, model)
    if scenes < 1 or max_steps < 1:
        raise ValueError(f"scenes and max_steps must be >= 1, got {scenes} and {max_steps}")
    steps = denoise_steps or model.config.denoise_steps
    config = EngineConfig(setting=setting, max_decode=max_decode, steps_per_frame=min(steps_per_frame, max_decode),
                          denoise_steps=steps, max_active=concurrency, queue_limit=4 * concurrency,
                          max_observations_per_frame=concurrency, language_every_n_frames=1, seed=seed,
                          camera_names=CAMERA_NAMES[:model.config.max_cameras], compile=compile, keep_freed_memory=keep_freed_memory)
    engine = Engine(model, tokenizer, config, normalizer=normalizer)
    say = functools.partial(print, file=sys.stderr, flush=True)
    if engine.compiled is not None:  # nothing else is said while the packages build (minutes, once)
        say(packages_built_first(use_compile_cache()))
    engine.warm_up(bucket_lines(say), say)  # a line per bucket; another process building: it waits
    if compile == "on" and engine.compiled is None:
        print(f"compile=on runs eager: {engine.compile_reason}", file=sys.stderr)
    start = time.perf_counter()
    size = model.config.vision.image_size
    episodes = run_episodes(engine, held_out_scenes(scenes, seed), image_size=size,
                            concurrency=concurrency, execute=execute, max_steps=max_steps, camera_size=camera_size)
    out = {"setting": setting, "seed": seed, "execute": execute, "max_steps": max_steps, "camera_size": camera_size,
           "denoise_steps": steps, **summarise(episodes)}
    answers = []
    if questions:
        cases = question_cases(held_out_scenes(scenes, seed), seed)
        answers = ask_all(engine, cases, image_size=size, concurrency=concurrency, camera_size=camera_size)
        out.update(summarise_questions(cases, answers))
    out.update({"wall_s": round(time.perf_counter() - start, 2), "compiled": engine.compiled is not None,
                "recompiles": engine.recompiles})
    if with_texts:
        out["texts"] = [e.request.text for e in episodes]
        out["tokens"] = [list(e.request.tokens) for e in episodes]
        out["question_tokens"] = [list(r.tokens) for r in answers]
    return out


#: What ``with_texts`` adds to the figures.
TEXT_KEYS = ("texts", "tokens", "question_tokens")


def compared(report: dict, other: dict) -> dict:
    """``other``'s figures (another setting's, with texts) without its texts, and whether it generated
    the same tokens as ``report``, descriptions and answers."""
    same = other["tokens"] == report["tokens"] and other.get("question_tokens") == report.get("question_tokens")
    return {**{k: v for k, v in other.items() if k not in TEXT_KEYS}, "same_tokens": same}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (argparse exits with status 2 naming a bad option)."""
    parser = argparse.ArgumentParser(prog="oxygen-eval", description=plain(__doc__.split("\n\n")[0]),
                                     formatter_class=DefaultsHelp)
    parser.add_argument("--scenes", type=positive_int, default=200, help="held-out scenes (default 200)")
    parser.add_argument("--setting", default="oxygen", choices=SETTINGS, help="engine setting (default oxygen)")
    parser.add_argument("--compare", nargs="+", default=None, metavar="SETTING", choices=SETTINGS,
                        help="also run these settings (other than --setting) and check that every generated "
                             "token is the same")
    parser.add_argument("--json", type=output_file, default=None, help="write the figures to this file")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="evaluation seed: the held-out scenes, the questions and the action noise")
    parser.add_argument("--concurrency", type=positive_int, default=8,
                        help="scenes in flight at once (the engine's observations per frame)")
    parser.add_argument("--execute", type=positive_int, default=5,
                        help="actions executed from each chunk (1 .. the model's action horizon)")
    parser.add_argument("--max-steps", type=positive_int, default=50,
                        help="actions a scene may take to reach its target before it counts as a failure")
    parser.add_argument("--steps-per-frame", type=positive_int, default=5,
                        help="decode steps per frame (k) under oxygen (default 5; a description has at most 12 tokens)")
    parser.add_argument("--camera-size", type=positive_int, default=None,
                        help="resize the rendered image to this size first, as the camera node does (its "
                             "image_size, 224 in config/agent.yaml); default: the model's size, no resize")
    parser.add_argument("--no-questions", action="store_true", help="skip question_accuracy")
    parser.add_argument("--compile", default="auto", choices=COMPILE_CHOICES,
                        help="compile the model's pieces (auto: on CUDA, eager on CPU)")
    add_model_args(parser)
    args = parser.parse_args(argv)
    if args.compare is not None and not set(args.compare) - {args.setting}:  # it would compare nothing
        parser.error(f"argument --compare: name a setting other than --setting ({args.setting}), "
                     f"e.g. --compare baseline shared_kv")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ckpt = load_model(args)
    try:
        check_execute(args.execute, ckpt.config.action_horizon)
    except ValueError as exc:
        raise SystemExit(f"--execute: {exc}") from None
    try:
        check_action_dims(ckpt.normalizer, ckpt.model)
    except ValueError as exc:
        raise SystemExit(f"cannot evaluate {ckpt.source}: {exc}") from None
    if ckpt.normalizer is None:
        print(f"note: {ckpt.source} has no normalisation statistics; actions are used as the model outputs them",
              file=sys.stderr)
    kwargs = dict(scenes=args.scenes, seed=args.seed, concurrency=args.concurrency, execute=args.execute,
                  max_steps=args.max_steps, steps_per_frame=args.steps_per_frame, camera_size=args.camera_size,
                  compile=args.compile,
                  questions=not args.no_questions, keep_freed_memory=keeps_freed_memory(args))
    report = evaluate(ckpt.model, ckpt.tokenizer, ckpt.normalizer, setting=args.setting, with_texts=True, **kwargs)
    settings = [s for s in (args.compare or []) if s != args.setting]
    if settings:
        report["compare"] = {s: compared(report, evaluate(ckpt.model, ckpt.tokenizer, ckpt.normalizer, setting=s,
                                                          with_texts=True, **kwargs)) for s in settings}
    texts = report["texts"]
    for key in TEXT_KEYS:
        report.pop(key)
    print("\n".join(summary_lines(report)))
    print("descriptions of the first scenes (the scene's -> the model's):")
    for e_text, scene in list(zip(texts, held_out_scenes(min(5, args.scenes), args.seed))):
        print(f"  {sim.describe(scene)!r:45} -> {e_text!r}")
    written = True
    if args.json:  # a write that fails says why and prints the figures on stdout (exit status 1)
        written = write_output(args.json, json.dumps(report, indent=2) + "\n", "oxygen-eval")
        if written:
            print(f"wrote {args.json} (every figure)", file=sys.stderr)
    else:
        print("every figure (per kind of distractor, finish reasons, question counts): --json PATH", file=sys.stderr)
    mismatch = [s for s, r in report.get("compare", {}).items() if not r["same_tokens"]]
    if mismatch:
        print(f"generated tokens differ under: {', '.join(mismatch)}", file=sys.stderr)
    return 0 if written and not mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
