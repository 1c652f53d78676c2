"""Replay a rosbag2 of camera frames through camera node -> inference node (tiny model), record the outputs.

The test writes a bag (MCAP and SQLite3) of rgb8 images and a latched
instruction with ``write_bag``, plays it with the ``BagPlayer`` in lockstep
(the next image waits for the ActionChunk of the previous observation), records
``actions_topic`` and ``text_topic`` into a bag of its own and checks that
bag's content. Lockstep plus ``decode_when_idle: false`` and ``decode_budget:
false`` (every frame decodes ``steps_per_frame`` steps, however long it takes)
makes a replay deterministic (one frame per observation, nothing else), so two replays -
and the two storages - must give identical chunks and texts.
"""

import time

import numpy as np
import pytest
from ros_harness import (
    FINISH_REASONS,
    Ros,
    check_chunks,
    check_text,
    params,
    play_once_matched,
    player_progress,
    reliable,
    unique_prefix,
)

FRAMES = 10
H = 10
INSTRUCTION = "pick up the green cube"


def _write_input_bag(path, storage, prefix):
    from std_msgs.msg import String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import rgb_to_image_msg

    t0 = 1_700_000_000 * 10**9
    messages = [(f"{prefix}/instruction", String(data=INSTRUCTION), t0)]
    rng = np.random.default_rng(7)
    for i in range(FRAMES):
        stamp = t0 + (i + 1) * 100_000_000  # 10 Hz camera
        image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        messages.append((f"{prefix}/camera/image_raw", rgb_to_image_msg(image, "rgb8", stamp * 1e-9, "cam"), stamp))
    return write_bag(path, storage, messages, latched_topics=[f"{prefix}/instruction"])


def _replay(bag, out_dir, prefix):
    """Play ``bag`` through fresh nodes; return the path of the recorded output bag."""
    from oxygen_ros.msg import ActionChunk, TextToken

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode
    from oxygen_ros.ros.bag_player import BagPlayer

    topics = dict(observation_topic=f"{prefix}/observation", actions_topic=f"{prefix}/actions",
                  text_topic=f"{prefix}/text")
    recorded = []
    with Ros() as ros:
        recorder = ros.node("oxygen_test_recorder")
        for topic, cls in ((topics["actions_topic"], ActionChunk), (topics["text_topic"], TextToken)):
            recorder.create_subscription(
                cls, topic, lambda m, t=topic: recorded.append((t, m, time.time_ns())), reliable(5000))
        inference = ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            preset="tiny", model_path="", chunk_origin="frame_end", decode_when_idle=False, decode_budget=False,
            max_observation_age=0.0,  # replay timing, not staleness, is under test here
            question_topic=f"{prefix}/question", trajectory_topic=f"{prefix}/trajectory", **topics)))
        camera = ros.add(CameraNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            image_topics=[f"{prefix}/camera/image_raw"], instruction_topic=f"{prefix}/instruction",
            observation_topic=topics["observation_topic"], image_size=32, default_instruction=INSTRUCTION,
            max_age=10.0)))  # lockstep holds images while a frame runs: their stamps age
        player = ros.add(BagPlayer(context=ros.context, namespace=prefix, parameter_overrides=params(
            bag_path=str(bag), lockstep=True, rate=4.0, action_topic=topics["actions_topic"], start_delay_s=60.0)))
        play_once_matched(ros, player, inference)
        assert ros.wait_until(player.done.done, 60.0), player_progress(ros, player)
        assert player.lockstep_timeouts == 0, "lockstep broke: an ActionChunk did not come"
        last = FRAMES - 1
        assert ros.wait_until(lambda: any(m.observation_seq == last for t, m, _ in recorded
                                          if t == topics["actions_topic"]), 20.0)
        assert camera.published == FRAMES
        ros.remove(inference)  # shutdown: the requests still running are cancelled
        expected = inference.counters["text_tokens_published"]
        assert ros.wait_until(lambda: sum(t == topics["text_topic"] for t, _, _ in recorded) >= expected, 10.0)
    out = out_dir / "recorded"
    write_bag(out, "mcap", list(recorded))
    return out, topics


def _outputs(recorded_bag, topics):
    """(chunks in order, text tokens in order) read back from the recorded bag."""
    from oxygen_ros.ros.bags import read_bag

    messages = read_bag(recorded_bag)
    chunks = [m for t, m, _ in messages if t == topics["actions_topic"]]
    text = [m for t, m, _ in messages if t == topics["text_topic"]]
    return chunks, text


def _summary(chunks, text):
    """What must be identical between replays: each frame's full chunk (offset 0)
    and each request's tokens and finish."""
    first = {}
    for m in chunks:
        if m.offset == 0 and m.frame_id not in first:
            first[m.frame_id] = (m.observation_seq, m.action_dim, tuple(np.asarray(m.actions, np.float32).tolist()))
    requests = {rid: (ms[0].client_id, ms[0].frame_id, [(m.index, m.token_id, m.piece) for m in ms],
                      ms[-1].finish_reason) for rid, ms in check_text(text).items()}
    return first, requests


@pytest.fixture(scope="module")
def replays(module_ros_env, tmp_path_factory):
    out = {}
    for storage, run in (("mcap", 1), ("sqlite3", 1), ("mcap", 2)):
        prefix = unique_prefix()
        work = tmp_path_factory.mktemp(f"{storage}_{run}")
        bag = _write_input_bag(work / "input", storage, prefix)
        recorded, topics = _replay(bag, work, prefix)
        out[storage, run] = _outputs(recorded, topics)
    return out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_replay_outputs_are_complete_and_well_formed(replays, storage):
    chunks, text = replays[storage, 1]
    check_chunks(chunks, horizon=H, period=0.02)
    assert {m.observation_seq for m in chunks} == set(range(FRAMES)), "every observation must produce a chunk"
    first_offsets = {}
    for m in chunks:
        first_offsets.setdefault(m.frame_id, m.offset)
    assert len(first_offsets) == FRAMES and set(first_offsets.values()) == {0}

    finished = check_text(text)  # token order per request, done only last
    started = {m.request_id for m in text}
    assert len(started) == FRAMES, "language_every_n_frames=1: one request per observation frame"
    assert set(finished) == started, "every language request must end with done"
    assert all(ms[-1].done and ms[-1].finish_reason in FINISH_REASONS for ms in finished.values())
    assert any(ms[-1].finish_reason in ("eos", "length") for ms in finished.values())


def test_two_lockstep_replays_are_identical(replays):
    a = _summary(*replays["mcap", 1])
    b = _summary(*replays["mcap", 2])
    assert a[0] == b[0], "per-frame chunks differ between two replays"
    assert a[1] == b[1], "texts differ between two replays"
    c = _summary(*replays["sqlite3", 1])
    assert a == c, "the same frames replayed from SQLite3 and MCAP give different outputs"
