"""Model sizes given outside the checkpoint: ``load_model(sizes=...)``, the command option
``--size KEY=VALUE`` and the inference node's ``model_sizes`` parameter, for a checkpoint
whose config.json does not state them (the config.json route is in test_checkpoint_sizes.py)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch
import yaml
from checkpoint_builders import foreign_state, write_openpi
from engine_harness import cached_outputs
from ros_harness import checkout_env, inference_node, installed_script, unique_prefix
from test_checkpoint_sizes import EXPLICIT, ODD, set_config

from oxygen_ros.core.checkpoints import CheckpointError, SizesError, load_model, parse_sizes, save_native
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.tools import bench, calibrate

# EXPLICIT (test_checkpoint_sizes.py) as command-line items
ITEMS = ["vision.heads=2", "vlm.head_dim=8", "expert.head_dim=8", "max_token_len=20", "max_cameras=2",
         "denoise_steps=4"]


@pytest.fixture(scope="module")
def odd_model():
    return build_model(ODD, seed=5)


@pytest.fixture
def bare(tmp_path, odd_model):
    """An openpi checkpoint of ODD whose config.json has openpi's own fields only: it fails without sizes."""
    path = write_openpi(tmp_path / "bare", foreign_state(odd_model), config=False)
    set_config(path, action_dim=16, action_horizon=5)
    return path


@pytest.fixture
def with_config_json(tmp_path, odd_model):
    """The same checkpoint with the sizes in its config.json (the route that already worked)."""
    path = write_openpi(tmp_path / "config_json", foreign_state(odd_model), config=False)
    set_config(path, action_dim=16, action_horizon=5, oxygen_sizes=EXPLICIT)
    return path


def assert_same_model(a, b):
    assert a.config.replace(name="") == b.config.replace(name="")  # the name is the directory's
    (la, aa), (lb, ab) = cached_outputs(a.model), cached_outputs(b.model)
    assert torch.equal(la, lb) and torch.equal(aa, ab)


# ---------------------------------------------------------------- core: load_model(sizes=...), parse_sizes
def test_without_sizes_the_error_says_every_way_to_give_the_missing_one(bare):
    with pytest.raises(SizesError, match=r"hidden size 32") as info:
        load_model(bare)
    for way in ("oxygen_sizes.vision.heads", "--size vision.heads=N", 'model_sizes: ["vision.heads=N"]'):
        assert way in str(info.value)


def test_given_sizes_load_the_model_the_config_json_route_loads(bare, with_config_json):
    given = load_model(bare, sizes=parse_sizes(ITEMS))
    assert (given.config.vision, given.config.vlm, given.config.max_token_len) == (ODD.vision, ODD.vlm, 20)
    assert_same_model(given, load_model(with_config_json))
    assert_same_model(load_model(bare, sizes=EXPLICIT), given)  # the nested form is the same


def test_given_sizes_win_field_by_field_over_the_config_json(tmp_path, odd_model):
    path = write_openpi(tmp_path, foreign_state(odd_model), config=False)
    set_config(path, action_dim=16, oxygen_sizes=EXPLICIT | {"vision": {"heads": 4}, "action_horizon": 7})
    c = load_model(path, sizes={"vision": {"heads": 2}, "max_token_len": 48}).config
    assert (c.vision.heads, c.max_token_len) == (2, 48)  # given
    assert (c.vlm.head_dim, c.max_cameras, c.action_horizon) == (8, 2, 7)  # the config.json's, not overridden
    assert load_model(path).config.vision.heads == 4


def test_given_sizes_change_a_native_checkpoint_or_a_preset(tmp_path, odd_model):
    save_native(odd_model, tmp_path)
    assert load_model(tmp_path, sizes={"action_horizon": 9}).config.action_horizon == 9
    with pytest.raises(CheckpointError, match=r"mis-shaped: vision\.tower\.embeddings\.patch_embedding"):
        load_model(tmp_path, sizes={"vision": {"hidden": 64}})  # the weights are checked against them
    tiny = load_model(preset="tiny", sizes=parse_sizes("max_token_len=48,action_horizon=4")).config
    assert (tiny.max_token_len, tiny.action_horizon, tiny.vision.hidden) == (48, 4, 64)


@pytest.mark.parametrize("sizes, message", [
    ({"vision": {"head": 2}}, r"unknown field\(s\) in sizes: vision\.head"),
    ({"horizon": 5}, r"unknown field\(s\) in sizes: horizon"),
    ({"vision": 2}, r"sizes\.vision must be an object"),
    ({"max_token_len": "48"}, r"sizes\.max_token_len must be a positive integer, got '48'"),
    ({"vision": {"heads": 0}}, r"sizes\.vision\.heads must be a positive integer, got 0"),
    ({"vision": {"heads": 3}}, r"inconsistent vision sizes.*not divisible by heads 3"),
])
def test_bad_given_sizes_are_named(bare, sizes, message):
    with pytest.raises(SizesError, match=message):
        load_model(bare, sizes=sizes)


def test_the_flat_form_makes_the_nested_one():
    nested = {"vision": {"heads": 2}, "vlm": {"head_dim": 8}, "max_token_len": 48}
    assert parse_sizes("vision.heads=2, vlm.head_dim=8,max_token_len=48,") == nested
    assert parse_sizes(["vision.heads=2", "vlm.head_dim=8,max_token_len=48"]) == nested
    assert parse_sizes([]) == parse_sizes("") == {}


