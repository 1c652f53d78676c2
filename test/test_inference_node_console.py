"""What the inference node says on the console without anyone watching /diagnostics:
no observation after start, underruns, a stale camera; throttled; topics by their
resolved names.

The status rules are checked on their own (:class:`StatusReporter`, a clock of the
test's), then once on real DDS through /rosout.
"""

from __future__ import annotations

from ros_harness import InferenceClient, Ros, inference_node, stall_in_prefill, unique_prefix, until

from oxygen_ros.ros.inference_status import CONSOLE_PERIOD_S, NO_OBSERVATION_WARN_S, StatusReporter


def _figures(**changes) -> dict:
    """Figures of a healthy running node (the keys StatusReporter reads)."""
    d = {"underruns": 0, "missed_ticks": 0, "observations_stale": 0, "hold_ticks": 0, "frame_errors": 0,
         "actions_non_finite": 0, "recompiles": 0, "faulted": False, "consecutive_failures": 0, "last_failure": "",
         "observation_age_ms": 50.0, "observations_received": 10, "frames": 10, "k": 5, "k_max": 5,
         "frame_deadline_ms": 100.0, "action_frequency_hz": 60.0, "control_rate_hz": 50.0,
         "frame_latency_ms": 10.0, "tokens_per_s": 100.0, "worker_load": 0.3, "compiled": False,
         "observations_invalid": 0, "chunks_from_frame_end": 0, "horizon": 10, "capture_to_action_ms": 40.0,
         "observation_interval_ms": 100.0, "chunk_origin": "observation"}
    d.update(changes)
    return d


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_no_observation_is_told_after_the_grace_naming_the_topic():
    clock = Clock()
    status = StatusReporter("/robot/oxygen/observation", clock=clock)
    idle = _figures(frames=0, observations_received=0, observation_age_ms=float("nan"))
    status.status(idle, 1.0)
    assert status.console() == []  # start-up: not yet
    clock.t += NO_OBSERVATION_WARN_S
    status.status(idle, 1.0)
    (line,) = status.console()
    assert line.startswith("no observation on /robot/oxygen/observation 5 s after start")
    clock.t += 1.0
    status.status(idle, 1.0)
    assert status.console() == []  # throttled
    clock.t += CONSOLE_PERIOD_S
    status.status(idle, 1.0)
    (line,) = status.console()
    assert "more such seconds since the last report" in line


def test_observations_whose_frames_fail_are_not_told_as_no_observation():
    """A checkpoint whose actions are not finite fails every frame: the console said "no observation
    on /oxygen/observation" beside the frame failures, sending the user to the camera."""
    clock = Clock()
    status = StatusReporter("/oxygen/observation", clock=clock)
    failing = _figures(frames=0, observations_received=40, actions_non_finite=40)
    clock.t += NO_OBSERVATION_WARN_S
    level, message = status.status(failing, 1.0)
    assert "no observation" not in message and "non-finite" in message
    assert not any("no observation" in line for line in status.console())


def test_refused_observations_are_told_as_refused_not_as_a_camera_that_is_not_there():
    """Every observation refused (7 joints for a model of 2): the status said "no observation frame
    yet" and "no fresh observation (camera drop-out?)" while 122 had come and been refused."""
    clock = Clock()
    status = StatusReporter("/oxygen/observation", clock=clock)
    status.status(_figures(frames=0, observations_received=0, observations_invalid=0), 1.0)
    clock.t += NO_OBSERVATION_WARN_S
    level, message = status.status(_figures(frames=0, observations_received=60, observations_invalid=60,
                                            observation_age_ms=1400.0), 1.0)
    assert message == "60 observations refused (the log says why)", message
    assert status.console() == []  # the node logs each refusal's reason itself


def test_underruns_and_a_stale_camera_are_told_and_quiet_seconds_are_not():
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    status.status(_figures(), 1.0)
    assert status.console() == []
    clock.t += 1.0
    status.status(_figures(underruns=7, observation_age_ms=2500.0), 1.0)
    lines = status.console()
    assert any(line.startswith("7 underruns in the last second") for line in lines), lines
    assert any("no fresh observation for 2.5 s" in line for line in lines), lines
    clock.t += 1.0
    level, message = status.status(_figures(underruns=7), 1.0)  # no new underrun, fresh observations again
    assert status.console() == []
    # the tick rate first: f = H/T, what the frames could serve, read as the output's rate in a walkthrough
    assert message == "ticks 50 Hz, f=H/T 60 Hz, frame 10.0 ms, 100 tok/s", message
    # what is not for the console: a shrunken language budget is in /diagnostics only
    clock.t += 10.0
    level, message = status.status(_figures(underruns=7, k=2), 1.0)
    assert "language budget k=2" in message and status.console() == []


