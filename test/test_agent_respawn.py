"""``respawn:=true``: a camera side that ends is restarted, and the other robots run on.

oxygen-agent (real DDS, each camera side in a process of its own): a robot's killed camera side
comes back after ``respawn_delay`` and its robot gets fresh chunks again, the other robot's never
stopped, and the report counts the restart; a restart that fails for a bad parameter ends the run.
The plan and the launch file's exit rule are checked without ROS."""

import json
import os
import signal
import time

import pytest
from agent_children import read_until_running, robot_of, robot_processes, start_agent, still_running

from ros_harness import REPO


def test_respawn_is_planned_for_the_camera_sides_only():
    from oxygen_ros.ros.plan import node_plan

    for values in ({"demo": "true"}, {"demo": "true", "robots": "a,b"}):
        plan = node_plan({**values, "respawn": "true", "respawn_delay": "2.5"})
        delays = {(item["robot"], item["spec"].name): item["respawn_delay"] for item in plan}
        assert delays.pop((None, "oxygen_inference")) is None  # no robot gets an action without it
        assert set(delays.values()) == {2.5} and len(delays) == (2 if "robots" not in values else 4)
    assert {item["respawn_delay"] for item in node_plan({"respawn": "true"})} == {1.0, None}  # the default delay
    assert {item["respawn_delay"] for item in node_plan({})} == {None}  # off by default: every node required
    # no limit unless given; the inference node is never restarted, so it has none
    assert {item["respawn_max_retries"] for item in node_plan({"respawn": "true"})} == {None}
    plan = node_plan({"respawn": "true", "respawn_max_retries": "3", "robots": "a,b", "demo": "true"})
    limits = {(item["robot"], item["spec"].name): item["respawn_max_retries"] for item in plan}
    assert limits.pop((None, "oxygen_inference")) is None and set(limits.values()) == {3}


@pytest.mark.parametrize("values, message", [
    ({"respawn": "maybe"}, "argument 'respawn': expected true or false, got 'maybe'"),
    ({"respawn": "true", "respawn_delay": "-1"}, "argument 'respawn_delay': expected seconds >= 0.1, got '-1'"),
    ({"respawn": "true", "respawn_delay": "soon"}, "argument 'respawn_delay': expected seconds >= 0.1, got 'soon'"),
    ({"respawn": "true", "respawn_delay": "inf"}, "argument 'respawn_delay': expected seconds >= 0.1, got 'inf'"),
    # none: launch_ros restarted a node that exited for a bad parameter once, while the launch shut down
    ({"respawn": "true", "respawn_delay": "0"}, "argument 'respawn_delay': expected seconds >= 0.1, got '0'"),
    ({"respawn_delay": "3"}, "argument 'respawn_delay': '3' restarts nothing without respawn:=true"),
    ({"respawn_max_retries": "3"}, "argument 'respawn_max_retries': '3' limits nothing without respawn:=true"),
    ({"respawn": "true", "respawn_max_retries": "0"},
     "argument 'respawn_max_retries': expected a whole number >= 1 (empty: no limit), got '0'"),
    ({"respawn": "true", "respawn_max_retries": "-1"},
     "argument 'respawn_max_retries': expected a whole number >= 1 (empty: no limit), got '-1'"),
    ({"respawn": "true", "respawn_max_retries": "2.5"},
     "argument 'respawn_max_retries': expected a whole number >= 1 (empty: no limit), got '2.5'"),
    ({"respawn": "true", "respawn_max_retries": "²"},
     "argument 'respawn_max_retries': expected a whole number >= 1 (empty: no limit), got '²'"),
])
def test_a_bad_respawn_argument_is_named_before_anything_starts(values, message, capsys):
    from oxygen_ros.ros.agent import run_agent

    assert run_agent("oxygen-test", values, None) == 2
    assert f"oxygen-test: {message}" in capsys.readouterr().err


def test_respawn_needs_the_camera_side_in_a_process_of_its_own(capsys):
    from oxygen_ros.ros.agent import run_agent

    assert run_agent("oxygen-test", {"respawn": "true"}, None, robot_processes=False) == 2
    assert "respawn:=true restarts a camera side in its own process: it cannot with --no-robot-processes" \
        in capsys.readouterr().err


