"""oxygen-ask: ask the running agent a question and print the answer.

    oxygen-ask "where is the target?"
    oxygen-ask --action /left/oxygen/ask "how many red objects are there?"

Sends the question as a goal of the inference node's Ask action
(``oxygen_ros/action/Ask`` on ``/oxygen/ask``), so it is answered from the
newest observation in the same continuous batch as the periodic descriptions,
and prints the answer when it ends (``--stream``: every token as it comes).
Exit status 0 when the answer ended (``eos`` or ``length``), 1 when it was
refused or cancelled, its server left the graph (its node ended or was killed)
or no answer came within ``--timeout`` seconds; a question left without its
answer (the timeout, Ctrl-C) is cancelled, so that the node stops decoding it
and frees its slot. The ``ros2`` command does the same with ``ros2 action send_goal --feedback
/oxygen/ask oxygen_ros/action/Ask "{question: '...'}"``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from oxygen_ros.action import Ask

from .arguments import non_negative_int, plain, positive_float

DEFAULT_ACTION = "/oxygen/ask"
#: seconds given to the cancel of a goal abandoned on a timeout or Ctrl-C
CANCEL_WAIT_S = 2.0
#: seconds after its goal was accepted without a token, when the serving node's lifecycle state is asked
PAUSED_CHECK_S = 2.0
#: seconds between the checks that the Ask server is still on the graph while an answer is awaited
GONE_CHECK_S = 0.5
#: seconds the server must stay off the graph before its question is given up as lost
GONE_FOR_S = 1.0
#: what ends a goal ``rejected``, told when the node's result does not say which (its log does)
REJECTED = ("no text left once cleaned, no observation yet or only one older than its max_observation_age, its queue "
            "full, or more tokens asked for than its max_decode; its log says which")


def action_name(text: str) -> str:
    """An action name ROS accepts (checked as rcl will expand it)."""
    from rclpy.expand_topic_name import expand_topic_name
    from rclpy.validate_full_topic_name import validate_full_topic_name

    try:
        validate_full_topic_name(expand_topic_name(text, "oxygen_ask", "/"))
    except Exception as exc:  # InvalidTopicNameException, or rcl's ValueError
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid action name: {str(exc).splitlines()[0]}") from None
    return text


def question_text(text: str) -> str:
    """A question with something to answer (the node refuses one of whitespace only)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the question is empty: ask something, e.g. 'where is the target?'")
    return text