def test_observations_that_come_too_old_are_told_by_the_limit_not_as_a_camera_drop_out():
    """Observations every 100 ms with max_observation_age 1 ms (a walkthrough): each came and
    was too old, and the status said 'no fresh observation for 0.0 s (a camera drop-out ...)' for
    a newest one 47.8 ms old. It names the limit and the ages in milliseconds instead."""
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    status.status(_figures(), 0.001)
    clock.t += 1.0
    level, message = status.status(_figures(observations_stale=10, observation_age_ms=47.8), 0.001)
    assert message == ("10 stale observations not used: older than max_observation_age (1.0 ms) when a frame would "
                       "start from them; the newest 47.8 ms old (a slow camera side or network, a sender's clock "
                       "behind this node's, or the limit too small: the log says how old each was on arrival)"), message
    assert "drop-out" not in message and status.console() == []  # the frame loop logs each one's age itself
    clock.t += 1.0  # none comes any more: that is a drop-out, told as one
    level, message = status.status(_figures(observations_stale=10, observation_age_ms=2500.0), 0.001)
    assert message.startswith("no fresh observation for 2.5 s (a camera drop-out"), message


def test_a_restart_counts_from_then_on():
    """An activate after a deactivate: what happened before it is not news, and a missing
    observation has its grace again."""
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    status.status(_figures(), 1.0)
    clock.t += 60.0
    status.restart(_figures(underruns=12, frame_errors=2, frames=0, observations_received=0,
                            observation_age_ms=float("nan")))
    clock.t += 1.0
    level, message = status.status(_figures(underruns=12, frame_errors=2, frames=0, observations_received=0,
                                            observation_age_ms=float("nan")), 1.0)
    assert "underruns" not in message and "failed" not in message
    assert status.console() == []  # no observation yet, but within the grace after the restart


def test_underruns_of_an_overloaded_worker_say_so_and_what_helps():
    """Frames back to back (more observations than the model keeps up with): the underrun
    warning says so, with the remedy; compile:=on only where the model runs eager."""
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    status.status(_figures(), 1.0)
    clock.t += 1.0
    level, message = status.status(_figures(underruns=3, worker_load=0.93, frame_latency_ms=28.14), 1.0)
    (line,) = status.console()
    assert line.startswith("3 underruns in the last second: the chunk ran out before the next one (the frame "
                           "worker ran frames 93% of the time, 28.1 ms each"), line
    assert "compile:=on, fewer robots or a lower camera rate" in line and line.endswith("(see /diagnostics)")
    assert "ran frames 93% of the time" in message
    clock.t += 10.0
    status.status(_figures(underruns=5, worker_load=0.93, compiled=True), 1.0)
    (line,) = status.console()
    assert "ran frames 93%" in line and "compile:=on" not in line and "fewer robots" in line
    clock.t += 10.0  # the worker had time to spare: the chunks ran out for another reason
    status.status(_figures(underruns=6, worker_load=0.5), 1.0)
    (line,) = status.console()
    assert "frame worker" not in line and line.startswith("1 underruns in the last second"), line


def test_underruns_of_observations_that_come_late_say_so():
    """Camera images stamped 150 ms before they were sent (a walkthrough): each chunk first went out
    about 170 ms after its stamp, at row 8 of 10, and ran out 60 ms before the next one came. The
    node warned of underruns without a cause; it now names the delay, what is left of the chunk and
    the observations' spacing. A short delay, or one the chunk outlasts, has no such cause."""
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    status.status(_figures(), 1.0)
    clock.t += 1.0
    level, message = status.status(_figures(underruns=15, capture_to_action_ms=172.4), 1.0)
    assert message == ("15 underruns (late observations: each chunk first goes out 172 ms after its observation's "
                       "stamp, so its rows for that time are skipped and the rest last 28 ms of its 200, against "
                       "100 ms between observations; a camera side or network that delivers late, or a slow frame: "
                       "see the frame time; chunk_origin: frame_end keeps every row, uncompensated)"), message
    (line,) = status.console()
    assert line.startswith("15 underruns in the last second: the chunk ran out before the next one (late "), line
    for delay, interval, origin in ((40.0, 100.0, "observation"), (172.4, 20.0, "observation"),
                                    (float("nan"), 100.0, "observation"), (250.0, 100.0, "observation"),
                                    (172.4, 100.0, "frame_end")):  # (frame_end skips no row)
        clock.t += 10.0
        figures = _figures(underruns=15 + int(clock.t), capture_to_action_ms=delay, observation_interval_ms=interval,
                           chunk_origin=origin)
        assert "late observations" not in status.status(figures, 1.0)[1], (delay, interval, origin)


