"""The one parameter system (oxygen_ros.ros.parameters) and the nodes' tables, without a node."""

from __future__ import annotations

import pytest

from oxygen_ros.ros import bag_player, camera_parameters, inference_parameters, synthetic_camera
from oxygen_ros.ros.parameters import ParameterError, ParamSpec, check_all, coerce, in_range, one_of, topic_name

INFERENCE = inference_parameters.SPECS
DEFAULTS = {s.name: s.default for s in inference_parameters.PARAMETERS}


@pytest.mark.parametrize("table", [inference_parameters.PARAMETERS, camera_parameters.PARAMETERS,
                                   synthetic_camera.SYNTHETIC_CAMERA_PARAMETERS, bag_player.BAG_PLAYER_PARAMETERS])
def test_every_default_passes_its_own_check(table):
    table = [s for s in table if s.name != "bag_path"]  # no default: the bag player needs one
    values = {s.name: s.default for s in table}
    assert check_all(table, values) == values


def test_types_are_enforced_naming_the_parameter():
    spec = ParamSpec("rate", 1.0, "a rate", "float")
    assert coerce(spec, 2) == 2.0 and isinstance(coerce(spec, 2), float)  # an int for a float is fine
    for bad in ("fast", True, float("nan"), float("inf"), None):
        with pytest.raises(ParameterError, match="parameter 'rate': must be a finite number") as info:
            coerce(spec, bad)
        assert info.value.name == "rate"
    with pytest.raises(ParameterError, match="must be an integer"):
        coerce(ParamSpec("n", 1, "", "int"), 1.5)
    with pytest.raises(ParameterError, match="must be a boolean"):
        coerce(ParamSpec("b", True, "", "bool"), 1)
    assert coerce(ParamSpec("names", [], "", "str_list"), ()) == []
    with pytest.raises(ParameterError, match="list of strings"):
        coerce(ParamSpec("names", [], "", "str_list"), ["a", 1])


def test_a_spec_with_an_unknown_type_is_refused():
    with pytest.raises(ValueError, match="type must be one of"):
        ParamSpec("x", 1, "", "number")


@pytest.mark.parametrize("name,value", [
    ("control_rate_hz", 0.0), ("control_rate_hz", 1000.5), ("denoise_steps", -1), ("denoise_steps", 1001),
    ("max_decode", 0), ("max_active", 0), ("queue_limit", -1), ("max_question_tokens", 0), ("language_every_n_frames", -1),
    ("setting", "turbo"), ("device", "tpu"), ("device", "cuda:x"), ("dtype", "float16"), ("preset", "huge"),
    ("hold_action", "previous"), ("frame_deadline_ms", -1.0), ("max_consecutive_failures", 0),
    ("chunk_origin", "x"), ("joint_names", ["a", "a"]), ("joint_names", ["a", ""]),
    ("observation_topic", "not a topic"), ("text_topic", ""), ("threads", 0), ("warmup_frames", -1),
])
def test_inference_checks_refuse_bad_values_naming_the_parameter(name, value):
    with pytest.raises(ParameterError, match=f"parameter '{name}'") as info:
        coerce(INFERENCE[name], value, DEFAULTS)
    assert info.value.name == name


def test_inference_checks_accept_good_values():
    for name, value in [("device", "cuda:1"), ("denoise_steps", 0), ("denoise_steps", 4), ("setting", "baseline"),
                        ("control_rate_hz", 1000), ("max_observation_age", -1.0), ("joint_names", ["a", "b"])]:
        assert coerce(INFERENCE[name], value, DEFAULTS) == value


def test_compile_reads_the_booleans_yaml_makes_of_on_and_off():
    """``compile:=on`` on a command line, or ``compile: on`` unquoted in a params file, reach the
    node as a YAML boolean."""
    spec = INFERENCE["compile"]
    assert [coerce(spec, v) for v in (True, False, "on", "off", "auto")] == ["on", "off", "on", "off", "auto"]
    with pytest.raises(ParameterError, match="parameter 'compile': must be one of"):
        coerce(spec, "fast")
    with pytest.raises(ParameterError, match="parameter 'setting': must be a string"):
        coerce(INFERENCE["setting"], True)  # only parameters that ask for it read booleans


def test_steps_per_frame_is_checked_against_max_decode():
    assert coerce(INFERENCE["steps_per_frame"], 10, {**DEFAULTS, "max_decode": 10}) == 10
    with pytest.raises(ParameterError, match=r"must not exceed max_decode \(10\)"):
        coerce(INFERENCE["steps_per_frame"], 11, {**DEFAULTS, "max_decode": 10})
    with pytest.raises(ParameterError, match="steps_per_frame"):
        check_all(inference_parameters.PARAMETERS, {**DEFAULTS, "max_decode": 3, "steps_per_frame": 5})


def test_check_helpers():
    assert in_range(1, 3)(2) is None and "1..3" in in_range(1, 3)(4)
    assert one_of(("a", "b"))("a") is None and "a, b" in one_of(("a", "b"))("c")
    assert topic_name("/ok/topic") is None and "not a valid topic name" in topic_name("bad topic")


def test_run_time_changeable_parameters_are_marked():
    dynamic = {s.name for s in inference_parameters.PARAMETERS if s.dynamic}
    assert {"control_rate_hz", "denoise_steps", "steps_per_frame", "hold_action"} <= dynamic
    assert not {"setting", "device", "model_path", "max_decode"} & dynamic


