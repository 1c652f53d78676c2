"""The inference node's start-up and shutdown: start-up failures say why; SIGTERM /
shutdown stop the timers and the worker, finish in-flight language requests with
``cancelled`` and leave no thread behind.

The node runs as a user runs it (``python -m oxygen_ros.ros.inference_node --ros-args
...``, a real process on real DDS) for the signal and exit-code tests; PYTHONPATH puts
this checkout first. Durations are printed, never asserted (the machine may be loaded).
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from message_builders import observation_msg
from ros_harness import (OutputLines, checkout_env, inference_topics, params, process_ended, reliable, unique_prefix,
                         until)

class NodeProcess:
    """``python -m oxygen_ros.ros.inference_node --ros-args -p ...``; its output is
    collected as it comes (``output()``)."""

    def __init__(self, prefix, module="inference_node", **params):
        values = {**inference_topics(prefix), "preset": "tiny", "frame_deadline_ms": 5000.0, **params}
        args = [sys.executable, "-m", f"oxygen_ros.ros.{module}", "--ros-args"]
        for k, v in values.items():
            args += ["-p", f"{k}:={str(v).lower() if isinstance(v, bool) else v}"]
        self.proc = subprocess.Popen(args, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.out = OutputLines(self.proc)

    def output(self, last=4000):
        return self.out.text(last)

    def wait(self, timeout=30.0):
        """Wait for the exit (killed past ``timeout``); the return code."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        self.out.join()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_sigterm_cancels_in_flight_requests_and_the_process_exits_cleanly(ros, random_tiny_dir):
    from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken

    prefix = unique_prefix()
    # untrained weights: the answer runs to max_decode (the default model may say EOS at once)
    proc = NodeProcess(prefix, language_every_n_frames=0, steps_per_frame=1, max_decode=30,
                       decode_when_idle=False, model_path=random_tiny_dir)
    try:
        t = inference_topics(prefix)
        client = ros.node("oxygen_test_sigterm_client")
        text, chunks = [], []
        client.create_subscription(TextToken, t["text_topic"], text.append, reliable(1000))
        client.create_subscription(ActionChunk, t["actions_topic"], chunks.append, reliable(100))
        obs = client.create_publisher(Observation, t["observation_topic"], reliable(10))
        questions = client.create_publisher(Question, t["question_topic"], reliable(10))
        seq = [0]

        def observe():
            obs.publish(observation_msg(seq[0], client.get_clock().now().nanoseconds))
            seq[0] += 1

        assert until(lambda: obs.get_subscription_count() >= 1 and questions.get_subscription_count() >= 1,
                     timeout=60.0), "the node process did not come up:\n" + proc.output()
        # observation frames first (a question needs one), then the question; frames until it is running
        assert until(lambda: chunks, every=observe, period=0.05), proc.output()
        questions.publish(Question(client_id="in-flight", text="what do you see?"))
        assert until(lambda: any(m.client_id == "in-flight" for m in text), every=observe, period=0.05)
        # no more observations: with decode_when_idle false the request stays in flight
        time.sleep(0.3)
        assert not any(m.client_id == "in-flight" and m.done for m in text), \
            str([(m.index, m.token_id, m.finish_reason) for m in text if m.client_id == "in-flight"]) + proc.output()

        t0 = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        exit_s = time.monotonic() - t0
        out = proc.output(100_000)
        assert code == 0, out[-3000:]
        assert until(lambda: any(m.client_id == "in-flight" and m.done for m in text), timeout=10.0), out[-3000:]
        (end,) = [m for m in text if m.client_id == "in-flight" and m.done]
        assert end.finish_reason == "cancelled" and end.token_id == -1
        tokens = [m for m in text if m.client_id == "in-flight"]
        assert [m.index for m in tokens] == list(range(len(tokens)))  # nothing lost before the cancellation
        assert end.index == len(tokens) - 1
        assert "requests cancelled" in out
        assert "threads still running at exit" not in out, out[-3000:]
        stopped = [line for line in out.splitlines() if "timers and worker stopped in" in line]
        print(f"\n  SIGTERM -> process exit {exit_s:.2f} s; {stopped[-1].split(': ', 1)[-1] if stopped else ''}")
    finally:
        proc.kill()


