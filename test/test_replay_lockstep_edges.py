"""Lockstep replays of bags that are not one clean image-and-state per tick, on real DDS
(bag player -> camera node -> inference node, tiny model). Each must play through without a
lockstep timeout (``lockstep_timeout_s`` of stall, and a warning) and pair what was taken
together:

* two cameras out of phase: camera ``b``'s frames are stamped 60 ms after camera ``a``'s (10
  Hz each, free-running, as most rigs are). From the second group on the camera node sees
  ``a``'s frame more than half a period older than ``b``'s and waits for ``a``'s next one,
  closer in time; the player holds that frame until the group's chunk comes back, so the
  wait must end by itself (one of ``a``'s periods). Before it did, each such wait lasted the
  player's timeout, and from then on every observation paired ``a``'s frame with ``b``'s of
  the tick before (the last tick's never went out);
* a bag that begins with images whose states are not in it (a recorder that found the image
  topic before the state's): a camera node with a ``state_topic`` groups none of them, so no
  chunk could answer them, and the player held the next image for the whole timeout.
"""

import numpy as np
from ros_harness import Ros, params, play_once_matched, player_progress, reliable, unique_prefix

FRAMES = 6
T0 = 1_700_000_000 * 10**9
PERIOD_NS = 100_000_000


def _image(camera, tick, stamp):
    """An image whose frame_id names its camera and tick."""
    from oxygen_ros.ros.conversions import rgb_to_image_msg

    return rgb_to_image_msg(np.zeros((24, 32, 3), np.uint8), "rgb8", stamp * 1e-9, f"{camera}{tick}")


def _replay(bag, prefix, cameras, expected, state_topic=""):
    """Play ``bag`` in lockstep through fresh nodes, and wait for ``expected`` Observations (at most
    a few seconds after the bag ended); (the Observations, the player)."""
    from oxygen_ros.msg import Observation

    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode

    topics = dict(observation_topic=f"{prefix}/observation", actions_topic=f"{prefix}/actions",
                  text_topic=f"{prefix}/text")
    observations = []
    with Ros() as ros:
        recorder = ros.node("oxygen_test_recorder")
        recorder.create_subscription(Observation, topics["observation_topic"], observations.append, reliable(100))
        inference = ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            preset="tiny", model_path="", chunk_origin="frame_end", max_observation_age=0.0,
            question_topic=f"{prefix}/question", trajectory_topic=f"{prefix}/trajectory", **topics)))
        ros.add(CameraNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            image_topics=[f"{prefix}/{c}/image_raw" for c in cameras], instruction_topic=f"{prefix}/instruction",
            observation_topic=topics["observation_topic"], image_size=32, max_age=10.0, state_topic=state_topic)))
        player = ros.add(BagPlayer(context=ros.context, namespace=prefix, parameter_overrides=params(
            bag_path=str(bag), lockstep=True, lockstep_timeout_s=5.0, action_topic=topics["actions_topic"],
            start_delay_s=60.0)))
        play_once_matched(ros, player, inference, subscribers=1)
        assert ros.wait_until(player.done.done, 60.0), player_progress(ros, player)
        ros.wait_until(lambda: len(observations) >= expected, 5.0)
        return observations, player


def _bag(path, prefix, messages):
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag

    messages = [(f"{prefix}/instruction", String(data="pick up the cube"), T0)] + messages
    return write_bag(path, "mcap", sorted(messages, key=lambda m: m[2]), latched_topics=[f"{prefix}/instruction"])


def test_cameras_out_of_phase_are_paired_tick_by_tick_without_a_timeout(ros_env, tmp_path):
    prefix = unique_prefix()
    messages = []
    for tick in range(FRAMES):
        for camera, offset in (("a", 0), ("b", 60_000_000)):
            stamp = T0 + (tick + 1) * PERIOD_NS + offset
            messages.append((f"{prefix}/{camera}/image_raw", _image(camera, tick, stamp), stamp))
    observations, player = _replay(_bag(tmp_path / "input", prefix, messages), prefix, ["a", "b"], FRAMES)
    assert player.lockstep_timeouts == 0, "a group waited for a frame the player held"
    pairs = [tuple(image.header.frame_id for image in m.images) for m in observations]
    assert pairs == [(f"a{tick}", f"b{tick}") for tick in range(FRAMES)], pairs


def test_a_bag_that_begins_without_the_state_plays_without_a_timeout(ros_env, tmp_path):
    from sensor_msgs.msg import JointState

    from oxygen_ros.ros.conversions import ns_to_time_msg

    prefix, first_state = unique_prefix(), 2
    messages = []
    for tick in range(FRAMES):  # each image, then the state taken with it; the first two states are missing
        stamp = T0 + (tick + 1) * PERIOD_NS
        messages.append((f"{prefix}/cam/image_raw", _image("cam", tick, stamp), stamp))
        if tick >= first_state:
            state = JointState(name=["x", "y"], position=[float(tick), 0.0])
            state.header.stamp = ns_to_time_msg(stamp)
            messages.append((f"{prefix}/joint_states", state, stamp + 1_000_000))
    observations, player = _replay(_bag(tmp_path / "input", prefix, messages), prefix, ["cam"],
                                   FRAMES - first_state, state_topic=f"{prefix}/joint_states")
    assert player.lockstep_timeouts == 0, "the player held an image no chunk could answer"
    paired = [(m.images[0].header.frame_id, round(float(m.state[0]))) for m in observations]
    assert paired == [(f"cam{tick}", tick) for tick in range(first_state, FRAMES)], paired