def _node_logs(ros, prefix: str) -> list[str]:
    """The /rosout messages of the nodes under ``prefix``, as they come (a list that grows)."""
    from rcl_interfaces.msg import Log
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    logs = []
    ros.node("oxygen_test_rosout").create_subscription(
        Log, "/rosout", lambda m: logs.append(m.msg) if prefix[1:] in m.name else None,
        QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    return logs


def test_the_console_tells_a_missing_camera_and_underruns(ros_env):
    """On real DDS: the node warns that no observation came on its (namespaced) topic, then,
    once observations came and stopped, that the chunk ran out."""
    prefix = unique_prefix()
    with Ros() as ros:
        logs = _node_logs(ros, prefix)
        inference_node(ros, prefix, max_observation_age=0.5, hold_action="none")
        client = InferenceClient(ros, prefix)
        assert until(lambda: any(f"no observation on {prefix}/observation" in line for line in logs), 30.0), logs
        client.publish_observations(2.0, rate_hz=10.0)
        assert until(lambda: client.chunks, 20.0)
        assert until(lambda: any("underruns in the last second" in line for line in logs), 30.0), logs


def test_a_silent_control_tick_is_an_error_only_when_silent_for_longer_than_its_period_explains():
    """1 s without a tick is a stopped tick at 50 Hz; at control_rate_hz 0.5 ticks are 2 s
    apart, and the same silence was a false ERROR saying that no action goes out."""
    from diagnostic_msgs.msg import DiagnosticStatus

    status = StatusReporter("/o", clock=Clock())
    level, message = status.status(_figures(control_silent_s=1.5), 1.0)
    assert level == DiagnosticStatus.ERROR and "control tick silent for 1.5 s" in message
    level, message = status.status(_figures(control_silent_s=2.0, control_rate_hz=0.5), 1.0)
    assert level != DiagnosticStatus.ERROR and "silent" not in message, message
    level, message = status.status(_figures(control_silent_s=6.5, control_rate_hz=0.5), 1.0)
    assert level == DiagnosticStatus.ERROR and "control tick silent for 6.5 s" in message


def test_a_frame_in_flight_far_longer_than_frames_take_is_an_error_naming_how_long():
    """A frame that never ends (a stalled GPU) shows in no finished frame's latency: the worker's
    frame in flight does. Stalled past 2 s, 10 deadlines and 5 x its recent p99, whichever is most."""
    from diagnostic_msgs.msg import DiagnosticStatus

    status = StatusReporter("/o", clock=Clock())
    level, message = status.status(_figures(frame_running_s=1.5, frame_latency_p99_ms=12.0), 1.0)
    assert level == DiagnosticStatus.OK and "in flight" not in message, message
    level, message = status.status(_figures(frame_running_s=3.2, frame_latency_p99_ms=12.0), 1.0)
    assert level == DiagnosticStatus.ERROR, message
    assert "the frame in flight has run 3.2 s (frames take 10 ms): no new action goes out" in message
    assert any("frame in flight has run 3.2 s" in line for line in status.console())
    # a model that is slow on this machine (frames of 900 ms) is not stalled at 3.2 s, nor a long deadline
    level, _ = status.status(_figures(frame_running_s=3.2, frame_latency_p99_ms=900.0), 1.0)
    assert level == DiagnosticStatus.OK
    level, _ = status.status(_figures(frame_running_s=3.2, frame_deadline_ms=400.0), 1.0)
    assert level == DiagnosticStatus.OK


def test_a_stalled_frame_is_an_error_on_diagnostics_and_the_console_until_it_ends(ros_env):
    """On real DDS: a frame held in its prefill (as a hung GPU would) turns the node's status
    ERROR, saying how long the frame has run, and a console line says so; once it ends the
    error goes."""
    from diagnostic_msgs.msg import DiagnosticStatus

    prefix = unique_prefix()
    with Ros() as ros:
        logs = _node_logs(ros, prefix)
        node = inference_node(ros, prefix, max_observation_age=0.0, hold_action="last")
        client = InferenceClient(ros, prefix)
        assert until(lambda: len(client.chunks) > 3, 30.0, every=client.observe, period=0.1)
        entered, release = stall_in_prefill(node.engine)
        try:
            assert until(entered.is_set, 10.0, every=client.observe, period=0.1)
            stalled = "the frame in flight has run"
            assert until(lambda: any(s.level == DiagnosticStatus.ERROR and stalled in s.message
                                     for s in client.diagnostics[-2:]), 30.0), \
                [s.message for s in client.diagnostics[-3:]]
            assert until(lambda: any(stalled in line for line in logs), 10.0), logs[-5:]
            assert node.diagnostics()["frame_running_s"] > 2.0
        finally:
            node.engine.pause_point = None
            release.set()
        assert until(lambda: node.diagnostics()["frame_running_s"] < 1.0, 10.0, every=client.observe, period=0.1)
        seen = len(client.diagnostics)
        assert until(lambda: len(client.diagnostics) > seen + 1, 10.0)
        assert stalled not in client.diagnostics[-1].message


def test_the_node_status_takes_the_delay_and_the_spacing_of_one_robot():
    """With several robots the node's status took the largest delay of any robot and the widest
    spacing of any other (a review): 170 ms from one robot and 190 ms from another made a cause
    that was neither's. It now takes both from the robot whose chunks come closest to running out."""
    from types import SimpleNamespace

    from oxygen_ros.core.chunk_clock import ChunkClock
    from oxygen_ros.core.stats import Rolling
    from oxygen_ros.ros.inference_diagnostics import clock_figures

    ms = 1_000_000

    def robot(delay_ms, interval_ms):
        clock, spacing = ChunkClock(), Rolling(50)
        clock.first_ticks.extend((t * 100 * ms, t * 100 * ms + delay_ms * ms) for t in range(1, 6))
        for _ in range(5):
            spacing.add(interval_ms)
        return SimpleNamespace(output=SimpleNamespace(clock=clock), inputs=SimpleNamespace(obs_interval_ms=spacing))

    _, ticks = clock_figures([robot(170, 30), robot(20, 190), robot(60, 100)], 0, 200 * ms)
    assert (ticks["capture_to_action_ms"], ticks["observation_interval_ms"]) == (20.0, 190.0), ticks
    _, ticks = clock_figures([robot(170, 30), robot(20, float("nan"))], 0, 200 * ms)
    assert (ticks["capture_to_action_ms"], ticks["observation_interval_ms"]) == (170.0, 30.0), ticks


def test_underruns_held_back_are_counted_and_told_within_the_period_not_at_the_next_underrun():
    """A 12-minute run (a walkthrough): 6 underruns were told, then 28 and 4 in the next seconds were
    held back and came out 8.5 minutes later as '(2 more such seconds since the last report)',
    without a count: the console added up to 11 of 44. The held-back ones are now told once the
    period is over, with their number, and a line that follows held-back seconds counts them."""
    clock = Clock()
    status = StatusReporter("/o", clock=clock)
    total = 0

    def second(underruns):
        nonlocal total
        clock.t += 1.0
        total += underruns
        status.status(_figures(underruns=total), 1.0)
        return status.console()

    status.status(_figures(), 1.0)
    assert second(6)[0].startswith("6 underruns in the last second")
    assert second(28) == [] and second(4) == []  # held back: within the period
    assert second(0) == [] and second(0) == []
    assert second(0) == ["32 more underruns in 2 second(s) since the last report (see /diagnostics)"]
    assert [second(0) for _ in range(5)] == [[]] * 5  # told once
    (line,) = second(3)
    assert line.startswith("3 underruns in the last second") and "more such seconds" not in line, line
    assert second(2) == []
    assert [second(0) for _ in range(3)] == [[]] * 3  # (2 held: not yet told, the period runs)
    (line,) = second(5)  # underruns again once the period is over: the line counts the held ones
    assert line.startswith("5 underruns in the last second") and line.endswith(
        "(see /diagnostics) (1 more such seconds since the last report, 2 underruns in them)"), line