@pytest.mark.parametrize("control_process", [True, False], ids=["control-process", "control-thread"])
def test_shutdown_in_process_stops_timers_and_worker_and_cancels(ros, control_process, random_tiny_dir):
    from oxygen_ros.msg import Observation, Question, TextToken

    from oxygen_ros.ros.inference_node import InferenceNode

    prefix = unique_prefix()
    t = inference_topics(prefix)
    # untrained weights: a request running at the shutdown cannot end by EOS in the frame still in flight
    values = {**t, "preset": "tiny", "model_path": random_tiny_dir, "language_every_n_frames": 1,
              "steps_per_frame": 1, "max_decode": 30, "decode_when_idle": False, "frame_deadline_ms": 5000.0,
              "control_process": control_process}
    node = ros.add(InferenceNode(context=ros.context, parameter_overrides=params(**values)))
    client = ros.node("oxygen_test_shutdown_client")
    text = []
    client.create_subscription(TextToken, t["text_topic"], text.append, reliable(1000))
    obs = client.create_publisher(Observation, t["observation_topic"], reliable(10))
    client.create_publisher(Question, t["question_topic"], reliable(10))
    seq = [0]

    def observe():
        obs.publish(observation_msg(seq[0], client.get_clock().now().nanoseconds))
        seq[0] += 1

    assert until(lambda: node.engine.active_requests >= 2, every=observe, period=0.05)
    worker = node.worker
    assert worker.alive
    running = {r.id for r in node.engine.requests.active.values()}
    node.shutdown()  # what destroy_node, Ctrl-C and SIGTERM run
    assert not worker.alive
    assert node.diagnostics_timer.is_canceled()
    pid = node.control_pid
    if control_process:  # it ends with the node, and its end (told by the shutdown) is no failure
        assert pid is not None and node.control is None
        assert until(lambda: process_ended(pid), timeout=10.0), "control process still running"
        assert node.control_failure is None  # an agent watching would end its run with status 1
    else:
        assert pid is None and node.control.stopped and not node.control.alive
    ros.remove(node)
    assert pid is None or until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=10.0), "control process left"
    assert not [th for th in threading.enumerate() if th.name.startswith("oxygen-inference")]
    assert until(lambda: running <= {m.request_id for m in text if m.done and m.finish_reason == "cancelled"},
                 timeout=10.0)
    print(f"\n  in-process shutdown: timers and worker stopped in {node.stop_ms:.0f} ms")


def test_a_model_that_does_not_load_is_refused_with_its_cause(tmp_path, ros):
    bad = tmp_path / "checkpoint"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"garbage, not safetensors")
    proc = NodeProcess(unique_prefix(), model_path=str(bad))
    code = proc.wait(timeout=120.0)
    out = proc.output()
    assert code == 2, out[-3000:]
    assert "parameter 'model_path'" in out and "safetensors" in out, out[-3000:]
    assert "start-up failed" in out  # the node's own log line, with the cause


def test_a_model_load_fault_that_is_not_a_parameter_is_reported_with_its_cause(ros, monkeypatch):
    from oxygen_ros.ros import inference_node, inference_setup

    def out_of_memory(params):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(inference_node, "load_model", out_of_memory)
    with pytest.raises(inference_setup.ModelLoadError, match="out of memory") as info:
        inference_node.InferenceNode(context=ros.context, parameter_overrides=params(preset="tiny"))
    assert "embedded default" in str(info.value) and "cpu" in str(info.value)
    assert not [th for th in threading.enumerate() if th.name.startswith("oxygen-inference")]


@pytest.mark.parametrize("control_process", [True, False], ids=["control-process", "control-thread"])
def test_a_destroyed_inference_node_leaves_its_context_and_dds_participant_to_be_freed(ros_env, control_process):
    """configure freezes the objects alive after the warm-up out of the garbage collector's
    reach (no full collection during ticks); destroying the node hands them back. Frozen,
    a node's context and with it its DDS participant were never freed: a process that makes
    nodes one after another (this suite) kept every participant, each still discovering,
    and hung in Fast DDS once thirty had piled up."""
    import gc
    import weakref

    from ros_harness import Ros, inference_node

    with Ros() as ros:
        inference_node(ros, unique_prefix(), warmup_frames=0, control_process=control_process)
        context = weakref.ref(ros.context)
    del ros
    gc.collect()
    assert context() is None, "the destroyed node's context (and its DDS participant) outlived it"



@pytest.mark.parametrize("module", ["inference_node", "managed_inference_node"])
@pytest.mark.parametrize("when", ["starting", "running"])
def test_ctrl_c_under_ros2_launch_a_second_sigint_does_not_cut_the_clean_up_short(module, when):
    """Ctrl-C in the terminal of a ``ros2 launch`` sends SIGINT to every process, and the
    launch then forwards its own: the node gets more than one, the later ones while it
    closes (the control process stopping, its shared memory unlinked). Whether the first
    comes while the node starts (its control process just started, configure not done)
    or runs, the clean-up runs to its end: exit status 0, no traceback, no shared
    memory left behind."""
    proc = NodeProcess(unique_prefix(), module)
    try:
        running = "active: publishing" if module == "managed_inference_node" else "setting oxygen"
        started = "control tick: in its own process" if when == "starting" else running
        assert until(lambda: started in proc.output(), timeout=60.0), proc.output()
        if when == "running":
            time.sleep(0.5)
        deadline = time.monotonic() + 10.0
        while proc.proc.poll() is None and time.monotonic() < deadline:  # SIGINT every 20 ms until it ends
            proc.proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        code = proc.wait()
        out = proc.output(100_000)
        assert code == 0, out[-3000:]
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
        assert "leaked shared_memory" not in out, out[-3000:]
    finally:
        proc.kill()
