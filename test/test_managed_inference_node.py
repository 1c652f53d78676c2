"""The managed (lifecycle) inference node through the lifecycle services, on real DDS:
unconfigured -> configure -> inactive (nothing published) -> activate (actions and text)
-> deactivate (publishing stops, a running request is kept) -> activate (it goes on)
-> cleanup (requests cancelled, the pool freed) -> shutdown."""

from __future__ import annotations

import time
import weakref

import pytest
from ros_harness import (AskClient, InferenceClient, Lifecycle, Ros, inference_topics, params, reliable,
                         stall_in_prefill, unique_prefix, until)


def _node(ros, prefix, model_dir, **overrides):
    from oxygen_ros.ros.managed_inference_node import ManagedInferenceNode

    values = {**inference_topics(prefix), "ask_action": f"{prefix}/ask", "model_path": model_dir,
              "language_every_n_frames": 0, "max_decode": 30, "warmup_frames": 0, **overrides}
    return ros.add(ManagedInferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(**values)))


def test_lifecycle_transitions_gate_publishing_and_own_the_pool(ros_env, random_tiny_dir):
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, autostart=False)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.state() == "unconfigured" and not node.configured  # no model yet
        handle, _ = AskClient(ros, f"{prefix}/ask").send("what do you see?")  # its server is there already
        assert not handle.accepted, "an unconfigured node accepted a goal"

        assert life.change("configure") and life.state() == "inactive"
        client = InferenceClient(ros, prefix)
        client.publish_observations(1.0, rate_hz=10.0)
        assert client.chunks == [], "an inactive node published actions"

        assert life.change("activate") and life.state() == "active"
        assert until(lambda: client.chunks, 30.0, every=client.observe, period=0.1), "no actions once active"
        client.ask("q1", "describe everything you see in great detail")
        assert until(lambda: [m for m in client.text if m.client_id == "q1"], 30.0, every=client.observe,
                     period=0.1), "no text once active"

        assert life.change("deactivate") and life.state() == "inactive"
        time.sleep(0.5)  # what was in flight arrives
        chunks, tokens = len(client.chunks), len(client.text)
        client.publish_observations(1.0, rate_hz=10.0)
        assert len(client.chunks) == chunks and len(client.text) == tokens, "published while inactive"
        running = node.engine.active_requests
        assert running == 1 or client.finished("q1"), "the running request was dropped by deactivate"

        assert life.change("activate") and life.state() == "active"
        assert until(lambda: client.finished("q1"), 60.0, every=client.observe, period=0.1), \
            "the kept request did not finish after activate"
        assert len(client.chunks) > chunks

        client.ask("q2", "describe everything you see in great detail")
        assert until(lambda: node.engine.active_requests == 1, 30.0, every=client.observe, period=0.1)
        pool = weakref.ref(node.engine.pool)  # configure froze the model's objects out of the collector's reach
        assert life.change("deactivate") and life.change("cleanup") and life.state() == "unconfigured"
        assert until(lambda: [m.finish_reason for m in client.finished("q2")] == ["cancelled"], 10.0)
        assert not node.configured and not hasattr(node, "engine"), "cleanup kept the engine and its pool"
        assert pool() is None, "cleanup did not free the KV pool's memory"

        assert life.change("configure") and life.state() == "inactive"  # configure again after cleanup
        assert node.engine.active_requests == 0
        assert life.change("inactive_shutdown") and life.state() == "finalized"


