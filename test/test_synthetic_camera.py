"""The synthetic camera (oxygen_ros.ros.synthetic_camera.SyntheticCamera) on real DDS: it closes
the loop through the camera node, and pausing it is a camera drop-out.

Its nodes run in a private rclpy context (the ``stepped_ros`` fixture) on topic names of their own.
"""

import numpy as np
from ros_harness import camera_node, params

def test_synthetic_camera_closes_the_loop_through_the_camera_node(stepped_ros):
    """SyntheticCamera -> CameraNode -> Observation; ActionChunks move the gripper."""
    from oxygen_ros.msg import ActionChunk, Observation

    from oxygen_ros.core.sim import demonstrations
    from oxygen_ros.ros.qos import OBSERVATION_QOS
    from oxygen_ros.ros.conversions import action_chunk_msg, msg_to_observation
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = stepped_ros.prefix
    sim = stepped_ros.add(SyntheticCamera(context=stepped_ros.context, parameter_overrides=params(
        rate_hz=20.0, image_size=32, seed=3, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
        joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions", retarget_every_s=0.0)))
    camera = camera_node(stepped_ros, image_topics=[f"{p}/image"], compressed_image_topics=[],
                         state_topic=f"{p}/joint_states", max_age=2.0)
    client = stepped_ros.node("oxygen_test_policy")
    observations = []
    client.create_subscription(Observation, f"{p}/observation", observations.append, OBSERVATION_QOS)
    actions = client.create_publisher(ActionChunk, f"{p}/actions", 10)

    # the latched instruction may reach the camera node after the first frames: the first group
    # waits for it (instruction_wait_s), so no observation carries default_instruction ('')
    assert stepped_ros.spin_until(lambda: len(observations) >= 3, timeout=15.0)
    assert [m.instruction for m in observations] == [sim.sim.instruction] * len(observations)
    obs = msg_to_observation(observations[-1])
    assert obs.instruction == sim.sim.instruction and obs.instruction.startswith("move to the ")
    assert obs.images["base"].shape == (32, 32, 3)
    assert obs.state is not None and np.allclose(obs.state, sim.sim.state, atol=0.11)

    start = np.array(sim.sim.scene.gripper)
    target = np.array(sim.sim.scene.target.position)

    def act():
        step = demonstrations.expert_actions(sim.sim.scene, 1)  # the ideal next move
        actions.publish(action_chunk_msg(client.get_clock().now(), 0, observations[-1].seq,
                                         observations[-1].header.stamp, 0, 0.05, np.vstack([step, step])))

    moved = lambda: sim.actions_applied >= 3
    assert stepped_ros.spin_until(moved, every=act, period=0.05)
    assert np.linalg.norm(np.array(sim.sim.scene.gripper) - target) < np.linalg.norm(start - target) or \
        sim.retargets > 0
    assert camera.rejected == {k: 0 for k in camera.rejected}


def test_synthetic_camera_pause_stops_its_images_until_resumed(stepped_ros):
    """A camera drop-out as oxygen-soak injects it: a paused synthetic camera
    publishes no image; resumed, it publishes again."""
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = stepped_ros.prefix
    sim = stepped_ros.add(SyntheticCamera(context=stepped_ros.context, parameter_overrides=params(
        rate_hz=20.0, image_size=32, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
        joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions")))
    images = []
    stepped_ros.node("oxygen_test_viewer").create_subscription(Image, f"{p}/image", images.append, qos_profile_sensor_data)
    assert stepped_ros.spin_until(lambda: len(images) >= 2, timeout=15.0), "no image before the pause"
    sim.pause()
    stepped_ros.spin_for(0.2)  # what was already on its way
    paused_at = len(images)
    stepped_ros.spin_for(1.0)  # 20 periods
    assert len(images) == paused_at
    sim.pause(False)
    assert stepped_ros.spin_until(lambda: len(images) >= paused_at + 2, timeout=15.0), "no image after resuming"


def test_target_moves_are_logged_at_most_every_five_seconds_with_their_count(stepped_ros, capfd):
    """A policy that works reaches several targets a second: the demo's console gets one
    line about them every 5 s, which counts the moves since the line before."""
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = stepped_ros.prefix
    sim = stepped_ros.add(SyntheticCamera(context=stepped_ros.context, parameter_overrides=params(
        rate_hz=50.0, image_size=16, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
        joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions", retarget_every_s=0.01)))
    stepped_ros.spin_for(6.0)  # a move every tick (every 20 ms)
    lines = [line for line in capfd.readouterr().err.splitlines() if "oxygen_synthetic_camera" in line
             and ": target " in line]
    assert sim.retargets >= 50, sim.retargets
    assert 2 <= len(lines) <= 3, lines  # the first move, then one line 5 s later
    assert "target moved after" in lines[0] and "since the last line" not in lines[0]
    assert "(0 reached and " in lines[1] and "moved since the last line)" in lines[1], lines[1]


def test_the_synthetic_robot_applies_a_chunk_s_first_row_clamped_to_max_step(stepped_ros):
    """Of each ActionChunk the simulated gripper takes the first row, the action due now (not a
    later one), and a row longer than max_step moves it by max_step in that row's direction:
    what its /joint_states then say."""
    from sensor_msgs.msg import JointState

    from oxygen_ros.msg import ActionChunk
    from oxygen_ros.ros.conversions import action_chunk_msg
    from oxygen_ros.ros.qos import ACTIONS_QOS, DATA_QOS
    from oxygen_ros.ros.synthetic_camera import JOINT_NAMES, SyntheticCamera

    p = stepped_ros.prefix
    sim = stepped_ros.add(SyntheticCamera(context=stepped_ros.context, parameter_overrides=params(
        rate_hz=20.0, image_size=16, seed=5, max_step=0.05, retarget_every_s=0.0, image_topic=f"{p}/image",
        instruction_topic=f"{p}/instruction", joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions")))
    client = stepped_ros.node("oxygen_test_policy")
    states = []
    client.create_subscription(JointState, f"{p}/joint_states", states.append, DATA_QOS)
    actions = client.create_publisher(ActionChunk, f"{p}/actions", ACTIONS_QOS)
    assert stepped_ros.spin_until(lambda: states and actions.get_subscription_count() >= 1, timeout=15.0)
    assert list(states[-1].name) == JOINT_NAMES
    start = np.array(states[-1].position)
    towards_centre = -start / np.linalg.norm(start)
    across = np.array([towards_centre[1], -towards_centre[0]])
    chunk = np.vstack([0.3 * towards_centre, 0.3 * across, 0.3 * across])  # row 0: 6 x max_step long

    def act():
        if sim.actions_applied == 0:  # best-effort QoS: send again until one arrived
            actions.publish(action_chunk_msg(client.get_clock().now(), 0, 0, client.get_clock().now(), 0, 0.05, chunk))

    moved = lambda: not np.allclose(states[-1].position, start, atol=1e-6)
    assert stepped_ros.spin_until(moved, every=act, period=0.2, timeout=15.0), "the gripper never moved"
    stepped_ros.spin_for(0.3)  # the last state after every chunk sent arrived
    applied = sim.actions_applied
    assert applied >= 1
    np.testing.assert_allclose(states[-1].position, start + applied * 0.05 * towards_centre, atol=1e-5)


def test_its_start_line_names_its_topics_as_remapped(stepped_ros, capfd):
    """``camera_topic:=`` remaps the synthetic camera's image topic: its log names the topic it
    publishes on, not the parameter's value (the README: logs name topics as resolved)."""
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    p = stepped_ros.prefix
    stepped_ros.add(SyntheticCamera(
        context=stepped_ros.context, cli_args=["--ros-args", "-r", f"{p}/image:={p}/cam/rgb"],
        parameter_overrides=params(image_size=16, image_topic=f"{p}/image", instruction_topic=f"{p}/instruction",
                                   joint_state_topic=f"{p}/joint_states", action_topic=f"{p}/actions")))
    (line,) = [line for line in capfd.readouterr().err.splitlines() if "synthetic scene" in line]
    assert f"Hz on {p}/cam/rgb; actions from {p}/actions" in line, line
