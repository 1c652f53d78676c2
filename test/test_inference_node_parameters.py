"""The inference node's parameters on a running node: bad values refused at start and at
run time (locally and over the parameter service), each naming the parameter; accepted
changes take effect; the start-up log says whose S and H are used.

The checks themselves are unit-tested without a node in test_parameters.py.
"""

import pytest
import torch
from ros_harness import inference_node, unique_prefix

H = 10  # tiny preset horizon
PATIENT = {"frame_deadline_ms": 5000.0}  # a loaded machine does not shrink the language budget

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


OUT_OF_RANGE = [
    ("control_rate_hz", 0.0),
    ("control_rate_hz", -50.0),
    ("steps_per_frame", 8, {"max_decode": 4}),  # k > N
    ("setting", "turbo"),
    ("device", "tpu"),
    ("device", "cuda:x"),
    ("hold_action", "previous"),
    ("frame_deadline_ms", -1.0),
    ("max_consecutive_failures", 0),
    ("steps_per_frame", 0, {"decode_when_idle": False}),  # no frame would ever decode a second token
]


@pytest.mark.parametrize("case", OUT_OF_RANGE, ids=[f"{c[0]}={c[1]}" for c in OUT_OF_RANGE])
def test_start_refuses_out_of_range_and_inconsistent_parameters(ros, case):
    from oxygen_ros.ros.parameters import ParameterError

    name, value = case[0], case[1]
    extra = case[2] if len(case) > 2 else {}
    with pytest.raises(ParameterError, match=f"'{name}'") as info:
        inference_node(ros, unique_prefix(), **{**PATIENT, name: value, **extra})
    assert info.value.name == name


def test_cuda_device_without_cuda_is_refused_naming_device(ros):
    from oxygen_ros.ros.parameters import ParameterError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ParameterError, match="'device'"):
        inference_node(ros, unique_prefix(), device="cuda:0", **PATIENT)


@pytest.mark.parametrize("control_process", [False, True], ids=["control-thread", "control-process"])
def test_runtime_parameters_are_validated_over_the_parameter_service(ros, control_process):
    """Changes over the parameter service: bad values refused naming the parameter, good ones
    applied, with the tick on the node's own thread and in the control process (a new
    ``control_rate_hz`` reaches the ticks in either)."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    prefix = unique_prefix()
    node = inference_node(ros, prefix, control_process=control_process)
    assert (node.control is None) == control_process  # the tick runs where the case says
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


def test_run_time_changes_are_validated_with_a_reason(ros):
    from rclpy.parameter import Parameter

    node = inference_node(ros, unique_prefix(), max_decode=10, steps_per_frame=5, **PATIENT)
    refused = [("control_rate_hz", 0.0), ("control_rate_hz", -1.0), ("steps_per_frame", 11),
               ("setting", "baseline"), ("setting", "turbo"), ("device", "tpu"), ("device", "cuda"),
               ("hold_action", "sometimes"), ("frame_deadline_ms", -5.0), ("max_consecutive_failures", 0)]
    for name, value in refused:
        result = node.set_parameters([Parameter(name, value=value)])[0]
        assert not result.successful, (name, value)
        assert name in result.reason, result.reason
    assert node.params["setting"] == "oxygen" and node.params["device"] == "cpu"
    # accepted ones take effect: the budget follows steps_per_frame and the deadline
    assert node.set_parameters([Parameter("steps_per_frame", value=3)])[0].successful
    assert node.loop.budget.k_max == 3
    assert node.set_parameters([Parameter("frame_deadline_ms", value=0.0)])[0].successful
    assert node.loop.budget.deadline_ms == pytest.approx(H / 50.0 * 1e3 / 2)
    assert node.set_parameters([Parameter("control_rate_hz", value=25.0)])[0].successful
    assert node.loop.budget.deadline_ms == pytest.approx(H / 25.0 * 1e3 / 2)
    assert node.set_parameters([Parameter("frame_deadline_ms", value=150)])[0].successful
    assert node.loop.budget.deadline_ms == 150.0
    assert node.set_parameters([Parameter("hold_action", value="last")])[0].successful
    assert node.set_parameters([Parameter("max_consecutive_failures", value=7)])[0].successful
    assert node.params["max_consecutive_failures"] == 7
    # k = 0 leaves decoding to language-only frames: turning those off as well is refused, either way round
    assert node.set_parameters([Parameter("steps_per_frame", value=0)])[0].successful
    result = node.set_parameters([Parameter("decode_when_idle", value=False)])[0]
    assert not result.successful and "steps_per_frame" in result.reason
    assert node.set_parameters([Parameter("steps_per_frame", value=2)])[0].successful
    assert node.set_parameters([Parameter("decode_when_idle", value=False)])[0].successful
    result = node.set_parameters([Parameter("steps_per_frame", value=0)])[0]
    assert not result.successful and "decode_when_idle" in result.reason
    assert node.loop.settings.steps_per_frame == 2 and node.loop.settings.decode_when_idle is False


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


def test_a_preset_that_cannot_apply_is_named_in_a_warning():
    """``preset:=pi05`` with the embedded default model shipped: the default model loads, and
    the start-up says the preset was not used instead of running another model silently."""
    from oxygen_ros.core.checkpoints import default_model
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import unused_preset

    p = {s.name: s.default for s in PARAMETERS}
    loaded = default_model()
    assert unused_preset(p, loaded) is None
    note = unused_preset({**p, "preset": "pi05"}, loaded)
    assert note.startswith("preset 'pi05' not used: ") and "model_path is empty" in note


def test_the_embedded_demo_model_warns_when_its_actions_would_drive_joints(ros, capfd, random_tiny_dir):
    """Its actions are the synthetic gripper's displacements: an integrator trying the pipeline
    on a real arm's trajectory controller would have sent them as joint positions."""
    inference_node(ros, unique_prefix(), joint_names=["gripper_x", "gripper_y"])  # the embedded model
    err = capfd.readouterr().err
    assert "the embedded default model was trained on the synthetic scene: its actions are displacements" in err
    for values in ({}, {"model_path": random_tiny_dir, "joint_names": ["a", "b"]}):
        inference_node(ros, unique_prefix(), **values)
        assert "trained on the synthetic scene" not in capfd.readouterr().err, values


def test_the_embedded_demo_model_warns_when_its_actions_would_be_held(ros, capfd, random_tiny_dir):
    """hold_action 'last' repeats a chunk's last action, a position's hold; the demo model's are
    displacements, and with its camera node killed the demo's gripper drifted on for as long as the
    outage lasted (an integrator's walkthrough). Said at start and when set at run time."""
    from rclpy.parameter import Parameter

    said = "hold_action 'last' repeats a chunk's last action on an underrun, which holds a position; the embedded"
    inference_node(ros, unique_prefix(), hold_action="last")  # the embedded model
    assert said in capfd.readouterr().err
    node = inference_node(ros, unique_prefix())
    assert said not in capfd.readouterr().err
    assert node.set_parameters([Parameter("hold_action", value="last")])[0].successful
    assert said in capfd.readouterr().err
    inference_node(ros, unique_prefix(), model_path=random_tiny_dir, hold_action="last")
    assert said not in capfd.readouterr().err