@pytest.mark.parametrize("control_process", [True, False], ids=["control process", "tick thread"])
def test_nothing_computed_before_a_deactivate_goes_out_after_the_next_activate(ros_env, random_tiny_dir,
                                                                              control_process):
    """The frame in flight at deactivate still ends, but its chunk, and every chunk before it,
    is dropped: after activate, without a new observation, no ActionChunk is published, not
    replayed from its first row (chunk_origin frame_end) nor held at its last (hold_action last).
    The time inactive is no missed tick: counted as missed, the 1 s pause alone would be 49 (a
    loaded machine misses a few of its own: 12 seen in a run beside three busy loops, 2 cores)."""
    prefix = unique_prefix()
    with Ros() as ros:
        # an observation still waiting at deactivate is served after activate while fresher than
        # max_observation_age (as designed): 0.3 s, so that the 1 s pause leaves none
        node = _node(ros, prefix, random_tiny_dir, chunk_origin="frame_end", hold_action="last",
                     control_process=control_process, max_observation_age=0.3)
        client = InferenceClient(ros, prefix)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert until(lambda: len(client.chunks) > 5, 30.0, every=client.observe, period=0.05)
        client.observe()  # a frame is likely in flight now
        assert life.change("deactivate")
        time.sleep(1.0)  # 50 ticks of the timer
        assert life.change("activate")
        time.sleep(0.3)  # what was in flight before the activate has arrived
        seen = len(client.chunks)
        time.sleep(1.0)  # 50 ticks, and no new observation
        assert len(client.chunks) == seen, [(m.frame_id, m.offset) for m in client.chunks[seen:]][:10]
        assert until(lambda: len(client.chunks) > seen, 30.0, every=client.observe, period=0.1)  # fresh ones go
        assert node.counters["missed_ticks"] < 25


def test_the_first_status_after_an_activate_is_not_about_what_happened_before(ros_env, random_tiny_dir):
    """Underruns counted before a deactivate (the chunk ran out: no more observations) are not
    reported again as new by the first status after the activate."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, control_rate_hz=200.0)  # underruns come fast
        client = InferenceClient(ros, prefix)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert until(lambda: len(client.chunks) > 5, 30.0, every=client.observe, period=0.05)
        assert until(lambda: node.diagnostics()["underruns"] > 0, 10.0)  # no observation since: it ran out
        node.diagnostic_status()  # a status now: what follows is news to the next one
        before = node.diagnostics()["underruns"]
        assert until(lambda: node.diagnostics()["underruns"] >= before + 10, 10.0, period=0.005)
        assert life.change("deactivate") and life.change("activate")
        level, message = node.diagnostic_status()
        assert "underruns" not in message, message


def test_an_activate_without_a_control_process_fails_and_the_node_stays_inactive(ros_env, random_tiny_dir):
    """The control process died while the node was inactive: activate cannot tick, so the
    transition fails (instead of an active node that publishes nothing); cleanup and configure
    start a new one."""
    import os
    import signal

    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("deactivate")
        pid = node.control_pid
        os.kill(pid, signal.SIGKILL)
        assert until(lambda: node.tick_unavailable() is not None, 10.0)
        assert not life.change("activate") and life.state() == "inactive"
        assert "killed by signal 9" in node.tick_unavailable()
        assert life.change("cleanup") and life.change("configure") and life.change("activate")
        assert node.control_pid not in (None, pid) and life.state() == "active"


def _goal_decoding(ros, prefix, model_dir):
    """An active managed node, its lifecycle client, an observation client and an Ask client
    whose long goal decodes now: (node, client, life, ask, handle)."""
    node = _node(ros, prefix, model_dir)
    client = InferenceClient(ros, prefix)
    life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
    assert until(lambda: client.chunks, 30.0, every=client.observe, period=0.1)
    ask = AskClient(ros, f"{prefix}/ask")
    handle, feedback = ask.send("describe everything you see in great detail")
    assert handle.accepted
    assert until(lambda: feedback, 30.0, every=client.observe, period=0.1), "no feedback"
    return node, client, life, ask, handle


def test_an_ask_goal_running_at_cleanup_gets_its_result_and_goals_wait_for_configure(ros_env, random_tiny_dir):
    """A cleanup ends a running goal with a result (aborted, ``cancelled``: the client did not
    cancel it) instead of leaving its client waiting; an unconfigured node rejects goals at
    once; configured and active again, it answers them."""
    from action_msgs.msg import GoalStatus

    prefix = unique_prefix()
    with Ros() as ros:
        node, client, life, ask, handle = _goal_decoding(ros, prefix, random_tiny_dir)
        assert life.change("deactivate") and life.change("cleanup")
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_ABORTED and response.result.finish_reason == "cancelled"
        assert 0 < response.result.tokens < 30 and response.result.reason == "ended by the node's cleanup"

        handle, _ = ask.send("what do you see?")
        assert not handle.accepted, "an unconfigured node accepted a goal"

        assert life.change("configure") and life.change("activate")
        assert until(lambda: node.engine.frame_id > 0, 30.0,
                     every=client.observe, period=0.1)
        handle, _ = ask.send("what do you see?", max_tokens=3)
        assert handle.accepted
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_SUCCEEDED and 0 < response.result.tokens <= 3


def test_an_ask_goal_cancelled_while_the_node_is_inactive_ends_at_once(ros_env, random_tiny_dir):
    """Deactivated, the node runs no frame; a client's cancel still ends its goal (canceled)
    and frees the request's slot then, not at the next activate."""
    from action_msgs.msg import GoalStatus

    prefix = unique_prefix()
    with Ros() as ros:
        node, client, life, ask, handle = _goal_decoding(ros, prefix, random_tiny_dir)
        assert life.change("deactivate") and node.engine.active_requests == 1
        cancel = handle.cancel_goal_async()
        assert until(cancel.done, 20.0) and cancel.result().goals_canceling, "cancel refused"
        response = ask.result(handle)
        assert response.status == GoalStatus.STATUS_CANCELED and response.result.finish_reason == "cancelled"
        assert life.state() == "inactive" and node.engine.active_requests == 0 and node.engine.pool.held == 0


