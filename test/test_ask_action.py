"""Questions as a ROS 2 action (``oxygen_ros/action/Ask``), through a real ``rclpy.action``
client on real DDS: goal, feedback token by token, result, cancel, refusal."""

from __future__ import annotations

from ros_harness import AskClient, InferenceClient, Ros, inference_node, unique_prefix, until


def _node(ros, random_tiny_dir, prefix, **overrides):
    node = inference_node(ros, prefix, model_path=random_tiny_dir, ask_action=f"{prefix}/ask", max_decode=30,
                          language_every_n_frames=0, warmup_frames=0, **overrides)  # only the goals' requests
    client = InferenceClient(ros, prefix, node=node)
    client.publish_observations(0.5, rate_hz=10.0)  # an observation to answer from
    assert until(lambda: client.chunks, 30.0)
    return node, client


def test_a_goal_streams_its_tokens_as_feedback_and_returns_the_answer(ros_env, random_tiny_dir):
    from action_msgs.msg import GoalStatus

    prefix = unique_prefix()
    with Ros() as ros:
        node, topics = _node(ros, random_tiny_dir, prefix)
        ask = AskClient(ros, f"{prefix}/ask")
        handle, feedback = ask.send("what do you see?", max_tokens=6)
        assert handle.accepted
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_SUCCEEDED
        result = response.result
        # feedback and result travel on separate channels: the last feedback may come after the result
        assert until(lambda: len(feedback) >= result.tokens, 10.0), (len(feedback), result.tokens)
        assert result.finish_reason in ("length", "eos") and result.tokens == len(feedback) <= 6
        assert result.reason == ""
        assert result.finish_reason != "length" or result.tokens == 6
        assert [f.index for f in feedback] == list(range(len(feedback)))
        assert result.text == "".join(f.piece for f in feedback) == feedback[-1].text
        # the same answer streamed on the text topic, under the goal's client id
        streamed = [m for m in topics.text if m.client_id.startswith("ask/")]
        assert until(lambda: any(m.done for m in topics.text if m.client_id.startswith("ask/")), 10.0)
        assert "".join(m.piece for m in streamed) == result.text