def max_tokens(text: str) -> int:
    value = non_negative_int(text)
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"expected at most {2**32 - 1}, got {text!r}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (argparse exits with status 2 naming a bad option)."""
    parser = argparse.ArgumentParser(prog="oxygen-ask", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("question", type=question_text, help="the question, e.g. 'where is the target?'")
    parser.add_argument("--action", type=action_name, default=DEFAULT_ACTION,
                        help=f"the Ask action (default {DEFAULT_ACTION})")
    parser.add_argument("--max-tokens", type=max_tokens, default=0,
                        help="most tokens of the answer (0: the node's max_decode; more than it is refused)")
    parser.add_argument("--timeout", type=positive_float, default=30.0,
                        help="seconds to wait for the server, then for the whole answer (default 30); "
                             "a question not answered by then is cancelled")
    parser.add_argument("--stream", action="store_true", help="print every token as it is decoded")
    return parser.parse_args(argv)


class Answer(NamedTuple):
    """What :func:`ask` got: the text, the finish reason, and why the node refused or ended it
    (or, for an answer, a note on it: its question cut)."""

    text: str
    finish_reason: str
    reason: str = ""


def ask(node, action: str, question: str, *, max_tokens: int = 0, timeout: float = 30.0,
        on_piece=None, on_note=None) -> Answer:
    """The :class:`Answer` (its ``reason``: the node's, for ``rejected`` and a ``cancelled`` it
    ended itself, or its note on an answer); ``finish_reason`` is ``"no server"`` when no Ask
    server came within ``timeout``, ``"not accepted"`` when the server refused the goal (the
    node is not configured), ``"timeout"`` when no answer came within ``timeout`` after that,
    ``"server gone"`` when the server left the graph before answering (its node ended or was
    killed). ``on_piece`` gets every token's text as it is decoded; ``on_note`` a line, once,
    when no token came within :data:`PAUSED_CHECK_S` and the node serving ``action`` is paused
    (lifecycle inactive: it keeps the question until its activate). A goal left running (the
    timeout, Ctrl-C) is cancelled, so that the node stops decoding an answer no one waits for.
    ``node`` must not be spinning elsewhere."""
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    client = ActionClient(node, Ask, action)
    sent = running = None  # the goal's request; the goal, while accepted and not ended
    ended = False  # the goal was refused, its result came or its server left: nothing to cancel
    try:
        if not client.wait_for_server(timeout_sec=timeout):
            return Answer("", "no server")
        deadline = time.monotonic() + timeout
        pieces: list[str] = []

        def feedback(message) -> None:
            pieces.append(message.feedback.piece)
            if on_piece is not None:
                on_piece(message.feedback.piece)

        sent = client.send_goal_async(Ask.Goal(question=question, max_tokens=max_tokens),
                                      feedback_callback=feedback)
        if not _spin_until(executor, sent, deadline):
            return Answer("", "timeout")
        goal = sent.result()
        if not goal.accepted:
            ended = True
            return Answer("", "not accepted")
        running = goal
        result = goal.get_result_async()
        waited = _wait_for_result(node, executor, client, action, result, deadline, pieces, on_note)
        if waited:
            ended = waited == "server gone"  # (then nothing is left to send a cancel to)
            return Answer("", waited)
        running, ended = None, True
        answer = result.result().result
        return Answer(answer.text, answer.finish_reason, answer.reason)
    finally:
        _cancel_left(executor, sent, running, ended)
        client.destroy()
        executor.remove_node(node)
        executor.shutdown()


def _wait_for_result(node, executor, client, action: str, result, deadline: float, pieces: list, on_note) -> str:
    """Spin until the goal's ``result`` came (""), ``deadline`` passed (``"timeout"``) or the
    server left the graph (``"server gone"``: off it for :data:`GONE_FOR_S`, checked every
    :data:`GONE_CHECK_S`); on the way, once, ``on_note`` the line of :func:`paused_server` when
    no token (``pieces``) came within :data:`PAUSED_CHECK_S`."""
    note_at = None if on_note is None else time.monotonic() + PAUSED_CHECK_S
    gone_since = None
    while not result.done():
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if note_at is not None and now >= note_at:
            note_at = None
            paused = "" if pieces else paused_server(node, executor, action, deadline)
            if paused:
                on_note(paused)
        if client.server_is_ready():
            gone_since = None
        elif gone_since is None:
            gone_since = now
        elif now - gone_since >= GONE_FOR_S:
            return "" if _spin_until(executor, result, time.monotonic() + GONE_CHECK_S) else "server gone"
        _spin_until(executor, result, min(deadline, now + GONE_CHECK_S))
    return ""


def _cancel_left(executor, sent, running, ended: bool) -> None:
    """Cancel the goal that a return or an interrupt leaves running (``running``, or ``sent``'s
    when it was accepted after this client gave up), waiting at most :data:`CANCEL_WAIT_S`."""
    if ended:
        return
    stop_by = time.monotonic() + CANCEL_WAIT_S
    if sent is not None and running is None and _spin_until(executor, sent, stop_by) \
            and sent.result().accepted:
        running = sent.result()  # given up before the server's answer: accepted late, cancelled all the same
    if running is not None:
        _spin_until(executor, running.cancel_goal_async(), stop_by)


def paused_server(node, executor, action: str, deadline: float) -> str:
    """The line saying that the node serving ``action`` is inactive (lifecycle: paused by its
    manager, it keeps questions until its activate), or "" (active, not a lifecycle node, not
    found, or no answer of its ``get_state`` service by ``deadline``, at most 2 s from now)."""
    from lifecycle_msgs.srv import GetState
    from rclpy.action.graph import get_action_server_names_and_types_by_node
    from rclpy.expand_topic_name import expand_topic_name

    wanted = expand_topic_name(action, node.get_name(), node.get_namespace())
    by = min(deadline, time.monotonic() + 2.0)
    for name, namespace in node.get_node_names_and_namespaces():
        try:
            served = get_action_server_names_and_types_by_node(node, name, namespace)
        except Exception:  # noqa: BLE001 - the node left the graph meanwhile
            continue
        if not any(served_name == wanted for served_name, _ in served):
            continue
        full = f"{namespace.rstrip('/')}/{name}"
        client = node.create_client(GetState, f"{full}/get_state")
        try:
            if not client.wait_for_service(timeout_sec=max(0.0, by - time.monotonic())):
                return ""  # not a lifecycle node
            state = client.call_async(GetState.Request())
            if _spin_until(executor, state, by) and state.result().current_state.label == "inactive":
                return (f"{full}, which serves {wanted}, is inactive (lifecycle): it keeps the question and answers it "
                        "after its activate transition")
        finally:
            node.destroy_client(client)
        return ""
    return ""


def rest_of_answer(text: str, streamed: str) -> str:
    """What ``--stream`` prints after the result came: the answer's text beyond what its
    feedback printed (the last feedback may come after the result, and is then never seen)."""
    return text[len(streamed):] if text.startswith(streamed) else "\n" + text


def ask_servers(node) -> list[str]:
    """The Ask actions offered on the graph now (with several robots, one per robot)."""
    from rclpy.action import get_action_names_and_types

    return sorted(name for name, types in get_action_names_and_types(node) if "oxygen_ros/action/Ask" in types)


def _spin_until(executor, future, deadline: float) -> bool:
    """Spin ``executor`` until ``future`` is done (True) or the monotonic ``deadline`` passed."""
    while not future.done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        executor.spin_once(timeout_sec=min(left, 0.1))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C raises KeyboardInterrupt here, instead of rclpy shutting the context down under
    # the client: ask() still cancels the question it was waiting for
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    servers: list[str] = []
    paused: list[str] = []  # the note that the serving node is inactive, when it was given
    try:
        node = rclpy.create_node("oxygen_ask")
        try:
            streamed: list[str] = []

            def on_piece(piece: str) -> None:
                streamed.append(piece)
                print(piece, end="", flush=True)

            def on_note(line: str) -> None:
                paused.append(line)
                print(f"oxygen-ask: note: {line}", file=sys.stderr, flush=True)

            text, reason, detail = ask(node, args.action, args.question, max_tokens=args.max_tokens,
                                       timeout=args.timeout, on_piece=on_piece if args.stream else None,
                                       on_note=on_note)
            servers = ask_servers(node) if reason == "no server" else []
        finally:
            node.destroy_node()
    except KeyboardInterrupt:
        print("\noxygen-ask: interrupted (a question being answered is cancelled)", file=sys.stderr)
        return 1
    finally:
        rclpy.try_shutdown()
    if text or reason in ("eos", "length"):  # (no server, refused: no answer, not a blank line before the why)
        print(rest_of_answer(text, "".join(streamed)) if args.stream else text, flush=True)
    elif streamed:  # streamed pieces of an answer that did not end (timed out): their line ends
        print(flush=True)
    if reason in ("eos", "length"):
        if detail:  # how it was answered (its question cut)
            print(f"oxygen-ask: note: {detail}", file=sys.stderr)
        return 0
    print(f"oxygen-ask: {why_no_answer(args, reason, detail, servers, paused)}", file=sys.stderr)
    return 1


def why_no_answer(args: argparse.Namespace, reason: str, detail: str, servers: list[str], paused: list[str]) -> str:
    """The line that says why no answer came: ``reason`` is :func:`ask`'s ``finish_reason``,
    ``detail`` the node's own, ``servers`` the Ask servers seen, ``paused`` the note given."""
    elsewhere = (f"Ask servers seen: {', '.join(servers)} (--action NAME)" if servers
                 else "none seen: is the agent running, in this ROS_DOMAIN_ID?")
    inactive = " while its node was inactive (lifecycle)" if paused else ""
    return {"no server": f"no Ask server on {args.action} within {args.timeout:g} s; {elsewhere}",
            "timeout": f"no answer from {args.action} within {args.timeout:g} s{inactive} (the question was cancelled)",
            "server gone": f"{args.action} left the ROS graph before it answered (its node ended or was killed); "
                           "the question is lost with it",
            "cancelled": f"{args.action} ended the question without an answer: {detail or 'cancelled'}",
            "not accepted": f"{args.action} took no question (is its inference node configured and active?)",
            "rejected": f"{args.action} refused the question: {detail or REJECTED}"}.get(reason, f"no answer ({reason})")


if __name__ == "__main__":
    sys.exit(main())