def test_diagnostics_say_inactive_while_the_manager_keeps_the_node_inactive(ros_env, random_tiny_dir, capfd):
    """A monitor tells a node its manager paused from a dead one: configured and inactive, the
    node publishes a status that says so (and the questions waiting for activate, logged as kept,
    and the requests it keeps), the full one once active, and after a cleanup one that says it
    is unconfigured."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, autostart=False)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("configure")
        client = InferenceClient(ros, prefix)

        def inactive(status) -> bool:
            return status.message.startswith("inactive (lifecycle)")

        assert until(lambda: any(map(inactive, client.diagnostics)), 10.0), "no status while inactive"
        status = next(filter(inactive, client.diagnostics))
        values = {v.key: v.value for v in status.values}
        assert status.level == b"\x00" and values["lifecycle_state"] == "inactive" and values["active_requests"] == "0"
        assert values["questions_waiting"] == "0"
        client.ask("paused", "what do you see?")  # a client of a paused node hears nothing until activate
        seen = len(client.diagnostics)
        assert until(lambda: any(inactive(s) and "1 questions waiting" in s.message
                                 for s in client.diagnostics[seen:]), 10.0), [s.message for s in client.diagnostics]
        status = next(s for s in client.diagnostics[seen:] if "1 questions waiting" in s.message)
        assert {v.key: v.value for v in status.values}["questions_waiting"] == "1", status
        assert "question from 'paused' kept: the node is inactive (lifecycle)" in capfd.readouterr().err
        client.observe()  # kept too: the first frame after activate answers from it
        assert life.change("activate")
        assert until(lambda: client.finished("paused"), 20.0, every=client.observe, period=0.1), \
            "the question kept while inactive was not answered after activate"
        assert client.finished("paused")[0].finish_reason in ("eos", "length"), client.finished("paused")
        seen = len(client.diagnostics)
        assert until(lambda: any(not inactive(s) for s in client.diagnostics[seen:]), 10.0, every=client.observe,
                     period=0.1), "no full status once active"
        assert life.change("deactivate")
        seen = len(client.diagnostics)
        assert until(lambda: any(map(inactive, client.diagnostics[seen:])), 10.0), "no inactive status again"
        assert life.change("cleanup")
        time.sleep(0.5)  # what was on its way
        seen = len(client.diagnostics)
        assert until(lambda: len(client.diagnostics) > seen + 1, 10.0), "no status once unconfigured"
        for status in client.diagnostics[seen:]:
            assert status.message == "unconfigured (lifecycle): waiting for the configure transition", status
            assert status.level == b"\x00" and {v.key: v.value for v in status.values}["lifecycle_state"] == \
                "unconfigured"


def test_with_several_robots_each_robot_s_status_says_inactive_too(ros_env, random_tiny_dir):
    """A monitor (or a diagnostic aggregator) that watches one robot's status sees it paused by
    the manager, as the node's own: it does not just stop coming while the node is inactive."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, autostart=False, robots=["a", "b"])
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("configure")
        from diagnostic_msgs.msg import DiagnosticArray

        statuses = []
        ros.node("oxygen_test_monitor").create_subscription(
            DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), reliable(50))
        names = [f"{prefix[1:]}/oxygen_inference: {who}" for who in ("engine", "robot a", "robot b")]

        def inactive() -> dict:
            return {s.name: s for s in statuses if s.message.startswith("inactive (lifecycle)")}

        assert until(lambda: set(names) <= set(inactive()), 10.0), [s.name for s in statuses]
        robot_b = {v.key: v.value for v in inactive()[names[2]].values}
        assert robot_b == {"lifecycle_state": "inactive", "robot": "b"}


