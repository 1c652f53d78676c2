"""What ``oxygen-eval`` prints: its figures in a few lines (every figure goes to ``--json``).

The figures are printed in two groups, by what can give them. The instruction ("move to the
red circle") names the target, so ``text_accuracy`` (the description starts with the target's
name) and the ``target`` questions ("what is the target?") can be copied from it without
looking: with the image shrunk to one pixel (``--camera-size 1``, 200 scenes) the default model
still scored 0.980 and 1.000. The others need the image, where the target is and what else is
there: ``description_exact`` (the relation to the gripper too), ``first_action_cosine``,
``closed_loop_success`` and the ``where``, ``count`` and ``at_target`` questions; with one pixel
they fell to 0.390, 0.720, 0.080 and 0.345, 0.595, 0.500 (the state, the gripper's place, and
guessing still give part of them).
"""

from __future__ import annotations

#: The kinds of question whose answer the instruction alone gives (it names the target).
FROM_INSTRUCTION_QUESTIONS = ("target",)
IMAGE_LABEL = "from the image"
INSTRUCTION_LABEL = "copyable from the instruction (it names the target)"


def _f(value) -> str:
    """A figure with three decimals; '-' where there is none (no scene of that kind)."""
    return "-" if value is None else f"{value:.3f}"


def _questions(report: dict, from_instruction: bool) -> str:
    """The question kinds the image decides, or those the instruction gives, with their accuracy."""
    kinds = [(kind, v) for kind, v in (report.get("question_accuracy") or {}).items()
             if (kind in FROM_INSTRUCTION_QUESTIONS) == from_instruction]
    return ", ".join(f"{kind} {_f(v)}" for kind, v in kinds)


def _figure_lines(report: dict) -> list[str]:
    """The line of the figures that need the image, and that of those the instruction can give."""
    steps = report.get("mean_steps_to_success")
    image = (f"  {IMAGE_LABEL}: description_exact {_f(report['description_exact'])}, closed_loop_success "
             f"{_f(report['closed_loop_success'])} (same-colour distractor: "
             f"{_f(report['closed_loop_success_same_colour'])}), first_action_cosine "
             f"{_f(report['first_action_cosine'])}" + ("" if steps is None else f", {steps:.1f} steps to success"))
    if asked := _questions(report, from_instruction=False):
        image += f"; questions {asked}"
    instruction = f"  {INSTRUCTION_LABEL}: text_accuracy {_f(report['text_accuracy'])}"
    if asked := _questions(report, from_instruction=True):
        instruction += f", question {asked}"
    return [image, instruction]


def summary_lines(report: dict) -> list[str]:
    """The report's figures for a terminal: those that need the image, those the instruction can
    give, each kind of distractor and, with ``--compare``, whether each other setting generated
    the same tokens."""
    mode = "compiled" if report.get("compiled") else "eager"
    lines = [f"{report['setting']} on {report['scenes']} held-out scenes (seed {report['seed']}, {mode}, "
             f"{report['wall_s']:.1f} s):"] + _figure_lines(report)
    kinds = report.get("by_distractor", {})
    if kinds:
        lines.append("  by distractor: " + "; ".join(
            f"{kind} {k['scenes']} scenes (description_exact {_f(k.get('description_exact'))}, closed loop "
            f"{_f(k['closed_loop_success'])})" for kind, k in kinds.items()))
    for setting, other in report.get("compare", {}).items():
        lines.append(f"  {setting}: {'the same tokens' if other['same_tokens'] else 'OTHER TOKENS'}, "
                     f"description_exact {_f(other['description_exact'])}, closed_loop_success "
                     f"{_f(other['closed_loop_success'])}")
    if report.get("compiled"):
        lines.append(f"  recompiles after warm-up: {report.get('recompiles')}")
    return lines


__all__ = ["FROM_INSTRUCTION_QUESTIONS", "IMAGE_LABEL", "INSTRUCTION_LABEL", "summary_lines"]