def test_under_launch_a_camera_side_is_restarted_unless_a_bad_parameter_ended_it():
    from oxygen_ros.ros.plan import node_exit_message, respawn_message

    assert node_exit_message("a/oxygen_camera", -9, shutting_down=False, respawn_delay=1.0) is None
    assert node_exit_message("a/oxygen_camera", 1, shutting_down=False, respawn_delay=0.1) is None
    assert node_exit_message("a/oxygen_camera", 2, shutting_down=False, respawn_delay=1.0) == (
        "a/oxygen_camera exited with code 2 (a bad parameter or parameters file: not restarted); ending the launch "
        "(the node's own log above says why)")
    assert node_exit_message("oxygen_inference", 0, shutting_down=False, respawn_delay=None).startswith(
        "oxygen_inference exited with code 0; ending the launch")
    assert respawn_message("a/oxygen_camera", -9, 1.5) == (  # killed: its log says nothing
        "a/oxygen_camera was killed by signal 9; restarting it in 1.5 s (respawn:=true)")
    assert respawn_message("a/oxygen_camera", 1, 1.5) == (
        "a/oxygen_camera exited with code 1; restarting it in 1.5 s (respawn:=true; its own log above says why)")
    # respawn_max_retries:=2: restarted twice, the third exit ends the launch
    for restarted in (0, 1):
        assert node_exit_message("a/oxygen_camera", 1, False, respawn_delay=1.0, restarted=restarted,
                                 max_retries=2) is None
    assert node_exit_message("a/oxygen_camera", -9, False, respawn_delay=1.0, restarted=2, max_retries=2) == (
        "a/oxygen_camera was killed by signal 9 (restarted 2 times already, respawn_max_retries:=2: not again); "
        "ending the launch")  # (killed: its own log says nothing of why)
    assert respawn_message("a/oxygen_camera", 1, 1.5, 2, 2) == (
        "a/oxygen_camera exited with code 1; restarting it in 1.5 s (respawn:=true, restart 2 of 2; its own log "
        "above says why)")


def _new_child(proc, robot: str, old: int, timeout: float = 90.0) -> int | None:
    """The pid of ``robot``'s camera side other than ``old``, once it runs (None if none came)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        new = [pid for pid, cmd in robot_processes(proc.pid).items() if robot_of(cmd) == robot and pid != old]
        if new:
            return new[0]
        time.sleep(0.2)
    return None


def test_a_killed_camera_side_comes_back_and_the_other_robot_runs_on(ros_env, tmp_path):
    report = tmp_path / "out.json"
    proc = start_agent(tmp_path, "respawn:=true", "respawn_delay:=0.5", "--report", str(report), duration="50")
    try:
        started = read_until_running(proc)
        children = robot_processes(proc.pid)
        b = next(pid for pid, cmd in children.items() if robot_of(cmd) == "b")
        time.sleep(8.0)  # the observations' seq counts past where the restarted camera starts again
        os.kill(b, signal.SIGKILL)
        new = _new_child(proc, "b", b)
        assert new is not None, "robot b's camera side was not restarted"
        out, err = proc.communicate(timeout=150)
        out = started + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "every robot's camera side in a process of its own, restarted 0.5 s after it ends (respawn:=true)" in out
    assert (f"oxygen-agent: robot b's camera side (b/oxygen_synthetic_camera, b/oxygen_camera; pid {b}) was killed "
            "by signal 9; restarting it in 0.5 s (respawn:=true") in err, err[-3000:]
    assert f"pid {new}) runs again (restart 1)" in err, err[-3000:]
    assert not still_running([*children, new], timeout=1.0), "a robot's process outlived the agent"
    data = json.loads(report.read_text())
    assert data["camera_side_restarts"] == {"a": 0, "b": 1}
    for robot in ("a", "b"):  # both robots' chunks were fresh at the end: b's camera side fed it again
        assert data["robots"][robot]["chunk_age_ms"] < 5000, (robot, data["robots"][robot])
    # b's observations counted from 0 again: each action is matched with the observation it came from,
    # not with the old one of the same seq, (at least 10 s earlier)
    assert data["robots"]["b"]["obs_to_action_p99_ms"] < 5000, data["robots"]["b"]


def test_a_camera_side_restarted_respawn_max_retries_times_ends_the_run_at_its_next_exit(ros_env, tmp_path):
    """A camera side that keeps ending (a camera unplugged, a crash at every start) is not
    restarted for ever: respawn_max_retries:=1 restarts it once, and its next end ends the run
    (exit 1, saying why), the other robot's camera side with it."""
    proc = start_agent(tmp_path, "respawn:=true", "respawn_delay:=0.5", "respawn_max_retries:=1", duration="120")
    try:
        out = read_until_running(proc)
        children = robot_processes(proc.pid)
        b = next(pid for pid, cmd in children.items() if robot_of(cmd) == "b")
        os.kill(b, signal.SIGKILL)
        again = _new_child(proc, "b", b)
        assert again is not None, "robot b's camera side was not restarted"
        time.sleep(2.0)
        os.kill(again, signal.SIGKILL)
        more, err = proc.communicate(timeout=60)
        out += more
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert ", restarted 0.5 s after it ends, at most once (respawn:=true)" in out, out[-2000:]
    assert f"pid {b}) was killed by signal 9; restarting it in 0.5 s (respawn:=true, restart 1 of 1)" in err, err[-3000:]
    assert (f"pid {again}) was killed by signal 9 (restarted once already, respawn_max_retries:=1: not again)"
            in err), err[-3000:]
    assert not still_running([*children, again], timeout=1.0), "a robot's process outlived the agent"