def test_a_transition_its_state_lacks_is_refused_with_a_warning_and_the_node_goes_on(ros_env, random_tiny_dir,
                                                                                    capfd):
    """``activate`` while unconfigured is answered false, naming the transition by id and
    label, the state and what it allows (by id too: the shutdown from active is not the one an
    unconfigured node has);
    the node still answers and configures after it (Jazzy's rclpy raised in the service: no
    answer, and the exception ended the executor's spin)."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, autostart=False)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert not life.change("activate") and life.state() == "unconfigured"
        assert not life.change("deactivate") and life.state() == "unconfigured"
        assert not life.change("active_shutdown") and life.state() == "unconfigured"  # shutdown, but from active
        assert life.change("configure") and life.state() == "inactive"
        lines = [line for line in capfd.readouterr().err.splitlines() if " refused: not a transition" in line]
        assert len(lines) == 3, lines
        assert "transition 3 (activate) refused: not a transition of state unconfigured" in lines[0], lines
        assert "(it has: configure (id 1), shutdown (id 5))" in lines[0], lines[0]
        assert "transition 7 (shutdown) refused" in lines[2], lines[2]  # the id tells it from the shutdown it has


def test_a_configure_that_fails_names_the_cause_and_stays_unconfigured(ros_env, tmp_path):
    """The cause is on /diagnostics too, as ERROR, for a monitor that does not read the log
    (with several robots, in each robot's status as well)."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, str(tmp_path / "no_such_model"), autostart=False, robots=["a", "b"])
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        from diagnostic_msgs.msg import DiagnosticArray

        statuses = []
        ros.node("oxygen_test_monitor").create_subscription(
            DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), reliable(50))
        assert until(lambda: statuses, 10.0), "no status before the configure"
        assert statuses[0].message == "unconfigured (lifecycle): waiting for the configure transition"
        assert not life.change("configure")
        assert life.state() == "unconfigured"
        assert "no_such_model" in str(node.configure_error)
        seen = len(statuses)
        names = {f"{prefix[1:]}/oxygen_inference: {who}" for who in ("engine", "robot a", "robot b")}
        assert until(lambda: {s.name for s in statuses[seen:] if s.level == b"\x02"} == names, 10.0), \
            [(s.name, s.level, s.message) for s in statuses[seen:]]
        engine = next(s for s in statuses[seen:] if s.name == f"{prefix[1:]}/oxygen_inference: engine")
        assert engine.message.startswith("unconfigured (lifecycle): the last configure failed: ")
        assert "no_such_model" in engine.message
        values = {v.key: v.value for v in engine.values}
        assert values["lifecycle_state"] == "unconfigured" and "no_such_model" in values["configure_error"]