def test_a_question_over_max_question_tokens_is_answered_and_its_result_says_it_was_cut(ros_env, random_tiny_dir):
    """The result's ``reason`` says the question was cut to the node's max_question_tokens;
    ``oxygen-ask`` prints the answer, and the note on stderr."""
    import subprocess

    from action_msgs.msg import GoalStatus
    from ros_harness import checkout_env, installed_script

    cut = "the question was cut to fit max_question_tokens (8)"
    question = "what is on the table and where should it go next?"
    prefix = unique_prefix()
    with Ros() as ros:
        _, topics = _node(ros, random_tiny_dir, prefix, max_question_tokens=8)
        ask = AskClient(ros, f"{prefix}/ask")
        handle, _ = ask.send(question, max_tokens=3)
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_SUCCEEDED
        assert response.result.finish_reason in ("length", "eos")
        assert response.result.reason == cut
        tool = subprocess.Popen([installed_script("oxygen-ask"), question, "--action", f"{prefix}/ask",
                                 "--max-tokens", "3"], env=checkout_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:  # observations keep coming while it starts, so that the question has a fresh one
            assert until(lambda: tool.poll() is not None, 120.0, every=topics.observe, period=0.2)
        finally:
            tool.kill()
        out, err = tool.communicate()
        assert tool.returncode == 0, err
        assert out.endswith("\n") and err == f"oxygen-ask: note: {cut}\n"  # the answer, then the note


def test_a_cancelled_goal_ends_its_request_and_frees_the_slot(ros_env, random_tiny_dir):
    from action_msgs.msg import GoalStatus

    prefix = unique_prefix()
    with Ros() as ros:
        node, topics = _node(ros, random_tiny_dir, prefix)
        ask = AskClient(ros, f"{prefix}/ask")
        handle, feedback = ask.send("describe everything you see in detail")
        assert handle.accepted
        assert until(lambda: feedback, 30.0, every=topics.observe, period=0.1), "no feedback"
        cancel = handle.cancel_goal_async()
        assert until(cancel.done, 20.0) and cancel.result().goals_canceling, "cancel refused"
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_CANCELED
        assert response.result.finish_reason == "cancelled" and response.result.tokens < 30
        assert until(lambda: node.engine.active_requests == 0 and node.engine.pool.held == 0, 10.0,
                     every=topics.observe, period=0.1), "the cancelled request still holds its slot"


def test_an_empty_question_or_more_tokens_than_max_decode_is_aborted_as_rejected(ros_env, random_tiny_dir):
    """Refused goals end at once, and cost no frame: a goal asking for more tokens than the
    node's max_decode (30 here) is refused, not run into a failing frame."""
    from action_msgs.msg import GoalStatus

    prefix = unique_prefix()
    with Ros() as ros:
        node, _ = _node(ros, random_tiny_dir, prefix)
        ask = AskClient(ros, f"{prefix}/ask")
        reasons = []
        for question, max_tokens in (("  ", 0), ("what do you see?", 31)):
            handle, feedback = ask.send(question, max_tokens)
            response = ask.result(handle)
            assert response.status == GoalStatus.STATUS_ABORTED, question
            assert response.result.finish_reason == "rejected" and response.result.tokens == 0 and feedback == []
            reasons.append(response.result.reason)
        # the result says why, so that a client need not read the node's log
        assert reasons == ["no text", "it asks for 31 tokens, more than max_decode=30"]
        assert node.counters["questions_rejected_empty"] == node.counters["questions_rejected_max_tokens"] == 1
        assert node.diagnostics()["questions_rejected"] == 2  # every kind of refusal, on /diagnostics
        assert node.counters["frame_errors"] == 0


def test_oxygen_ask_cancels_a_question_it_stops_waiting_for(ros_env, random_tiny_dir):
    """``oxygen-ask``'s client gives up after its timeout, and cancels the goal: the node
    stops decoding it and frees its KV slot, instead of answering no one. Here no observation
    comes after the first ones and no language-only frame runs, so the answer cannot end
    before the timeout."""
    import rclpy

    from oxygen_ros.tools.ask import ask

    prefix = unique_prefix()
    with Ros() as ros:
        node, _ = _node(ros, random_tiny_dir, prefix, decode_when_idle=False)
        client = rclpy.create_node("oxygen_test_ask_tool", context=ros.context)
        try:
            text, reason, _ = ask(client, f"{prefix}/ask", "describe everything you see in detail", timeout=1.0)
        finally:
            client.destroy_node()
        assert reason == "timeout" and text == ""
        assert until(lambda: node.counters.get("questions_cancelled", 0) == 1, 10.0), node.counters
        assert until(lambda: node.engine.active_requests == 0 and node.engine.pool.held == 0, 10.0), \
            "the abandoned question still holds its slot"


def test_oxygen_ask_at_a_wrong_action_name_lists_the_ask_servers_it_sees(ros_env, random_tiny_dir):
    """With several robots there is one Ask server per robot (``/a/oxygen/ask``): asking the
    plain name finds none, and the client says which ones it sees instead of 'is the agent
    running?' while it runs."""
    import rclpy

    from oxygen_ros.tools.ask import ask, ask_servers

    prefix = unique_prefix()
    with Ros() as ros:
        _node(ros, random_tiny_dir, prefix)
        client = rclpy.create_node("oxygen_test_ask_servers", context=ros.context)
        try:
            assert ask(client, f"{prefix}/no_such_ask", "what do you see?", timeout=0.5)[1] == "no server"
            assert until(lambda: f"{prefix}/ask" in ask_servers(client), 10.0), ask_servers(client)
        finally:
            client.destroy_node()


def test_oxygen_ask_refuses_an_empty_question_itself_saying_so(capsys):
    """``oxygen-ask ""`` (a script whose variable was empty): the client says the question is
    empty, exit 2, instead of the node's generic 'refused the question' after a round trip."""
    import pytest

    from oxygen_ros.tools.ask import main

    with pytest.raises(SystemExit) as exc:
        main(["   "])
    assert exc.value.code == 2
    assert "the question is empty" in capsys.readouterr().err


def test_a_streamed_answer_ends_with_the_text_its_last_feedback_did_not_bring():
    """``oxygen-ask --stream`` prints the feedback as it comes; the result's text completes what
    the last feedback, still in flight when the result came, never printed (it printed 'z' for
    'zero'); a streamed text that is not the answer's start is followed by the whole answer."""
    from oxygen_ros.tools.ask import rest_of_answer

    assert rest_of_answer("zero", "z") == "ero"
    assert rest_of_answer("zero", "zero") == ""
    assert rest_of_answer("zero", "") == "zero"
    assert rest_of_answer("zero", "x") == "\nzero"


def test_a_streamed_answer_that_times_out_ends_its_line_before_the_why(ros_env, capsys, monkeypatch):
    """``--stream`` printed the pieces that came, then the timeout's message went on the same
    line and stdout had no final newline (a review)."""
    from oxygen_ros.tools import ask as ask_tool

    def partial_answer(node, action, question, *, max_tokens, timeout, on_piece, on_note):
        on_piece("upper le")
        return ask_tool.Answer("", "timeout")

    monkeypatch.setattr(ask_tool, "ask", partial_answer)
    assert ask_tool.main(["where is it?", "--stream", "--timeout", "1", "--action", f"{unique_prefix()}/ask"]) == 1
    printed = capsys.readouterr()
    assert printed.out == "upper le\n" and printed.err.startswith("oxygen-ask: no answer from "), printed


def test_oxygen_ask_without_a_server_prints_only_why(ros_env, tmp_path):
    """No answer: stdout stays empty (it had a blank line, printed before the reason)."""
    import subprocess

    from ros_harness import checkout_env, installed_script

    run = subprocess.run([installed_script("oxygen-ask"), "where is it?", "--action", f"{unique_prefix()}/ask",
                          "--timeout", "0.5"], cwd=tmp_path, env=checkout_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1
    assert run.stdout == "", repr(run.stdout)
    assert "oxygen-ask: no Ask server on " in run.stderr, run.stderr


def test_a_burst_of_goals_gets_every_answer_or_refusal(ros_env, random_tiny_dir):
    """40 goals sent at once by one client (a planner asking about every object): with rclpy's
    default service queues (10 deep) the server dropped the goals and result requests past the
    tenth, without a word, and the client waited forever. Every goal now gets its response, and
    every accepted one its result: answered, or refused because the queue is full."""
    from action_msgs.msg import GoalStatus
    from oxygen_ros.action import Ask
    from rclpy.action import ActionClient
    from rclpy.qos import QoSProfile

    import rclpy

    prefix, n = unique_prefix(), 40
    with Ros() as ros:
        _, topics = _node(ros, random_tiny_dir, prefix, queue_limit=16)
        deep = QoSProfile(depth=100)  # the client's own queues hold every response: what is lost, the server lost
        node = rclpy.create_node(f"oxygen_test_burst_{prefix[-6:]}", context=ros.context)
        client = ActionClient(node, Ask, f"{prefix}/ask", goal_service_qos_profile=deep,
                              result_service_qos_profile=deep, cancel_service_qos_profile=deep,
                              feedback_sub_qos_profile=deep, status_sub_qos_profile=deep)
        ros.add(node)
        assert client.wait_for_server(timeout_sec=20.0)
        sent = [client.send_goal_async(Ask.Goal(question=f"where is object {i}?", max_tokens=3)) for i in range(n)]
        assert until(lambda: all(f.done() for f in sent), 30.0, every=topics.observe, period=0.2), \
            f"{sum(f.done() for f in sent)} of {n} goals answered"
        handles = [f.result() for f in sent]
        assert all(h.accepted for h in handles)
        results = [h.get_result_async() for h in handles]
        assert until(lambda: all(r.done() for r in results), 90.0, every=topics.observe, period=0.2), \
            f"{sum(r.done() for r in results)} of {n} results"
        ends = [(r.result().status, r.result().result.finish_reason, r.result().result.reason) for r in results]
        answered = [e for e in ends if e[0] == GoalStatus.STATUS_SUCCEEDED]
        refused = [e for e in ends if e[0] == GoalStatus.STATUS_ABORTED]
        assert len(answered) + len(refused) == n and answered, ends
        assert all(r == "rejected" and "queue" in why for _, r, why in refused), refused


VANISHING_SERVER = """
import sys, threading, time
import rclpy
from rclpy.action import ActionServer
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from oxygen_ros.action import Ask

rclpy.init()
node = rclpy.create_node("oxygen_test_vanishing_ask")
accepted = threading.Event()

def execute(goal):
    accepted.set()
    time.sleep(3600)

server = ActionServer(node, Ask, sys.argv[1], execute_callback=execute, callback_group=ReentrantCallbackGroup())
executor = MultiThreadedExecutor()
executor.add_node(node)
threading.Thread(target=executor.spin, daemon=True).start()
print("serving", flush=True)
accepted.wait()
server.destroy()  # off the graph, its goal never ended: as a node killed while answering looks
print("gone", flush=True)
time.sleep(3600)
"""


def test_oxygen_ask_gives_up_a_question_whose_server_left_the_graph(ros_env):
    """The node serving the question is killed while answering: ``oxygen-ask`` waited out its
    whole ``--timeout`` and said 'no answer within 30 s'. It now notices the server leaving the
    graph, says so, and ends then (here a server that drops off the graph once it accepted the
    goal, without ending it)."""
    import subprocess
    import sys

    import rclpy
    from ros_harness import OutputLines, checkout_env

    from oxygen_ros.tools.ask import ask

    action = f"{unique_prefix()}/ask"
    server = subprocess.Popen([sys.executable, "-c", VANISHING_SERVER, action], env=checkout_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = OutputLines(server)
        assert until(lambda: "serving" in out.text(), 60.0), out.text()
        with Ros() as ros:
            client = rclpy.create_node("oxygen_test_ask_gone", context=ros.context)
            try:
                answer = ask(client, action, "where is the target?", timeout=120.0)
            finally:
                client.destroy_node()
        assert "gone" in out.text(), out.text()
        assert answer == ("", "server gone", ""), answer  # not "timeout", 120 s later
    finally:
        server.kill()
        server.wait(10)


def test_oxygen_ask_says_a_question_whose_server_left_is_lost(ros_env, capsys, monkeypatch):
    """What ``oxygen-ask`` prints for it: why, on stderr, exit 1."""
    from oxygen_ros.tools import ask as ask_tool

    monkeypatch.setattr(ask_tool, "ask", lambda *args, **kwargs: ask_tool.Answer("", "server gone"))
    assert ask_tool.main(["where is it?", "--action", "/r1/oxygen/ask"]) == 1
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err == ("oxygen-ask: /r1/oxygen/ask left the ROS graph before it answered (its node ended or was "
                           "killed); the question is lost with it\n"), printed.err
