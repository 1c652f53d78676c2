"""What ``oxygen-eval`` prints: its figures in a few lines (every figure goes to ``--json``)."""

from __future__ import annotations


def _f(value) -> str:
    """A figure with three decimals; '-' where there is none (no scene of that kind)."""
    return "-" if value is None else f"{value:.3f}"


def summary_lines(report: dict) -> list[str]:
    """The report's figures for a terminal: the main ones, the questions, each kind of
    distractor and, with ``--compare``, whether each other setting generated the same tokens."""
    mode = "compiled" if report.get("compiled") else "eager"
    steps = report.get("mean_steps_to_success")
    lines = [
        f"{report['setting']} on {report['scenes']} held-out scenes (seed {report['seed']}, {mode}, "
        f"{report['wall_s']:.1f} s):",
        f"  text_accuracy {_f(report['text_accuracy'])}, closed_loop_success {_f(report['closed_loop_success'])} "
        f"(same-colour distractor: {_f(report['closed_loop_success_same_colour'])}), first_action_cosine "
        f"{_f(report['first_action_cosine'])}" + ("" if steps is None else f", {steps:.1f} steps to success"),
    ]
    if questions := report.get("question_accuracy"):
        lines.append("  question_accuracy " + ", ".join(f"{kind} {_f(v)}" for kind, v in questions.items())
                     + f" (all {_f(report.get('question_accuracy_all'))})")
    kinds = report.get("by_distractor", {})
    if kinds:
        lines.append("  by distractor: " + "; ".join(
            f"{kind} {k['scenes']} scenes (text {_f(k['text_accuracy'])}, closed loop {_f(k['closed_loop_success'])})"
            for kind, k in kinds.items()))
    for setting, other in report.get("compare", {}).items():
        lines.append(f"  {setting}: {'the same tokens' if other['same_tokens'] else 'OTHER TOKENS'}, text_accuracy "
                     f"{_f(other['text_accuracy'])}, closed_loop_success {_f(other['closed_loop_success'])}")
    if report.get("compiled"):
        lines.append(f"  recompiles after warm-up: {report.get('recompiles')}")
    return lines


__all__ = ["summary_lines"]