def test_with_autostart_a_failed_configure_ends_the_start_with_its_cause(ros_env, tmp_path):
    """What the launch file relies on: with autostart the node that cannot configure does not
    linger unconfigured, its construction fails with the cause (main: non-zero exit)."""
    import pytest

    from oxygen_ros.ros.parameters import ParameterError

    with Ros() as ros:
        with pytest.raises(ParameterError, match="control_rate_hz"):
            _node(ros, unique_prefix(), "", control_rate_hz=-5.0)
        with pytest.raises(Exception, match="no_such_model"):
            _node(ros, unique_prefix(), str(tmp_path / "no_such_model"))


def test_with_use_sim_time_a_node_deactivated_before_its_shutdown_finalizes_and_cancels_what_waits(
        ros_env, random_tiny_dir):
    """A lifecycle manager's usual order (nav2's: deactivate, then shutdown) with simulated
    time: the tick's companion node, destroyed at deactivate, is not stopped a second time
    (that raised, so the shutdown ended in ErrorProcessing, unconfigured, with the waiting
    question never answered, and the node could not be destroyed)."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, use_sim_time=True)
        client = InferenceClient(ros, prefix)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("deactivate") and life.state() == "inactive"
        client.ask("q1", "what do you see?")  # waits: an inactive node runs no frame
        assert until(lambda: node.diagnostics()["questions_received"] >= 1, 10.0)
        assert life.change("inactive_shutdown") and life.state() == "finalized"
        assert until(lambda: [m.finish_reason for m in client.finished("q1")] == ["cancelled"], 10.0)
        ros.remove(node)  # destroy_node: raised InvalidHandle


def test_with_autostart_a_refused_activate_ends_the_start_with_its_cause(ros_env, random_tiny_dir, monkeypatch):
    """The control process dies between the configure and the activate of an autostart (the
    OOM killer, a crash): the start fails naming why, instead of leaving an inactive node that
    publishes no action and no status, which nothing would ever activate."""
    import os
    import signal

    import pytest

    from oxygen_ros.ros import control_link

    start = control_link.ControlLink.start
    pids = []

    def start_then_killed(link, period_ns):
        start(link, period_ns)
        pids.append(link.pid)
        os.kill(link.pid, signal.SIGKILL)
        assert until(lambda: link.failure is not None, 10.0)  # the node sees it gone

    monkeypatch.setattr(control_link.ControlLink, "start", start_then_killed)
    with Ros() as ros:
        with pytest.raises(RuntimeError, match="activate failed: the control process was killed by signal 9"):
            _node(ros, unique_prefix(), random_tiny_dir)
    assert pids and not os.path.exists(f"/proc/{pids[0]}")


@pytest.mark.parametrize("control_process", [True, False], ids=["control process", "tick thread"])
def test_a_frame_that_outlasts_the_deactivate_blocks_activate_and_cleanup_and_its_chunk_never_goes_out(
        ros_env, random_tiny_dir, control_process):
    """The frame in flight at a deactivate runs past the wait for it (a recompile, a stalled GPU):
    activate and cleanup are refused while it runs (a second worker would share the engine),
    and when it ends its chunk, computed before the deactivate, is not published after the
    next activate (it went out 1.5 s after it, held at its last row)."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, chunk_origin="frame_end", hold_action="last",
                     control_process=control_process, max_observation_age=0.3)
        node.worker_stop_timeout_s = 0.5
        client = InferenceClient(ros, prefix)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert until(lambda: len(client.chunks) > 3, 30.0, every=client.observe, period=0.05)
        entered, release = stall_in_prefill(node.engine)
        assert until(entered.is_set, 10.0, every=client.observe, period=0.05)
        assert life.change("deactivate") and life.state() == "inactive"  # after its 0.5 s wait
        assert not life.change("activate") and life.state() == "inactive"
        assert "still in the frame" in node.activate_error
        assert not life.change("cleanup") and life.state() == "inactive"
        node.engine.pause_point = None
        release.set()
        assert until(lambda: node.worker_still_running() is None, 10.0)
        seen = len(client.chunks)
        assert life.change("activate") and life.state() == "active"
        time.sleep(1.0)  # 50 ticks, and no new observation
        assert len(client.chunks) == seen, [(m.frame_id, m.offset) for m in client.chunks[seen:]][:10]
        assert until(lambda: len(client.chunks) > seen, 30.0, every=client.observe, period=0.1)  # fresh ones go


