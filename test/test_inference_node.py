"""The inference node on real DDS: a tiny model, a test publisher of Observations and Questions.

Counts, not timing: the machine may be loaded by other work, so the assertions
ask for a fraction of the nominal message rate and for well-formed content.
"""

import time

import numpy as np
import pytest
from ros_harness import (
    Ros,
    check_chunks,
    check_text,
    inference_node,
    inference_topics,
    observation_msg,
    reliable,
    ros_environment,
    unique_prefix,
)

H = 10  # tiny preset horizon
RATE = 50.0


@pytest.fixture
def ros(monkeypatch, tmp_path):
    ros_environment(monkeypatch, tmp_path)
    with Ros() as r:
        yield r


class Client:
    """A test node: publishes observations and questions, records every output."""

    def __init__(self, ros, prefix):
        from diagnostic_msgs.msg import DiagnosticArray
        from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken
        from trajectory_msgs.msg import JointTrajectory

        t = inference_topics(prefix)
        self.node = ros.node("oxygen_test_client")
        self.chunks, self.text, self.trajectories, self.diagnostics = [], [], [], []
        self.node.create_subscription(ActionChunk, t["actions_topic"], self.chunks.append, reliable(100))
        self.node.create_subscription(TextToken, t["text_topic"], self.text.append, reliable(5000))
        self.node.create_subscription(JointTrajectory, t["trajectory_topic"], self.trajectories.append, reliable(100))
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, reliable(10))
        self.obs_pub = self.node.create_publisher(Observation, t["observation_topic"], reliable(10))
        self.q_pub = self.node.create_publisher(Question, t["question_topic"], reliable(10))
        self.Question = Question
        self.seq = 0

    def wait_matched(self, ros):
        assert ros.wait_until(lambda: self.obs_pub.get_subscription_count() >= 1
                              and self.q_pub.get_subscription_count() >= 1, 20.0), "inference node not discovered"

    def publish_observations(self, seconds, rate_hz=20.0):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = self.node.get_clock().now().nanoseconds
            self.obs_pub.publish(observation_msg(self.seq, now))
            self.seq += 1
            time.sleep(1.0 / rate_hz)

    def ask(self, client_id, text):
        self.q_pub.publish(self.Question(client_id=client_id, text=text))


def test_actions_at_control_rate_text_streams_and_questions(ros, random_tiny_dir):
    prefix = unique_prefix()
    # untrained weights: requests run to max_decode, so some are in flight at shutdown
    node = inference_node(ros, prefix, joint_names=["j0", "j1"], model_path=random_tiny_dir)
    client = Client(ros, prefix)
    client.wait_matched(ros)

    client.publish_observations(1.0)
    client.ask("client-a", "what do you see?")
    client.publish_observations(2.0)
    assert ros.wait_until(lambda: any(m.client_id == "client-a" and m.done for m in client.text), 20.0), \
        "the question was not answered"
    ros.remove(node)  # clean shutdown: running requests end with `cancelled`
    assert ros.wait_until(lambda: any(m.finish_reason == "cancelled" for m in client.text), 10.0)
    time.sleep(0.3)

    # ActionChunks: one per tick while a chunk has actions left (count, not timing)
    chunks = list(client.chunks)
    published = node.counters["actions_published"]
    assert len(chunks) >= 0.9 * published
    # more than one chunk's worth: ticks keep publishing the newest chunk at an advancing offset
    # (the rate itself is a benchmark figure, `oxygen-agent --report`, not asserted here)
    assert published >= 2 * H, f"only {published} ActionChunks in ~3 s at {RATE} Hz: {dict(node.counters)}"
    check_chunks(chunks, horizon=H, period=1 / RATE)
    seqs = {m.observation_seq for m in chunks}
    assert seqs <= set(range(client.seq))
    assert len({m.frame_id for m in chunks}) >= 10, "chunks of too few frames"
    assert max(m.offset for m in chunks) >= 1, "offsets never advanced"

    # JointTrajectory: the first two action dimensions, one point per action from the offset on
    trajectories = list(client.trajectories)
    assert trajectories and all(list(t.joint_names) == ["j0", "j1"] for t in trajectories)
    first = chunks[0]
    match = [t for t in trajectories if t.header.stamp == first.header.stamp]
    assert match and len(match[0].points) == first.horizon
    a = np.asarray(first.actions, dtype=np.float32).reshape(first.horizon, first.action_dim)
    np.testing.assert_allclose([p.positions for p in match[0].points], a[:, :2], rtol=1e-6)

    # text: per request in index order, each finished one ends with done + a finish reason
    finished = check_text(client.text)
    started = {m.request_id for m in client.text}
    assert started and set(finished) == started, "every request must end (finished or cancelled at shutdown)"
    reasons = {ms[-1].finish_reason for ms in finished.values()}
    assert "length" in reasons or "eos" in reasons
    periodic = [ms for ms in finished.values() if ms[0].client_id == ""]
    assert len(periodic) >= 5, "language_every_n_frames=1 starts a request per observation frame"
    answer = [ms for ms in finished.values() if ms[0].client_id == "client-a"]
    assert len(answer) == 1 and answer[0][-1].finish_reason in ("eos", "length")
    assert all(m.token_id >= 0 for m in answer[0][:-1])

    # diagnostics once a second, with the figures the brief asks for
    ours = [s for d in client.diagnostics for s in d.status if s.name.startswith("oxygen_inference")]
    assert ours, "no /diagnostics from the node"
    keys = {kv.key for kv in ours[-1].values}
    assert {"action_frequency_hz", "frame_latency_ms", "chunk_age_ms", "underruns", "active_batch",
            "tokens_per_s", "kv_bytes_reserved", "kv_bytes_in_use", "setting", "k"} <= keys


