"""The inference node's ``compile`` parameter on real DDS: compiled pieces at start-up,
the recompile count on /diagnostics, and eager (never a failed start) where compiling
is impossible."""

import time

import pytest
from ros_harness import (
    Ros,
    inference_node,
    inference_topics,
    observation_msg,
    reliable,
    ros_environment,
    unique_prefix,
    until,
)


@pytest.fixture
def ros(monkeypatch, tmp_path):
    ros_environment(monkeypatch, tmp_path)
    with Ros() as r:
        yield r


def _drive(ros, node, prefix, frames=6):
    """Publish observations until ``frames`` chunks arrived; returns the chunks."""
    from oxygen_ros.msg import ActionChunk, Observation

    t = inference_topics(prefix)
    client = ros.node("compile_client")
    chunks = []
    client.create_subscription(ActionChunk, t["actions_topic"], chunks.append, reliable(100))
    pub = client.create_publisher(Observation, t["observation_topic"], reliable(10))
    assert until(lambda: pub.get_subscription_count() >= 1, 20.0), "inference node not discovered"
    seq = 0
    end = time.monotonic() + 60.0
    while len({c.frame_id for c in chunks}) < frames and time.monotonic() < end:
        seq += 1
        pub.publish(observation_msg(seq, client.get_clock().now().nanoseconds))
        time.sleep(0.1)
    return chunks


def test_without_a_compiler_compile_on_runs_eager_and_the_node_still_acts(ros, monkeypatch, tmp_path):
    import torch._inductor.config as inductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # cold: its packages need building
    prefix = unique_prefix()
    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        node = inference_node(ros, prefix, compile="on", max_active=1)
    assert node.engine.compiled is None and "C++ compiler" in node.engine.compile_reason
    d = node.diagnostics()
    assert d["compiled"] is False and d["recompiles"] == 0
    assert len({c.frame_id for c in _drive(ros, node, prefix, frames=3)}) >= 3


def test_compile_on_compiles_every_bucket_at_start_and_never_again(ros, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compile-cache"))
    prefix = unique_prefix()
    node = inference_node(ros, prefix, compile="on", max_active=1, denoise_steps=2, steps_per_frame=1,
                          max_decode=4)
    assert node.engine.compiled is not None, node.engine.compile_reason
    chunks = _drive(ros, node, prefix, frames=6)
    assert len({c.frame_id for c in chunks}) >= 6
    d = node.diagnostics()
    assert d["compiled"] is True and d["recompiles"] == 0, d


def test_each_bucket_s_line_says_the_seconds_since_the_line_before_and_in_all():
    """The bucket lines gave the seconds since the warm-up began, where the README said each
    bucket's own (a walkthrough read '(from the cache) (147.4 s)')."""
    import re
    import time
    from types import SimpleNamespace

    from oxygen_ros.ros.inference_setup import compile_pieces

    waiting = "waiting for process 12, which is building packages into /cache/aoti ..."

    def warm_up(progress, note):
        note(waiting)  # another process building into the same cache: the warm-up waits for it
        time.sleep(0.2)
        progress(1, 2, "decode batch 1 (compiled)")
        progress(2, 2, "decode batch 2 (from the cache)")

    lines = []
    engine = SimpleNamespace(compiled=SimpleNamespace(bucket_count=2, cache_dir="/cache"), warm_up=warm_up)
    compile_pieces(engine, "on", SimpleNamespace(info=lines.append, warning=lines.append))
    assert lines[0] == waiting
    first, second = (re.fullmatch(r"bucket \d/2: .* \((\d+\.\d) s; (\d+\.\d) s in all\)", line) for line in lines[1:])
    assert float(first[1]) >= 0.2 and float(second[2]) >= float(first[2]) >= 0.2, lines
    assert float(second[1]) < float(second[2]), lines  # its own seconds, not the warm-up's