def test_a_goal_or_question_that_comes_while_cleanup_cancels_gets_its_end(ros_env, random_tiny_dir):
    """A cleanup announces its cancellations (up to a second's wait for the text's subscribers)
    while the node's executor thread still takes goals and questions: one that came then was
    accepted into the loop the cleanup was about to delete, and never ended (the goal stayed
    executing even after the next configure). Now the inputs close first: the goal is refused
    at once and the question gets its ``rejected`` end. The goal and the question are sent from
    inside the cleanup's announcement, so that they land in that window every time."""
    from action_msgs.msg import GoalStatus
    from rclpy.lifecycle import TransitionCallbackReturn

    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir)
        client = InferenceClient(ros, prefix)
        ask = AskClient(ros, f"{prefix}/ask")
        assert until(lambda: client.chunks, 30.0, every=client.observe, period=0.1)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("deactivate")
        announce, sent = node._announce_cancellations, {}

        def announce_then_ask(events, why):
            announce(events, why)
            if why == "cleanup":
                client.ask("late-question", "what do you see?")
                sent["goal"], _ = ask.send("what do you see?")

        node._announce_cancellations = announce_then_ask
        # the transition on this thread, the goal and the question on the node's executor thread
        # (as with a multi-threaded executor: a service call there would wait for that thread)
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS and life.state() == "unconfigured"
        goal = sent["goal"]
        if goal.accepted:  # refused at once now; accepted before, it had to end all the same
            result = goal.get_result_async()
            assert until(result.done, 10.0), "a goal accepted during the cleanup never ended"
            assert result.result().status == GoalStatus.STATUS_ABORTED
        assert until(lambda: [m.finish_reason for m in client.finished("late-question")] == ["rejected"], 10.0)


def test_a_transition_that_raises_stops_the_node_and_leaves_it_finalized(ros_env, random_tiny_dir):
    """rclpy turns an exception in a transition into ErrorProcessing without a word; the node
    stops everything, as at shutdown, and ends finalized: a half-done transition is no clean
    unconfigured state (a configure after it made a second set of subscriptions, and at exit
    the old worker was never stopped)."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir)
        client = InferenceClient(ros, prefix)
        assert until(lambda: client.chunks, 30.0, every=client.observe, period=0.1)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        def broken():  # a fault before anything of the deactivate was done
            raise RuntimeError("injected fault in deactivate")

        node.deactivate = broken
        assert not life.change("deactivate")
        assert life.state() == "finalized"
        assert not node.worker.alive and node.diagnostics_timer.is_canceled()
        assert not life.change("configure") and life.state() == "finalized"


def _set(ros, full_name: str, **values):
    """``ros2 param set`` through the node's SetParameters service: {name: (successful, reason)}."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    client = ros.node("oxygen_test_param_client").create_client(SetParameters, f"{full_name}/set_parameters")
    assert client.wait_for_service(timeout_sec=10.0)
    request = SetParameters.Request(parameters=[Parameter(k, value=v).to_parameter_msg() for k, v in values.items()])
    future = client.call_async(request)
    assert until(future.done, 10.0), "set_parameters did not answer"
    return {k: (r.successful, r.reason) for k, r in zip(values, future.result().results)}