def test_on_demand_only_and_question_before_any_observation(ros):
    prefix = unique_prefix()
    node = inference_node(ros, prefix, language_every_n_frames=0, chunk_origin="frame_end")
    client = Client(ros, prefix)
    client.wait_matched(ros)

    client.ask("early", "anyone there?")  # nothing to answer from yet: rejected, carrying the client id
    assert ros.wait_until(lambda: any(m.client_id == "early" for m in client.text), 10.0)
    early = [m for m in client.text if m.client_id == "early"]
    assert len(early) == 1 and early[0].done and early[0].finish_reason == "rejected" and early[0].token_id == -1

    client.publish_observations(1.0)
    assert ros.wait_until(lambda: len(client.chunks) >= 5, 10.0)
    assert [m for m in client.text if m.client_id != "early"] == [], "language_every_n_frames=0: no periodic text"
    # frame_end origin: every frame's chunk is first published at offset 0
    by_frame = {}
    for m in list(client.chunks):
        by_frame.setdefault(m.frame_id, m.offset)
    assert set(by_frame.values()) == {0}

    client.ask("late", "and now?")
    client.ask("later", "and again?")
    # no more observations: idle decoding (decode_when_idle) finishes the answers
    assert ros.wait_until(lambda: sum(m.done for m in client.text if m.client_id in ("late", "later")) == 2, 20.0)
    answers = check_text([m for m in client.text if m.client_id in ("late", "later")])
    assert {ms[0].client_id for ms in answers.values()} == {"late", "later"}
    assert all(ms[-1].finish_reason in ("eos", "length") for ms in answers.values())
    assert node.counters["language_frames"] >= 1


BAD_START = [
    ("control_rate_hz", -5.0),
    ("control_rate_hz", "fast"),
    ("setting", "fastest"),
    ("steps_per_frame", 31),  # > max_decode (30)
    ("device", "tpu"),
    ("dtype", "float16"),
    ("max_active", 0),
    ("threads", 0),
    ("chunk_origin", "later"),
    ("joint_names", ["a", "a"]),
    ("actions_topic", "not a topic"),
    ("model_path", "/nonexistent/checkpoint"),
    ("preset", "huge"),
]


@pytest.mark.parametrize("name,value", BAD_START, ids=[f"{n}={v}" for n, v in BAD_START])
def test_start_refuses_bad_parameters_naming_them(ros, name, value):
    from oxygen_ros.ros.parameters import ParameterError

    with pytest.raises(ParameterError, match=f"'{name}'") as info:
        inference_node(ros, unique_prefix(), **{name: value})
    assert info.value.name == name


def test_joint_names_longer_than_the_action_is_refused(ros):
    from oxygen_ros.ros.parameters import ParameterError

    with pytest.raises(ParameterError, match="'joint_names'"):
        inference_node(ros, unique_prefix(), joint_names=[f"j{i}" for i in range(33)])


def test_runtime_parameters_are_validated_over_the_parameter_service(ros):
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    prefix = unique_prefix()
    node = inference_node(ros, prefix)
    client_node = ros.node("oxygen_test_param_client")
    service = f"{prefix}/oxygen_inference/set_parameters"
    cli = client_node.create_client(SetParameters, service)
    assert cli.wait_for_service(timeout_sec=20.0), service

    def set_params(**values):
        request = SetParameters.Request(parameters=[Parameter(k, value=v).to_parameter_msg()
                                                    for k, v in values.items()])
        future = cli.call_async(request)
        assert ros.wait_until(future.done, 10.0)
        return future.result().results

    for name, value in [("control_rate_hz", 0.0), ("steps_per_frame", 31), ("steps_per_frame", -1),
                        ("denoise_steps", -1), ("language_every_n_frames", -2), ("chunk_origin", "x"),
                        ("max_observation_age", "old"), ("decode_when_idle", 1)]:
        (result,) = set_params(**{name: value})
        assert not result.successful, (name, value)
        assert name in result.reason, result.reason
    (result,) = set_params(setting="baseline")  # read-only: refused, naming it
    assert not result.successful and "setting" in result.reason

    before = node.params["control_rate_hz"]
    (result,) = set_params(control_rate_hz=25)  # an int for a double is fine
    assert result.successful, result.reason
    assert node.params["control_rate_hz"] == 25.0 != before
    assert node.tick_period_ns == 40_000_000
    (result,) = set_params(steps_per_frame=2)
    assert result.successful and node.params["steps_per_frame"] == 2
    (result,) = set_params(denoise_steps=4)  # applied by the worker between frames
    assert result.successful
    assert ros.wait_until(lambda: node.loop.settings.denoise_steps == 4, 5.0)


def test_start_up_log_says_whose_denoise_steps_and_horizon():
    from oxygen_ros.core.checkpoints import default_model
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import engine_config, startup_summary

    p = {s.name: s.default for s in PARAMETERS}
    loaded = default_model()
    mc = loaded.config
    assert f"S={mc.denoise_steps} denoise steps (the checkpoint's)" in startup_summary(loaded, p)
    assert f"H={mc.action_horizon} actions (the checkpoint's)" in startup_summary(loaded, p)
    assert engine_config(p).denoise_steps is None  # the engine then uses the model's
    assert "S=4 denoise steps (parameter denoise_steps)" in startup_summary(loaded, {**p, "denoise_steps": 4})
    assert engine_config({**p, "denoise_steps": 4}).denoise_steps == 4
