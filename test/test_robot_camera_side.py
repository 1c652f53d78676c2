"""A robot's camera side in processes of its own, as on the robot's machine (docs/several_robots.md):
the synthetic camera and the camera node run as the installed executables in the namespace
``left`` (``-r __ns:=/left``) from a parameters file with ``/left/...`` sections, while the
inference node serving ``robots: [left]`` runs in the test process; its ActionChunks come on
``/left/...`` and close the robot's loop. Real DDS between the processes.
"""

import subprocess
import time

from ros_harness import Ros, checkout_env, inference_node, inference_topics, installed_prefix, reliable, unique_prefix

ROBOT_SIDE = """
/left/oxygen_synthetic_camera:
  ros__parameters:
    rate_hz: 10.0
    image_topic: {left}/camera/image_raw
    instruction_topic: {left}/instruction
    joint_state_topic: {left}/joint_states
    action_topic: {left}/actions
/left/oxygen_camera:
  ros__parameters:
    image_topics: [{left}/camera/image_raw]
    instruction_topic: {left}/instruction
    state_topic: {left}/joint_states
    observation_topic: {left}/observation
    image_size: 32
    max_age: 2.0
"""


def _robot_side(executable, params_file, tmp_path):
    path = installed_prefix() / "lib" / "oxygen_ros" / executable
    log = open(tmp_path / f"{executable}.log", "w")
    return subprocess.Popen([str(path), "--ros-args", "-r", "__ns:=/left", "--params-file", str(params_file)],
                            cwd=tmp_path, env=checkout_env(), stdout=log, stderr=subprocess.STDOUT)


def test_a_robots_camera_side_in_its_own_processes_gets_actions_from_the_shared_inference_node(ros_env, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from oxygen_ros.msg import ActionChunk
    from oxygen_ros.ros.conversions import action_chunk_array

    prefix = unique_prefix()
    left = f"/left{prefix}"  # the robot's topics: /left + the inference node's configured ones
    params_file = tmp_path / "robot_left.yaml"
    params_file.write_text(ROBOT_SIDE.format(left=left))
    procs = [_robot_side(exe, params_file, tmp_path) for exe in ("synthetic_camera", "camera_node")]
    try:
        with Ros() as ros:
            node = inference_node(ros, prefix, robots=["left"])
            assert node.robot_names == ("left",)
            assert inference_topics(prefix)["actions_topic"] == f"{prefix}/actions"
            chunks = []
            listener = ros.node("oxygen_test_robot_actions")
            listener.create_subscription(ActionChunk, f"{left}/actions", chunks.append, reliable(50))
            statuses = []
            listener.create_subscription(DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status),
                                         reliable(50))
            assert ros.wait_until(lambda: len({c.observation_seq for c in chunks}) >= 3, 60.0), \
                _logs(tmp_path, procs, len(chunks))
            assert node.tick_counts("left")["published"] > 0
            assert action_chunk_array(chunks[-1]).shape[0] > 0
            # the camera side is the robot's: its nodes are in the namespace /left
            names = {n for n, ns in listener.get_node_names_and_namespaces() if ns == "/left"}
            assert {"oxygen_camera", "oxygen_synthetic_camera"} <= names, names
            # ... and so is its camera status, told apart from other robots' by its name
            mine = lambda: [s.name for s in statuses if f"{left}/camera" in s.hardware_id]  # noqa: E731
            assert ros.wait_until(lambda: mine(), 10.0) and set(mine()) == {"left/oxygen_camera: cameras"}
        for proc in procs:
            assert proc.poll() is None, _logs(tmp_path, procs, 0)  # the camera side still runs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _logs(tmp_path, procs, chunks) -> str:
    time.sleep(0.2)
    text = "".join((tmp_path / f"{exe}.log").read_text()[-1500:] for exe in ("synthetic_camera", "camera_node"))
    return f"{chunks} chunks; exit codes {[p.poll() for p in procs]}\n{text}"