def test_a_parameter_read_at_configure_changes_while_unconfigured_and_the_next_configure_reads_it(
        ros_env, tmp_path, random_tiny_dir):
    """A configure failed for a wrong model_path: the right one is set and the next configure
    loads it, without a restart. While configured such a change is refused, saying how; the
    parameters the node holds for its life stay read-only."""
    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, str(tmp_path / "no_such_model"), autostart=False, max_active=4)
        name = node.get_fully_qualified_name()
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), name)
        assert not life.change("configure") and "no_such_model" in str(node.configure_error)

        assert _set(ros, name, model_path=random_tiny_dir, max_active=2) == {"model_path": (True, ""),
                                                                            "max_active": (True, "")}
        assert life.change("configure") and life.state() == "inactive"
        assert node.engine.config.max_active == 2

        refused = _set(ros, name, max_active=3, robots=["a"])
        assert refused["max_active"][0] is False
        assert "is read at configure: it changes only while the node is unconfigured (deactivate, cleanup, " \
               "set it, configure)" in refused["max_active"][1]
        assert refused["robots"][0] is False  # read-only for the node's life (its Ask servers)
        assert node.engine.config.max_active == 2
        assert _set(ros, name, max_active=2)["max_active"] == (True, "")  # as it is: a dump loaded back
        # the clock stays as the node started: its timers would wait for a /clock
        sim = _set(ros, name, use_sim_time=True)["use_sim_time"]
        assert sim[0] is False and "'use_sim_time' is read at start" in sim[1]
        assert until(lambda: node.diagnostics_timer is not None and node.get_clock().now().nanoseconds > 0, 5.0)

        assert life.change("cleanup") and life.state() == "unconfigured"
        assert _set(ros, name, max_active=3)["max_active"] == (True, "")
        assert _set(ros, name, max_active=0)["max_active"][0] is False  # checked as at start
        assert life.change("configure") and node.engine.config.max_active == 3
        assert node.params["model_path"] == random_tiny_dir


def test_oxygen_ask_says_the_node_is_paused_and_why_its_question_ended(ros_env, random_tiny_dir):
    """``oxygen-ask`` at a node its manager keeps inactive: accepted, its question waits (for
    activate) and the client says so at once, instead of a silent wait for its timeout; a cleanup
    then ends the question, and the client names the node's reason, not a bare 'cancelled'."""
    import subprocess

    from ros_harness import OutputLines, checkout_env, installed_script

    prefix = unique_prefix()
    with Ros() as ros:
        node = _node(ros, prefix, random_tiny_dir, autostart=False)
        life = Lifecycle(ros.node("oxygen_test_lifecycle"), node.get_fully_qualified_name())
        assert life.change("configure")
        tool = subprocess.Popen([installed_script("oxygen-ask"), "what do you see?", "--action", f"{prefix}/ask",
                                 "--timeout", "60"], env=checkout_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # no answer comes: the output is the notes
        try:
            err = OutputLines(tool)
            paused = (f"oxygen-ask: note: {node.get_fully_qualified_name()}, which serves {prefix}/ask, is inactive "
                      "(lifecycle): it keeps the question and answers it after its activate transition")
            assert until(lambda: paused in err.text(), 30.0), err.text()
            assert node.loop.questions_waiting() == 1
            assert life.change("cleanup")
            assert tool.wait(20) == 1
        finally:
            if tool.poll() is None:
                tool.kill()
        assert err.join().endswith(f"oxygen-ask: {prefix}/ask ended the question without an answer: ended by the "
                                   "node's cleanup\n"), err.text()