def test_a_run_time_change_goes_through_the_same_check():
    from rclpy.parameter import Parameter

    from oxygen_ros.ros.parameter_changes import changed_values, parameter_callback

    values = dict(DEFAULTS, max_decode=10)
    callback = parameter_callback(inference_parameters.PARAMETERS, lambda: values)
    ok = callback([Parameter("steps_per_frame", value=10), Parameter("use_sim_time", value=True)])
    assert ok.successful
    too_many = callback([Parameter("steps_per_frame", value=11)])
    assert not too_many.successful and "parameter 'steps_per_frame'" in too_many.reason
    assert "max_decode (10)" in too_many.reason
    read_only = callback([Parameter("setting", value="baseline")])
    assert not read_only.successful and "'setting': cannot change while running" in read_only.reason
    assert not callback([Parameter("control_rate_hz", value="fast")]).successful
    changed = changed_values(inference_parameters.PARAMETERS, [Parameter("control_rate_hz", value=25),
                                                              Parameter("use_sim_time", value=True)])
    assert changed == {"control_rate_hz": 25.0} and isinstance(changed["control_rate_hz"], float)


def test_a_parameter_read_at_configure_changes_while_unconfigured_only_and_use_sim_time_never():
    from rclpy.parameter import Parameter

    from oxygen_ros.ros.parameter_changes import changed_values, parameter_callback

    values, state = dict(DEFAULTS, max_active=4), {"unconfigured": False, "sim": False}
    callback = parameter_callback(inference_parameters.PARAMETERS, lambda: values, {"max_active"},
                                  lambda: state["unconfigured"], sim_time=lambda: state["sim"])
    refused = callback([Parameter("max_active", value=2)])
    assert not refused.successful and "parameter 'max_active': is read at configure" in refused.reason
    assert callback([Parameter("max_active", value=4)]).successful  # as it is: a dump loaded back
    assert "cannot change while running" in callback([Parameter("setting", value="baseline")]).reason
    state["unconfigured"] = True
    assert callback([Parameter("max_active", value=2)]).successful
    assert "must be >= 1" in callback([Parameter("max_active", value=0)]).reason  # checked as at start
    assert changed_values(inference_parameters.PARAMETERS, [Parameter("max_active", value=2)], {"max_active"}) == \
        {"max_active": 2}
    # the clock: rclpy would switch it, and the node's timers would wait for a /clock
    sim = callback([Parameter("use_sim_time", value=True)])
    assert not sim.successful and "'use_sim_time' is read at start" in sim.reason
    assert callback([Parameter("use_sim_time", value=False)]).successful


def test_every_bad_value_is_named_at_once():
    """A params file with several mistakes is refused naming each, in the table's order, so
    that it is mended in one go rather than one start per mistake."""
    from oxygen_ros.ros.parameters import ParameterErrors

    bad = {**DEFAULTS, "max_decode": 0, "control_rate_hz": "fast", "device": "gpu"}
    with pytest.raises(ParameterErrors) as caught:
        check_all(inference_parameters.PARAMETERS, bad)
    named = [e.name for e in caught.value.errors]
    assert named == ["device", "control_rate_hz", "max_decode"]
    message = str(caught.value)
    assert message.startswith("3 bad parameters: ")
    assert all(f"parameter '{name}'" in message for name in named)
    # one bad value is told as before, on its own
    with pytest.raises(ParameterError) as one:
        check_all(inference_parameters.PARAMETERS, {**DEFAULTS, "device": "gpu"})
    assert not isinstance(one.value, ParameterErrors) and str(one.value).startswith("parameter 'device'")
    # two values refused only for each other are both told
    with pytest.raises(ParameterErrors) as pair:
        check_all(inference_parameters.PARAMETERS, {**DEFAULTS, "steps_per_frame": 0, "decode_when_idle": False})
    assert {e.name for e in pair.value.errors} == {"steps_per_frame", "decode_when_idle"}


def test_every_checked_parameter_says_its_constraints():
    """`ros2 param describe` shows what a parameter takes for every one a check refuses values of:
    image_size's 1..4096 was enforced but not described."""
    from oxygen_ros.ros.bag_player import BAG_PLAYER_PARAMETERS
    from oxygen_ros.ros.camera_parameters import PARAMETERS as CAMERA
    from oxygen_ros.ros.synthetic_camera import SYNTHETIC_CAMERA_PARAMETERS

    tables = (CAMERA, inference_parameters.PARAMETERS, SYNTHETIC_CAMERA_PARAMETERS, BAG_PLAYER_PARAMETERS)
    assert [s.name for specs in tables for s in specs if s.check is not None and not s.constraints] == []
    by_name = {s.name: s.constraints for s in CAMERA}
    assert by_name["image_size"] == "1..4096" and by_name["max_age"] == "> 0"
    assert by_name["state_topic"] == "a topic name, or empty: none"


def test_the_readme_s_params_file_for_a_robot_names_real_parameters_with_accepted_values():
    """The README's "On your robot" example is what a user copies first: every parameter in it
    exists on its node, and every value passes the node's checks (relations included)."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"\*\*On your robot\.\*\*.*?```yaml\n(.*?)```", text, re.S).group(1)
    tables = {"oxygen_camera": camera_parameters.PARAMETERS, "oxygen_inference": inference_parameters.PARAMETERS}
    sections = yaml.safe_load(block)
    assert set(sections) == set(tables)
    for node, section in sections.items():
        specs = {s.name: s for s in tables[node]}
        given = section["ros__parameters"]
        assert set(given) <= set(specs), set(given) - set(specs)
        values = {**{name: s.default for name, s in specs.items()}, **given}
        for name, value in given.items():
            coerce(specs[name], value, values)  # ParameterError names what is wrong
