"""oxygen-train: train the default model on the synthetic reach task (CPU, minutes).

Trains the ``tiny`` preset with :mod:`oxygen_ros.core.training` (text
cross-entropy on the scene description plus flow matching on the expert's
action chunk, one joint sequence per example) and writes a native checkpoint:
the weights, the tokenizer, ``norm_stats.json``, ``training.json`` (the
configuration and the loss log) and ``card.md``. With ``--eval N`` (default
200) it then evaluates the result on ``N`` held-out scenes through the engine
and puts the figures into the card.

Deterministic: the same seed, steps and thread count give the same weights.

    oxygen-train --out oxygen_ros/data/default_model   # re-creates it (from the checkout's root)
    oxygen-train --steps 200 --out /tmp/m --eval 0

``--out`` has no default: one inside the installed package replaced, unannounced,
the model every command loads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
import traceback
from collections.abc import Sequence

import torch

from ..core.checkpoints.given_sizes import SizesError, apply_sizes, flat_items, merge_sizes, parse_sizes
from ..core.model.config import PRESETS, preset
from ..core.tokenizer import Tokenizer, default_tokenizer_path
from ..core.training import EVAL_SEED_BASE, TrainConfig, config_dict, norm_stats, train
from .arguments import (DefaultsHelp, non_negative_float, non_negative_int, output_dir, plain, positive_float,
                        positive_int)
from .common import size_item

#: The default model's sizes over the ``tiny`` preset: a 48 px image in 8 px patches (6x6), so that
#: shapes show (the preset's 32 px / 4x4 patches barely tell a circle from a square).
DEFAULT_SIZES = ("vision.image_size=48",)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor's name and bytes (in state-dict order)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def card(args, cfg: TrainConfig, model_config, history: list[dict], train_s: float, digest: str,
         evaluation: dict | None) -> str:
    """The model card (``card.md``): how to re-create the model, the model, its data, its training and,
    when given, its evaluation."""
    lines = (_card_intro(args, cfg) + _card_model(model_config, digest) + _card_data(cfg)
             + _card_training(args, cfg, history, train_s))
    if evaluation:
        lines += _card_evaluation(evaluation)
    return "\n".join(lines)


def _card_intro(args, cfg: TrainConfig) -> list[str]:
    return [
        "# Default model: tiny π0.5-style VLA for the synthetic reach task",
        "",
        "Trained from scratch by `oxygen-train` on CPU; re-create it (same weights, bit for bit, at the same",
        "thread count) from the repository root with",
        "",
        "```",
        f"python -m oxygen_ros.tools.train --steps {cfg.steps} --batch-size {cfg.batch_size} --lr {cfg.lr} "
        f"--seed {cfg.seed} --patch-shape-weight {cfg.patch_shape_weight} "
        f"--patch-target-weight {cfg.patch_target_weight} "
        f"{' '.join('--size ' + s for s in _sizes(args))} --threads {args.threads} "
        f"--workers {args.workers} --out oxygen_ros/data/default_model",
        "```",
        "",
        ("(these are the defaults; `oxygen-train --out oxygen_ros/data/default_model` is the same). "
         if _all_defaults(args, cfg) else "") + "The loss log and the full configuration are in `training.json`.",
        "",
    ]


def _all_defaults(args, cfg: TrainConfig) -> bool:
    """The run is the one ``oxygen-train --out DIR`` makes (its card may say so)."""
    return (cfg == TrainConfig() and args.preset == "tiny" and args.size is None and args.threads == 1
            and args.workers == 1)


def _last_logged_steps(history: list[dict]) -> int:
    """The steps the last loss-log entry averages (the log's period, or fewer at the end)."""
    if not history:
        return 0
    return history[-1]["step"] - (history[-2]["step"] if len(history) > 1 else 0)


def _seed(text: str) -> int:
    """A seed the training configuration takes (its own check, up front)."""
    value = non_negative_int(text)
    try:
        TrainConfig(seed=value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _card_model(model_config, digest: str) -> list[str]:
    return [
        "## Model",
        "",
        f"- preset `{model_config.name}`: image {model_config.vision.image_size} px / patch "
        f"{model_config.vision.patch_size}, vision {model_config.vision.hidden}x{model_config.vision.depth}, "
        f"VLM width {model_config.vlm.width}, expert width {model_config.expert.width}, depth {model_config.vlm.depth}, "
        f"heads {model_config.vlm.heads} (kv {model_config.vlm.kv_heads}), vocab {model_config.vocab_size}, "
        f"action horizon {model_config.action_horizon}, action dim {model_config.action_dim} (2 real)",
        f"- {sum(p.numel() for p in _params(model_config))} parameters, float32; weights SHA-256 `{digest[:16]}...`",
        "",
    ]


def _card_data(cfg: TrainConfig) -> list[str]:
    return [
        "## Data",
        "",
        "Synthetic reach task (`oxygen_ros.core.sim.scene`), generated on the fly: 1/2/3 coloured shapes with "
        f"probabilities {'/'.join(str(w) for w in cfg.object_weights)}, gripper anywhere ({cfg.at_target_prob:.0%} "
        f"already on the target); from {cfg.hard_from:.0%} of the steps on, {cfg.same_colour_prob:.0%} of the "
        "multi-object scenes have a distractor of the target's colour (only the shape tells them apart); "
        f"{cfg.hires_prob:.0%} of the images rendered at another size and resized as serving does. "
        "One camera (`base`); prompt = π0.5 format with the binned gripper state. "
        f"{cfg.question_prob:.0%} of the examples ask a question (`oxygen_ros.core.sim.questions`: kinds target, "
        "where, count, at_target, four phrasings each, drawn in the proportions "
        f"{'/'.join(str(w) for w in cfg.question_kind_weights)}; count asks about a colour the scene has or lacks "
        "equally often; at_target with the gripper on the target "
        f"{cfg.question_at_target_prob:.0%} of the time) fed after the prompt as serving appends it; the others "
        "describe the scene. "
        "Targets: the answer + EOS or `describe(scene)` + EOS (cross-entropy; greedy decoding reads the first "
        "token from the question's last one or from the prompt) and the "
        "expert's 10-step chunk, divided by `max_step` (flow matching, t ~ Beta(1.5, 1)). Batches are a pure "
        f"function of (seed, batch index); seeds >= 1000000 are held out for evaluation. "
        f"{cfg.steps * cfg.batch_size} examples seen.",
        "",
    ]


def _card_training(args, cfg: TrainConfig, history: list[dict], train_s: float) -> list[str]:
    last = history[-1] if history else {}
    return [
        "## Training",
        "",
        f"- seed {cfg.seed}, {cfg.steps} steps, batch {cfg.batch_size}, AdamW lr {cfg.lr} (warm-up "
        f"{cfg.warmup_steps}, cosine to {cfg.min_lr_fraction:.0%}), weight decay {cfg.weight_decay}, "
        f"clip {cfg.grad_clip}",
        f"- loss weights: text {cfg.text_weight}, action {cfg.action_weight} (padded action dims "
        f"{cfg.pad_action_weight}), patch shape {cfg.patch_shape_weight}, patch target "
        f"{cfg.patch_target_weight} (linear heads on the image tokens predict which shape covers each patch, "
        "and on the VLM's last-layer image tokens whether the target does; training only, not in the checkpoint)",
        f"- wall time {train_s / 60:.1f} min on {platform.machine()} ({args.threads} torch thread(s), "
        f"{args.workers} data worker(s)), torch {torch.__version__}",
        f"- final losses (mean of the last {_last_logged_steps(history)} steps): text "
        f"{last.get('text')}, action {last.get('action')}, teacher-forced text accuracy (descriptions and answers) "
        f"{last.get('seq_acc')}",
        "",
    ]


def _card_evaluation(evaluation: dict) -> list[str]:
    lines = [
        "## Evaluation",
        "",
        f"`oxygen-eval --scenes {evaluation['scenes']} --seed {evaluation['seed']}` (held-out scenes, engine "
        f"setting `{evaluation['setting']}`, {evaluation['execute']} actions executed per chunk, budget "
        f"{evaluation['max_steps']} actions):",
        "",
        "| figure | value |",
        "| --- | --- |",
    ]
    for key in ("text_accuracy", "description_exact", "first_action_cosine", "closed_loop_success",
                "closed_loop_success_same_colour", "mean_steps_to_success", "question_accuracy_all"):
        value = evaluation.get(key)
        lines.append(f"| {key} | {value:.3f} |" if isinstance(value, float) else f"| {key} | {value} |")
    for kind, value in evaluation.get("question_accuracy", {}).items():
        lines.append(f"| question_accuracy `{kind}` ({evaluation['questions'][kind]} questions) | {value:.3f} |")
    for setting, other in evaluation.get("compare", {}).items():
        lines.append(f"| same tokens under `{setting}` | {other['same_tokens']} (success "
                     f"{other['closed_loop_success']:.3f}, cosine {other['first_action_cosine']:.3f}) |")
    lines += ["", "text_accuracy and question_accuracy `target` the instruction alone can give (it names the "
              "target); the other figures need the image."]
    kinds = evaluation.get("by_distractor", {})
    if kinds:
        lines += ["", "By what tells the target apart from the other objects:", "",
                  "| scenes | n | description exact | first-action cosine | closed-loop success |",
                  "| --- | --- | --- | --- | --- |"]
        for kind, r in kinds.items():
            lines.append(f"| {kind} | {r['scenes']} | {r['description_exact']:.3f} | "
                         f"{r['first_action_cosine']:.3f} | {r['closed_loop_success']:.3f} |")
        worst = min(kinds, key=lambda k: kinds[k]["closed_loop_success"])
        if kinds[worst]["closed_loop_success"] < 1.0:
            lines += ["", f"Weakest: the `{worst}` scenes (closed-loop success "
                          f"{kinds[worst]['closed_loop_success']:.3f})."]
    lines.append("")
    return lines


def _sizes(args) -> list[str]:
    """The sizes over the preset: for tiny, the embedded default model's, then ``--size`` (which
    wins for a size it names too)."""
    defaults = parse_sizes(DEFAULT_SIZES) if args.preset == "tiny" else {}
    return flat_items(merge_sizes(defaults, parse_sizes(args.size or [])))


def _params(model_config):
    from ..core.model.vla import build_model

    return list(build_model(model_config, device="meta").parameters())


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (argparse exits with status 2 naming a bad option)."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="oxygen-train", description=plain(__doc__.split("\n\n")[0]),
                                     formatter_class=DefaultsHelp)
    parser.add_argument("--steps", type=positive_int, default=defaults.steps,
                        help=f"optimiser steps (default {defaults.steps}: the default model's, which trained in 42 "
                             "minutes on 2 cores, its training.json; --steps 200 for a quick try)")
    parser.add_argument("--batch-size", type=positive_int, default=defaults.batch_size,
                        help=f"examples per step (default {defaults.batch_size})")
    parser.add_argument("--lr", type=positive_float, default=defaults.lr,
                        help=f"AdamW's peak learning rate, after the warm-up (default {defaults.lr:g})")
    parser.add_argument("--seed", type=_seed, default=defaults.seed,
                        help=f"seed of the data, initialisation and noise, below {EVAL_SEED_BASE} (higher ones are "
                             "held out for evaluation)")
    parser.add_argument("--patch-shape-weight", type=non_negative_float, default=defaults.patch_shape_weight,
                        help="weight of the training-only loss asking each image token which shape covers its "
                        f"patch (default {defaults.patch_shape_weight}; 0: off)")
    parser.add_argument("--patch-target-weight", type=non_negative_float, default=defaults.patch_target_weight,
                        help="weight of the training-only loss asking each of the VLM's last-layer image tokens "
                        f"whether its patch is on the target (default {defaults.patch_target_weight}; 0: off)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                        help="the model's shapes: tiny (the default; the embedded default model's) or pi05 "
                             "(pi0.5's, far more than a CPU trains)")
    parser.add_argument("--size", action="append", type=size_item, default=None, metavar="KEY=VALUE",
                        help=f"a model size over the preset (repeatable; for tiny on top of the embedded model's "
                             f"{' '.join(DEFAULT_SIZES)})")
    parser.add_argument("--out", type=output_dir, required=True,
                        help="output directory: new, empty, or a native checkpoint to replace (checked before "
                             "training; the embedded default model is oxygen_ros/data/default_model in the "
                             "checkout)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads for the optimiser (default 1; results depend on it)")
    parser.add_argument("--workers", type=non_negative_int, default=1,
                        help="processes rendering the training examples (0: render in this process)")
    parser.add_argument("--log-every", type=positive_int, default=100,
                        help="print the losses every this many steps, one JSON line each")
    parser.add_argument("--eval", type=non_negative_int, default=200, metavar="N",
                        help="held-out scenes to evaluate (0: none)")
    args = parser.parse_args(argv)
    why = _not_replaceable(args.out)
    if why:
        parser.error(f"argument --out: {why}")
    return args