@pytest.mark.parametrize("broken", ["value", "file"])
def test_a_restart_refused_for_a_bad_parameter_ends_the_run(ros_env, tmp_path, broken):
    """The camera side is restarted with the parameters file as it is then: a value made bad
    meanwhile, or a file that is no longer YAML, ends the run (exit 1, naming it) instead of
    restarting it for ever."""
    params = tmp_path / "agent.yaml"
    text = (REPO / "config" / "agent.yaml").read_text()
    params.write_text(text)
    proc = start_agent(tmp_path, "respawn:=true", f"params_file:={params}", duration="120", robots="robots:=")
    try:
        read_until_running(proc)
        (side,) = robot_processes(proc.pid)
        assert "    max_age: 0.5\n" in text
        params.write_text(text.replace("    max_age: 0.5\n", "    max_age: -1.0\n" if broken == "value" else
                                       "    max_age: [0.5\n", 1))
        os.kill(side, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert "restarting it in 1 s (respawn:=true)" in err, err[-3000:]
    if broken == "value":
        assert "parameter 'max_age'" in err, err[-3000:]
        assert "exited with code 2 (a bad parameter or parameters file: not restarted); its own log above says why" \
            in err, err[-3000:]
    else:
        assert f"was killed by signal 9; not restarted: parameters file {params}" in err, err[-3000:]


def test_the_probe_matches_a_first_action_with_the_newest_observation_of_its_seq():
    """A restarted camera node counts its observations' seq from 0 again: a later frame from a
    new observation 3 is not timed from the old observation 3."""
    from oxygen_ros.msg import ActionChunk, Observation
    from oxygen_ros.tools.arrival_probe import ArrivalStream

    class NoMiddleware:  # the callbacks are called by hand: only the matching is under test
        def create_subscription(self, *args):
            pass

    stream = ArrivalStream(NoMiddleware(), "/oxygen/actions", "/oxygen/observation")
    stream.on_observation(Observation(seq=3), None)
    old = stream.observations[3]
    stream.on_actions(ActionChunk(frame_id=1, observation_seq=3), None)
    stream.on_actions(ActionChunk(frame_id=1, observation_seq=3), None)  # the same frame's next tick
    stream.on_actions(ActionChunk(frame_id=2, observation_seq=4), None)  # no observation 4 came
    time.sleep(0.01)
    stream.on_observation(Observation(seq=3), None)  # the restarted camera node's
    stream.on_actions(ActionChunk(frame_id=9, observation_seq=3), None)
    recorded = stream.recorded()["first_actions"]
    assert recorded[1][0] == 3 and recorded[1][2] == old
    assert recorded[2][2] is None
    assert recorded[9][0] == 3 and recorded[9][2] == stream.observations[3] > old
    assert len(stream.recorded()["arrivals"]) == 4