@pytest.mark.parametrize("items, message", [
    ("vision.heads", r"size item 'vision\.heads': expected KEY=VALUE"),
    ("vision.head=2", r"size item 'vision\.head=2': unknown size 'vision\.head'; known: .*vision\.heads"),
    ("vision=2", r"size item 'vision=2': unknown size 'vision' \(a group: name one of its fields"),
    ("max_token_len=4,action_horizon=many", r"size item 'action_horizon=many': action_horizon must be a positive"),
    ("max_cameras=-1", r"size item 'max_cameras=-1'"),
    (["max_cameras=1", "max_cameras=2"], r"max_cameras given twice: 'max_cameras=1' and 'max_cameras=2'"),
])
def test_a_bad_item_is_named(items, message):
    with pytest.raises(SizesError, match=message):
        parse_sizes(items)


# ---------------------------------------------------------------- commands: --size
def test_bench_command_loads_with_size_options_and_refuses_without(tmp_path, bare):
    out = tmp_path / "bench.json"
    command = [installed_script("oxygen-bench"), "--model-path", str(bare), "--settings", "baseline",
               "--compile", "off", "--max-decode", "2", "--steps-per-frame", "1", "--frames", "2", "--warmup", "0"]
    sizes = ["--size", "vision.heads=2", "--size", "vlm.head_dim=8,expert.head_dim=8", "--size", "max_cameras=2"]
    run = subprocess.run(command + sizes + ["--json", str(out)], env=checkout_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["runs"][0]["H"] == 5  # openpi's action_horizon in its config.json
    without = subprocess.run(command, env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert without.returncode != 0 and "Traceback" not in without.stderr
    assert "--size vision.heads=N" in without.stderr


def test_a_bad_size_option_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--size", "max_token_len=48,vision.head=2"])
    err = capsys.readouterr().err
    assert "argument --size" in err and "'vision.head=2'" in err
    with pytest.raises(SystemExit, match=r"--size: .*max_token_len given twice"):
        bench.main(["--preset", "tiny", "--size", "max_token_len=40", "--size", "max_token_len=48"])
    with pytest.raises(SystemExit, match=r"cannot load the model: the given sizes \(vision.heads=5\) do not fit tiny's .*by heads 5"):
        bench.main(["--preset", "tiny", "--size", "vision.heads=5"])


def test_calibrate_writes_the_sizes_it_measured_with(tmp_path, bare):
    out = tmp_path / "calibrated.yaml"
    sizes = [a for item in ITEMS + ["action_horizon=4"] for a in ("--size", item)]
    assert calibrate.main(["--model-path", str(bare), "--target-hz", "50", "--max-decode", "4", "--repeats", "2",
                           *sizes, "--out", str(out)]) == 0
    params = yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]
    assert params["model_path"] == str(bare) and "H=4," in out.read_text()
    assert parse_sizes(params["model_sizes"]) == parse_sizes(ITEMS + ["action_horizon=4"])


# ---------------------------------------------------------------- the inference node: model_sizes
def test_node_loads_with_model_sizes_as_with_the_config_json(ros, bare, with_config_json):
    node = inference_node(ros, unique_prefix(), model_path=str(bare), model_sizes=ITEMS, warmup_frames=1)
    assert_same_model(node.loaded, load_model(with_config_json))


@pytest.mark.parametrize("sizes, name, message", [
    ([], "model_path", r"hidden size 32.*model_sizes: \[\"vision\.heads=N\"\]"),
    (["vision.heads=2", "vlm.head_dim"], "model_sizes", r"size item 'vlm\.head_dim': expected KEY=VALUE"),
    (["vision.heads=3"], "model_sizes", r"inconsistent vision sizes.*heads 3"),
])
def test_node_start_up_failure_names_the_parameter(ros, bare, sizes, name, message):
    from oxygen_ros.ros.parameters import ParameterError

    with pytest.raises(ParameterError, match=f"'{name}'") as info:
        inference_node(ros, unique_prefix(), model_path=str(bare), model_sizes=sizes)
    assert info.value.name == name
    assert re.search(message, info.value.reason, flags=re.DOTALL), info.value.reason


def test_start_up_log_says_which_sizes_the_parameter_set():
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import startup_summary

    p = {s.name: s.default for s in PARAMETERS} | {"model_sizes": ["action_horizon=4"]}
    summary = startup_summary(load_model(preset="tiny", sizes={"action_horizon": 4}), p)
    assert "with sizes action_horizon=4 (parameter model_sizes)" in summary
    assert "H=4 actions (parameter model_sizes)" in summary and "denoise steps (the checkpoint's)" in summary


def test_launch_argument_gives_the_parameter_its_items():
    from oxygen_ros.ros.plan import node_plan

    def sizes(text):
        (inference,) = [i for i in node_plan({"model_sizes": text}) if i["spec"].name == "oxygen_inference"]
        return inference["parameters"]["model_sizes"]

    assert sizes("vision.heads=2, max_token_len=48") == ["vision.heads=2", "max_token_len=48"]
    assert sizes("[vision.heads=2]") == ["vision.heads=2"]  # a YAML list, as ros2 launch types it
    assert "model_sizes" not in node_plan({})[-1]["parameters"]  # empty: the parameters file's