def _not_replaceable(out) -> str | None:
    """Why the checkpoint must not be written into ``out``: a folder that holds something other than a
    native checkpoint (another layout's would be half overwritten); None when it may."""
    from ..core.checkpoints.native import is_native_dir

    if not out.is_dir() or not any(out.iterdir()) or is_native_dir(out):
        return None
    names = sorted(p.name for p in out.iterdir())
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"{out} holds files and is not an oxygen_ros checkpoint ({shown}); give a new or empty folder"


def _evaluate(model, tokenizer, cfg: TrainConfig, scenes: int) -> dict:
    """The evaluation on ``scenes`` held-out scenes under ``oxygen``, with ``shared_kv`` and ``baseline``
    compared against it (same tokens or not)."""
    from ..core.normalization import openpi_normalizer
    from .eval import TEXT_KEYS, compared, evaluate

    normalizer = openpi_normalizer(norm_stats(cfg.max_step), "training statistics")
    execute = min(5, model.config.action_horizon)  # actions run of each chunk
    evaluation = evaluate(model, tokenizer, normalizer, scenes=scenes, execute=execute, with_texts=True)
    evaluation["compare"] = {
        setting: compared(evaluation, evaluate(model, tokenizer, normalizer, scenes=scenes, setting=setting,
                                               execute=execute, with_texts=True))
        for setting in ("shared_kv", "baseline")}
    for key in TEXT_KEYS:
        evaluation.pop(key)
    return evaluation


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                      patch_shape_weight=args.patch_shape_weight, patch_target_weight=args.patch_target_weight)
    try:
        model_config = apply_sizes(preset(args.preset), parse_sizes(_sizes(args)), "--size")
    except SizesError as exc:
        raise SystemExit(f"oxygen-train: {exc}") from None
    tokenizer = Tokenizer.default()

    def log(entry: dict) -> None:
        print(json.dumps(entry), flush=True)

    start = time.perf_counter()
    model, history = train(model_config, cfg, tokenizer, log=log, log_every=args.log_every, workers=args.workers)
    train_s = time.perf_counter() - start
    digest = weights_digest(model)
    print(f"trained {cfg.steps} steps in {train_s / 60:.1f} min; weights sha256 {digest}", flush=True)

    evaluation, failed = None, None
    if args.eval > 0:
        try:
            evaluation = _evaluate(model, tokenizer, cfg, args.eval)
            print("evaluation: " + json.dumps(evaluation, indent=2), flush=True)  # (also in card.md)
        except Exception as exc:  # the trained weights are written all the same
            traceback.print_exc()
            failed = f"{type(exc).__name__}: {exc}"

    from ..core.checkpoints import save_native

    training_record = {"config": config_dict(cfg), "preset": model_config.name, "threads": args.threads,
                       "workers": args.workers, "train_seconds": round(train_s, 1), "weights_sha256": digest,
                       "history": history, "evaluation": evaluation}
    out = save_native(model, args.out, tokenizer_path=default_tokenizer_path(), norm_stats=norm_stats(cfg.max_step),
                      extra={"card.md": card(args, cfg, model_config, history, train_s, digest, evaluation),
                             "training.json": training_record})
    print(f"wrote {out}", flush=True)
    if failed:
        raise SystemExit(f"oxygen-train: the evaluation failed ({failed}); the trained checkpoint is in {out}, "
                         "without an evaluation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
