"""What a node's params files give it, as an integrator running a node executable sees it.

rcl gives a node only the sections whose key matches its fully-qualified name, and says
nothing of the others: ``camera_node --ros-args -r __ns:=/robot1 --params-file
my_robot.yaml``, with the file built as config/agent.yaml (``oxygen_camera:``), ran at the
default 224 px without a word. Each node now warns, naming the file, of a section naming it
that it does not get, and of one whose name is its own misspelt; a file whose sections all
apply (the package's other nodes' sections and shared ``/**`` ones beside) says nothing. A
``/**`` section holding every node's parameters no longer makes each node warn of the
others'; a subscription QoS override naming a topic the node does not subscribe to (before
the remapping) is named with the topic it could apply to.
"""

from __future__ import annotations

import re
import signal
import subprocess
import uuid

import pytest
import yaml
from ros_harness import OutputLines, Ros, checkout_env, installed_prefix, until

STARTED = "grouping 1 camera(s)"  # the camera node's last line at start: every start-up warning is out by then


def _config() -> dict:
    """config/agent.yaml as installed (the sections of every node of the package)."""
    return yaml.safe_load((installed_prefix() / "share" / "oxygen_ros" / "config" / "agent.yaml").read_text())


def _camera_start(tmp_path, sections: dict, *ros_args: str) -> list[str]:
    """The camera node executable's lines up to its start's last, run with ``sections`` as its params
    file (``my_robot.yaml``) and ``ros_args`` (it is stopped with Ctrl-C then)."""
    (tmp_path / "my_robot.yaml").write_text(yaml.safe_dump(sections, sort_keys=False))
    proc = subprocess.Popen([str(installed_prefix() / "lib" / "oxygen_ros" / "camera_node"), "--ros-args",
                             "--params-file", "my_robot.yaml", *ros_args], cwd=tmp_path, env=checkout_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputLines(proc)
    try:
        assert until(lambda: out.has(re.escape(STARTED)), 60.0), out.text()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lines = out.join().splitlines()
    return lines[:next(i for i, line in enumerate(lines) if STARTED in line) + 1]


def _warnings(lines: list[str]) -> list[str]:
    return [line.split("]: ", 1)[1] for line in lines if line.startswith("[WARN]")]


@pytest.mark.parametrize("remap, fqn", [("__ns:=/robot1", "/robot1/oxygen_camera"), ("__node:=front_cam", "/front_cam")])
def test_a_node_started_in_a_namespace_or_renamed_names_the_sections_it_does_not_get(ros_env, tmp_path, remap, fqn):
    """The walkthrough's my_robot.yaml (config/agent.yaml, image_size 48), plus a section with the
    node's name misspelt: the node still runs at 224 px, as rcl gives it neither, but says so,
    with the names that would apply; the other nodes' sections (oxygen_inference, ...) are not
    warned of."""
    sections = _config()
    sections["oxygen_camera"]["ros__parameters"]["image_size"] = 48
    typo = f"{fqn.rpartition('/')[0]}/oxygen_camra"
    sections[typo] = {"ros__parameters": {"max_age": 0.7}}
    lines = _camera_start(tmp_path, sections, "-r", remap)
    node = fqn.rpartition("/")[2]
    assert _warnings(lines) == [
        f"params file my_robot.yaml: section '/oxygen_camera' does not apply to this node, {fqn} (rcl matches "
        f"sections by the full name): name it '{fqn}', '/**/{node}' or '/**'",
        f"params file my_robot.yaml: section '{typo}' names no node; is it this node, {fqn}, misspelt? its "
        f"parameters are not used (did you mean '{fqn}'?)"], lines
    assert "at 224x224" in lines[-1]


def test_a_file_whose_sections_all_apply_gives_no_warning(ros_env, tmp_path):
    """The node's own section under its namespace, another robot's, the package's other nodes'
    and a shared /** section setting other nodes' topics for all: every value arrives, nothing is
    warned of (the /** section made the camera node warn "'actions_topic' (a parameter of
    oxygen_inference: in its section)"). A QoS override by the remapped topic's name applies."""
    config = _config()
    sections = {"/robot1/oxygen_camera": {"ros__parameters": {**config["oxygen_camera"]["ros__parameters"],
                                                              "image_size": 48}},
                "/robot2/oxygen_camera": {"ros__parameters": {"image_size": 96}},
                "oxygen_inference": config["oxygen_inference"], "oxygen_synthetic_camera": config["oxygen_synthetic_camera"],
                "/**": {"ros__parameters": {"actions_topic": "/robot1/actions", "observation_topic": "/robot1/obs"}}}
    lines = _camera_start(tmp_path, sections, "-r", "__ns:=/robot1", "-r", "/robot1/camera/image_raw:=/robot1/cam/color",
                          "-p", "qos_overrides./robot1/cam/color.subscription.depth:=2")
    assert _warnings(lines) == [], lines
    assert "base=/robot1/cam/color (best effort, depth 2)] into /robot1/obs at 48x48" in lines[-1]


def test_a_qos_override_of_a_topic_the_node_does_not_subscribe_to_is_named(ros_env, tmp_path):
    """qos_overrides./camera/image_raw... with the camera topic remapped: rclpy reads the override by the
    resolved name (/robot1/cam/color) and ignored this one without a word (depth stayed 5)."""
    lines = _camera_start(tmp_path, {"/**": {"ros__parameters": {"image_size": 48}}}, "-r", "__ns:=/robot1",
                          "-r", "/robot1/camera/image_raw:=/robot1/cam/color",
                          "-p", "qos_overrides./camera/image_raw.subscription.depth:=2")
    assert _warnings(lines) == [
        "QoS override(s) ignored: qos_overrides./camera/image_raw.subscription.depth: this node subscribes to no such "
        "topic (overrides are matched by the topic's name after remapping); its subscriptions that take them: "
        "qos_overrides./robot1/cam/color.subscription.{reliability,depth}"], lines
    assert "(best effort, depth 5)" in lines[-1]


@pytest.mark.parametrize("which, warned", [
    ("camera", "'obsrvation_topik' (did you mean 'observation_topic'?)"),
    ("synthetic_camera", "'obsrvation_topik' (did you mean 'observation_topic', a parameter of oxygen_camera and "
                         "oxygen_inference?)")])
def test_a_shared_section_s_parameters_of_other_nodes_are_not_warned_of_but_its_typos_are(ros_env, tmp_path, which,
                                                                                          warned):
    """A /** section setting the topics of every node (actions_topic, observation_topic,
    image_topic): the camera node said "'actions_topic' (a parameter of oxygen_inference: in its
    section)", the synthetic camera "'observation_topic' (did you mean 'action_topic'?)". Now
    only a name that is no node's parameter is named, with the closest of every node's."""
    from rcl_interfaces.msg import Log
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    cls = {"camera": CameraNode, "synthetic_camera": SyntheticCamera}[which]
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "actions_topic": "/s/actions", "action_topic": "/s/actions", "observation_topic": "/s/obs",
        "image_topic": "/s/cam", "image_topics": ["/s/cam"], "obsrvation_topik": "/s/typo"}}}))
    with Ros() as ros:
        logs = []
        ros.node("oxygen_test_shared_log").create_subscription(Log, "/rosout", logs.append, QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        node = ros.add(cls(context=ros.context, namespace=f"/shared_{uuid.uuid4().hex[:8]}",
                           cli_args=["--ros-args", "--params-file", str(path)]))
        started = {"camera": STARTED, "synthetic_camera": "synthetic scene"}[which]  # its start's last line
        assert until(lambda: any(started in m.msg for m in logs if m.name == node.get_logger().name), 10.0)
        mine = [m.msg for m in logs if m.name == node.get_logger().name and m.level == Log.WARN]
        assert [m for m in mine if "parameter" in m] == [
            f"unknown parameter(s) ignored: {warned} (this node's parameters: config/agent.yaml, `ros2 param list`)"], mine
