"""A lockstep replay of two cameras out of phase, on real DDS: camera ``b``'s frames are
stamped 60 ms after camera ``a``'s (10 Hz each, free-running, as most rigs are).

From the second group on the camera node sees camera ``a``'s frame more than half a period
older than ``b``'s and waits for ``a``'s next one, closer in time. In lockstep the bag player
holds that frame until the group's chunk comes back, so the wait must end by itself (one of
``a``'s periods): before it did, each such wait lasted the player's ``lockstep_timeout_s``,
and from then on every observation paired ``a``'s frame with ``b``'s of the tick before
(the last tick's never went out).
"""

import time

import numpy as np
from ros_harness import Ros, params, play_once_matched, player_progress, reliable, unique_prefix

FRAMES = 6
OFFSET_NS = 60_000_000


def _write_bag(path, prefix):
    """Camera ``a`` at 100 ms steps, ``b`` 60 ms after each; each image's frame_id names its tick."""
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import rgb_to_image_msg

    t0 = 1_700_000_000 * 10**9
    messages = [(f"{prefix}/instruction", String(data="pick up the cube"), t0)]
    image = np.zeros((24, 32, 3), np.uint8)
    for tick in range(FRAMES):
        for camera, offset in (("a", 0), ("b", OFFSET_NS)):
            stamp = t0 + (tick + 1) * 100_000_000 + offset
            messages.append((f"{prefix}/{camera}/image_raw",
                             rgb_to_image_msg(image, "rgb8", stamp * 1e-9, f"{camera}{tick}"), stamp))
    messages.sort(key=lambda m: m[2])
    return write_bag(path, "mcap", messages, latched_topics=[f"{prefix}/instruction"])


def test_a_lockstep_replay_of_cameras_out_of_phase_pairs_each_tick_and_never_times_out(ros_env, tmp_path):
    from oxygen_ros.msg import Observation

    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode

    prefix = unique_prefix()
    bag = _write_bag(tmp_path / "input", prefix)
    topics = dict(observation_topic=f"{prefix}/observation", actions_topic=f"{prefix}/actions",
                  text_topic=f"{prefix}/text")
    observations = []
    with Ros() as ros:
        recorder = ros.node("oxygen_test_recorder")
        recorder.create_subscription(Observation, topics["observation_topic"], observations.append, reliable(100))
        inference = ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            preset="tiny", model_path="", chunk_origin="frame_end", max_observation_age=0.0,
            question_topic=f"{prefix}/question", trajectory_topic=f"{prefix}/trajectory", **topics)))
        camera = ros.add(CameraNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            image_topics=[f"{prefix}/a/image_raw", f"{prefix}/b/image_raw"], instruction_topic=f"{prefix}/instruction",
            observation_topic=topics["observation_topic"], image_size=32, max_age=10.0)))
        player = ros.add(BagPlayer(context=ros.context, namespace=prefix, parameter_overrides=params(
            bag_path=str(bag), lockstep=True, lockstep_timeout_s=5.0, action_topic=topics["actions_topic"],
            start_delay_s=60.0)))
        play_once_matched(ros, player, inference, subscribers=1)
        started = time.monotonic()
        assert ros.wait_until(player.done.done, 60.0), player_progress(ros, player)
        played_s = time.monotonic() - started
        assert ros.wait_until(lambda: len(observations) >= FRAMES, 5.0), [m.seq for m in observations]
        assert player.lockstep_timeouts == 0, f"a group waited for a frame the player held ({played_s:.1f} s)"
        pairs = [tuple(image.header.frame_id for image in m.images) for m in observations]
        assert pairs == [(f"a{tick}", f"b{tick}") for tick in range(FRAMES)], pairs
        assert camera.published == FRAMES
