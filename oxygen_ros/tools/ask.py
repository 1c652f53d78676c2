"""oxygen-ask: ask the running agent a question and print the answer.

    oxygen-ask "where is the target?"
    oxygen-ask --action /left/oxygen/ask "how many red objects are there?"

Sends the question as a goal of the inference node's Ask action
(``oxygen_ros/action/Ask`` on ``/oxygen/ask``), so it is answered from the
newest observation in the same continuous batch as the periodic descriptions,
and prints the answer when it ends (``--stream``: every token as it comes).
Exit status 0 when the answer ended (``eos`` or ``length``), 1 when it was
refused or cancelled or no answer came within ``--timeout`` seconds. The
``ros2`` command does the same with ``ros2 action send_goal --feedback
/oxygen/ask oxygen_ros/action/Ask "{question: '...'}"``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import rclpy
from rclpy.action import ActionClient

from oxygen_ros.action import Ask

DEFAULT_ACTION = "/oxygen/ask"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oxygen-ask", description=__doc__.split("\n\n")[0])
    parser.add_argument("question", help="the question, e.g. 'where is the target?'")
    parser.add_argument("--action", default=DEFAULT_ACTION, help=f"the Ask action (default {DEFAULT_ACTION})")
    parser.add_argument("--max-tokens", type=int, default=0, help="most tokens of the answer (0: the node's)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the server and the answer")
    parser.add_argument("--stream", action="store_true", help="print every token as it is decoded")
    return parser


def ask(node, action: str, question: str, *, max_tokens: int = 0, timeout: float = 30.0,
        on_piece=None) -> tuple[str, str]:
    """``(text, finish_reason)`` of the answer; ``finish_reason`` is ``"timeout"`` when no server
    or no answer came in time. ``on_piece`` gets every token's text as it is decoded."""
    client = ActionClient(node, Ask, action)
    try:
        if not client.wait_for_server(timeout_sec=timeout):
            return "", "timeout"
        feedback = None if on_piece is None else (lambda m: on_piece(m.feedback.piece))
        sent = client.send_goal_async(Ask.Goal(question=question, max_tokens=max_tokens),
                                      feedback_callback=feedback)
        rclpy.spin_until_future_complete(node, sent, timeout_sec=timeout)
        if not sent.done():
            return "", "timeout"
        result = sent.result().get_result_async()
        rclpy.spin_until_future_complete(node, result, timeout_sec=timeout)
        if not result.done():
            return "", "timeout"
        answer = result.result().result
        return answer.text, answer.finish_reason
    finally:
        client.destroy()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rclpy.init()
    try:
        node = rclpy.create_node("oxygen_ask")
        try:
            on_piece = (lambda piece: print(piece, end="", flush=True)) if args.stream else None
            text, reason = ask(node, args.action, args.question, max_tokens=args.max_tokens,
                               timeout=args.timeout, on_piece=on_piece)
        finally:
            node.destroy_node()
    except KeyboardInterrupt:
        return 1
    finally:
        rclpy.try_shutdown()
    print("" if args.stream else text, flush=True)
    if reason in ("eos", "length"):
        return 0
    print(f"oxygen-ask: no answer ({reason}) from {args.action}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
