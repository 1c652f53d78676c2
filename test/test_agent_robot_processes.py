"""`oxygen-agent robots:=a,b demo:=true` (``--robot-processes``, the default with robots): every robot's
camera side (camera node, synthetic camera) in a child process of its own, the inference node in the
agent's; real DDS.
Both robots get actions, a child's plan items are the in-process ones, a child that dies ends
the run naming its robot, and no child (nor its plan file) outlives the agent, even a killed one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_children import robot_of, start_agent, still_running, wait_for_robot_processes
from ros_harness import REPO, checkout_env


def test_plan_items_reach_a_child_unchanged(tmp_path):
    """What a child builds is the in-process plan item for item (parameters, types, remappings)."""
    from oxygen_ros.ros.plan import node_plan
    from oxygen_ros.ros.robot_process import camera_sides, decode_items, encode_items

    params = tmp_path / "agent.yaml"
    params.write_text((REPO / "config" / "agent.yaml").read_text()
                      + "\nb/oxygen_camera:\n  ros__parameters:\n    max_age: 1.5\n    image_topics: [/arm_b/rgb]\n")
    plan = node_plan({"robots": "a,b", "demo": "true", "camera_topic": "/cam/rgb"}, str(params))
    sides = camera_sides(plan)
    assert list(sides) == ["a", "b"]
    assert [item["spec"].name for item in sides["a"]] == ["oxygen_synthetic_camera", "oxygen_camera"]
    assert all(item["spec"].name != "oxygen_inference" for items in sides.values() for item in items)
    for items in sides.values():
        sent = decode_items(json.loads(json.dumps(encode_items(items))))
        assert sent == items
        for got, want in zip(sent, items):
            assert [type(v) for v in got["parameters"].values()] == [type(v) for v in want["parameters"].values()]
    assert sides["b"][1]["parameters"]["max_age"] == 1.5 and sides["a"][0]["remappings"] == [
        ("/a/camera/image_raw", "/a/cam/rgb")]


def test_two_robots_in_processes_of_their_own_both_get_actions_and_no_child_outlives_the_agent(ros_env, tmp_path):
    """The robots named in the params file, not by robots:=: their camera sides get processes of
    their own all the same (the default follows the plan's robots, wherever they were named)."""
    report = tmp_path / "out.json"
    params = tmp_path / "agent.yaml"
    params.write_text((REPO / "config" / "agent.yaml").read_text().replace("    robots: []\n", "    robots: [a, b]\n"))
    assert "robots: [a, b]" in params.read_text()
    proc = start_agent(tmp_path, "--report", str(report), robots=f"params_file:={params}")
    try:
        children = wait_for_robot_processes(proc)
        assert sorted(robot_of(cmd) for cmd in children.values()) == ["a", "b"], children
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "every robot's camera side in a process of its own" in out
    assert not still_running(children, timeout=1.0), "a robot's process outlived the agent"
    data = json.loads(report.read_text())
    assert set(data["robots"]) == {"a", "b"}
    for robot, figures in data["robots"].items():
        assert figures["actions_published"] > 0 and figures["actions_received"] > 0, (robot, figures)
        assert figures["obs_to_action_p99_ms"] is not None and figures["obs_to_action_p99_ms"] > 0, (robot, figures)
    assert not [cmd for cmd in children.values() if Path(cmd.split()[-1]).exists()], "a plan file was left"


def test_a_robot_process_that_dies_ends_the_run_naming_the_robot(ros_env, tmp_path):
    proc = start_agent(tmp_path, "--robot-processes", duration="120")
    try:
        children = wait_for_robot_processes(proc)
        b = next(pid for pid, cmd in children.items() if robot_of(cmd) == "b")
        time.sleep(3.0)  # running: the nodes spin
        os.kill(b, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert f"oxygen-agent: robot b's camera side (b/oxygen_synthetic_camera, b/oxygen_camera; pid {b}) " \
           "was killed by signal 9" in err, err[-3000:]
    assert not still_running(children, timeout=5.0), "robot a's process outlived the agent"


def test_the_robot_processes_end_when_the_agent_is_killed(ros_env, tmp_path):
    proc = start_agent(tmp_path, duration="120")
    try:
        children = wait_for_robot_processes(proc)
        assert len(children) == 2, children
    finally:
        proc.kill()  # no chance to stop them: they notice their parent is gone
        proc.communicate(timeout=30)
    assert not still_running(children), "a robot's process outlived the killed agent"
    plans = [Path(cmd.split()[-1]) for cmd in children.values()]
    assert not [p for p in plans if p.exists()], "a killed agent left its robots' plan files in the temp dir"


def test_a_robot_with_a_bad_parameter_ends_the_start_with_status_2_naming_it(ros_env, tmp_path):
    """Robot b's camera node refuses its max_age in its own process: the agent says so while
    its inference node is still being built (with compile:=on that is minutes), then ends with
    the status of a bad parameter, as it does with the camera nodes in its own process."""
    params = tmp_path / "agent.yaml"
    params.write_text((REPO / "config" / "agent.yaml").read_text()
                      + "\nb/oxygen_camera:\n  ros__parameters:\n    max_age: -1.0\n")
    proc = start_agent(tmp_path, f"params_file:={params}", duration="30")
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert "robot b's camera side: b/oxygen_camera: parameter 'max_age'" in err, err[-3000:]
    # every node in the agent's process: its last line names the node too (the FATAL line above it does)
    proc = start_agent(tmp_path, f"params_file:={params}", "--no-robot-processes", duration="30")
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert err.rstrip().splitlines()[-1].startswith("oxygen-agent: b/oxygen_camera: parameter 'max_age'"), err[-3000:]


CHILD_WITH_A_NODE_THAT_STOPS = """
import sys

import rclpy

from oxygen_ros.ros import robot_process


def build_nodes(items, params_file, nodes):  # the robot's camera node, whose callback raises after 0.5 s
    node = rclpy.create_node("oxygen_camera")

    def driver_gone():
        raise RuntimeError("camera driver gone")

    node.create_timer(0.5, driver_gone)
    nodes.append(node)


robot_process.build_nodes = build_nodes
sys.exit(robot_process.main(sys.argv[1:]))
"""


def test_a_node_that_stops_in_a_robot_process_ends_it_with_status_1(ros_env, tmp_path):
    """A robot's child whose node stops on an error ends with 1, naming the robot and the error:
    the agent then reports an exit with code 1, not a clean end (0 is a child told to stop)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"robot": "b", "items": [], "params_file": "", "background_niceness": 0,
                                "parent": os.getpid()}))
    proc = subprocess.run([sys.executable, "-c", CHILD_WITH_A_NODE_THAT_STOPS, str(plan)], env=checkout_env(),
                          capture_output=True, text=True, timeout=60)
    assert "robot process ready" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "robot b's camera side: oxygen_camera stopped: RuntimeError('camera driver gone')" in proc.stderr, \
        proc.stderr[-3000:]
    assert not plan.exists()  # read once
