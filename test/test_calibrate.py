"""oxygen-calibrate's choice against the inference node's own frame deadline, and the file it
writes for a robot's agent.yaml (the measuring itself: test_bench_tools.py)."""

import pytest
import yaml

from oxygen_ros.core.budget import frame_deadline_ms
from oxygen_ros.tools import calibrate


def test_the_node_s_frame_deadline_binds_when_it_is_shorter_than_the_target_s():
    """A 30 Hz robot with H=16: f >= 30 Hz only asks a frame under 533 ms, while the node's
    language budget gives a frame half a chunk, 267 ms, and would cut a larger k every frame."""
    comp = {"prefill_ms": 20.0, "denoise_step_ms": 10.0, "decode_step_ms": {1: 10.0, 64: 10.0}}
    node_ms = frame_deadline_ms(16, 30.0)  # the node's own rule
    assert round(node_ms, 1) == 266.7
    assert frame_deadline_ms(16, 30.0, 100.0) == 100.0  # the node's frame_deadline_ms, when set
    paper, _ = calibrate.choose_k(comp, n=60, s=10, horizon=16, target_hz=30, margin=1.0, arrivals=1)
    k, table = calibrate.choose_k(comp, n=60, s=10, horizon=16, target_hz=30, margin=1.0, arrivals=1,
                                  frame_deadline_ms=node_ms)
    assert paper == 41 and k == 14  # 20 + 100 + k * 10 within 533 ms, and within 267 ms
    assert table[k - 1]["frame_ms"] <= node_ms < table[k]["frame_ms"]
    # a target stricter than the node's deadline still binds
    assert calibrate.deadline_ms(16, 200.0, node_ms) == 80.0


def test_the_file_names_the_checkpoint_by_its_absolute_path(tmp_path, random_tiny_dir, monkeypatch):
    """The file's values go into a robot's agent.yaml, launched from anywhere: a relative
    --model-path would not load there."""
    import pathlib

    model = pathlib.Path(random_tiny_dir)
    monkeypatch.chdir(model.parent)
    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--model-path", model.name, "--target-hz", "50", "--control-rate-hz", "30",
                           "--max-decode", "8", "--repeats", "2", "--out", str(out)]) == 0
    params = yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]
    assert params["model_path"] == str(model.resolve())
    assert "control_rate_hz 30, frame deadline 166.7 ms" in out.read_text()
    # no --cameras: measured, and written, with every camera slot of the model
    from oxygen_ros.core.checkpoints import load_checkpoint

    slots = load_checkpoint(str(model)).model.config.max_cameras
    assert params["max_cameras"] == slots and f"{slots} camera(s)" in out.read_text()


def test_the_file_holds_the_conditions_k_was_chosen_under_and_the_model_s_files(tmp_path, random_tiny_dir):
    """k fits a frame deadline at a control rate with so many threads: a node that ran the file at its
    defaults (50 Hz, 1 thread) would cut it back every frame. A tokenizer or statistics file given
    for the measurement is the one the node needs too."""
    from oxygen_ros.core.tokenizer import default_tokenizer_path
    from oxygen_ros.ros.inference_parameters import PARAMETERS

    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--model-path", random_tiny_dir, "--tokenizer-path", str(default_tokenizer_path()),
                           "--target-hz", "5", "--control-rate-hz", "10", "--frame-deadline-ms", "400",
                           "--threads", "2", "--max-decode", "4", "--repeats", "2", "--cameras", "1",
                           "--out", str(out)]) == 0
    params = yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]
    assert (params["control_rate_hz"], params["frame_deadline_ms"], params["threads"]) == (10.0, 400.0, 2)
    assert params["max_cameras"] == 1  # k was chosen for one camera's prefill
    assert params["tokenizer_path"] == str(default_tokenizer_path().resolve())
    assert "norm_stats_path" not in params  # not given: the checkpoint's own
    assert set(params) <= {spec.name for spec in PARAMETERS}  # every key a parameter the node declares


def test_a_target_the_actions_alone_miss_writes_k_0_and_exits_1(tmp_path, random_tiny_dir, capsys):
    """--target-hz 100000 wrote k=0 and exited 0, as if the robot would get its rate."""
    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "100000", "--max-decode", "4",
                           "--repeats", "2", "--cameras", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the target cannot be met: the actions alone (prefill and" in err, err
    assert "k=0 (exit status 1): lower --target-hz" in err, err
    assert yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]["steps_per_frame"] == 0


@pytest.mark.parametrize("needed, target, node, given, says", [
    (30.0, 20.0, 100.0, None, "lower --target-hz"),
    (30.0, 100.0, 20.0, None, "the node's frame deadline is the limit, not the target: lower --control-rate-hz"),
    (30.0, 100.0, 20.0, 20.0, "the node's frame deadline is the limit, not the target: give a larger"),
    (600.0, 250.0, 500.0, None, "lower --target-hz, and (the node's frame deadline is missed too) lower"),
    (30.0, 20.0, 20.0, None, "lower --target-hz, and (the node's frame deadline is missed too) lower"),
])
def test_calibrate_names_every_limit_the_actions_miss(needed, target, node, given, says):
    """Lowering the target helps only when the target's limit is missed; the node's deadline
    (half a chunk, or the one given) needs its own fix; both are named when both are missed."""
    from types import SimpleNamespace

    remedy = calibrate.remedy_text(needed, target, node, SimpleNamespace(control_rate_hz=50.0, frame_deadline_ms=given),
                               horizon=10)
    assert remedy.startswith(says), remedy


def test_when_the_node_s_frame_deadline_is_the_limit_calibrate_says_so_not_lower_the_target(tmp_path,
                                                                                            random_tiny_dir, capsys):
    """A target of 5 Hz leaves 2 s for a frame, but the node's frame deadline (here 0.01 ms) is
    what the actions miss: lowering --target-hz would change nothing (a walkthrough)."""
    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "5", "--frame-deadline-ms", "0.01",
                           "--max-decode", "4", "--repeats", "2", "--cameras", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    # the deadline is given: the control rate no longer sets it, and the fix is a larger one
    assert "the node's frame deadline is the limit, not the target: give a larger --frame-deadline-ms" in err, err
    assert "lower --control-rate-hz" not in err and "lower --target-hz" not in err, err
    # the next step: the demo takes the file as it is; a robot's own params file takes its values
    assert f"wrote {out}: try it on the demo with `oxygen-agent demo:=true params_file:={out}`" in err
    assert "on a robot put its values in your copy of config/agent.yaml" in err


def test_compile_on_without_a_compiler_and_a_cold_cache_measures_eager_and_says_why(tmp_path, random_tiny_dir,
                                                                                   capsys, monkeypatch):
    import torch._inductor.config as inductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "calibrated.yaml"
    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "5", "--max-decode", "4",
                               "--repeats", "2", "--cameras", "1", "--compile", "on", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "compile=on runs eager: no working C++ compiler" in err and "cannot be built here" in err, err
    assert yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]["steps_per_frame"] >= 1


def test_a_compiled_calibration_says_the_agent_still_builds_its_own_packages(tmp_path, random_tiny_dir, capsys,
                                                                           monkeypatch):
    """Calibrate's compiled packages are of other shapes than the agent's: without a word, one would
    expect the agent's first start to find a warm cache. (The bucketed pieces run eager here.)"""
    import functools

    from oxygen_ros.core import piece_timing
    from oxygen_ros.core.model.compiled import CompiledVLA

    monkeypatch.setattr(piece_timing, "CompiledVLA", functools.partial(CompiledVLA, compile=False))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "5", "--max-decode", "4", "--repeats", "2",
                           "--cameras", "1", "--compile", "on", "--out", str(tmp_path / "calibrated.yaml")]) == 0
    assert "an agent with compile:=on still builds its own" in capsys.readouterr().err


def _measured(prefill_ms: float, denoise_step_ms: float):
    """A stand-in for the measurement: these figures, whatever the machine (no timing in the test)."""
    return lambda args, measure: {"prefill_ms": prefill_ms, "denoise_step_ms": denoise_step_ms,
                                  "decode_step_ms": {1: 1.0, 2: 1.0}}


def test_a_target_missed_by_the_margin_names_the_limit_after_it_and_what_helps(tmp_path, random_tiny_dir, capsys,
                                                                              monkeypatch):
    """A walkthrough: 'the actions alone (prefill and 10 denoise steps, 12.94 ms) take longer than the
    deadline 14.3 ms': they did not; they missed 0.9 x 14.3 = 12.86 ms, and --margin was not named."""
    monkeypatch.setattr(calibrate, "_measure", _measured(2.94, 1.0))  # 2.94 + 10 x 1.0 = 12.94 ms
    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "700", "--denoise-steps", "10",
                           "--max-decode", "4", "--cameras", "1", "--out", str(out)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert ("the actions alone (prefill and 10 denoise steps, 12.94 ms) take longer than the 12.86 ms a frame may "
            "use (--margin 0.9 of the deadline 14.3 ms: f >= 700 Hz needs 14.3 ms for H=10;") in err, err
    assert "lower --target-hz, or a --margin of 0.91 (at most 1; less headroom for a slower frame)" in err, err


def test_actions_over_the_whole_deadline_are_not_told_to_raise_the_margin(tmp_path, random_tiny_dir, capsys,
                                                                          monkeypatch):
    monkeypatch.setattr(calibrate, "_measure", _measured(5.0, 1.0))  # 15 ms: over 14.3 ms at any margin
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "700", "--denoise-steps", "10",
                           "--max-decode", "4", "--cameras", "1", "--out", str(tmp_path / "c.yaml")]) == 1
    err = capsys.readouterr().err
    assert "take longer than the 12.86 ms a frame may use" in err and "--margin of" not in err, err


def test_calibrate_help_says_how_the_target_relates_to_the_control_rate(capsys):
    with pytest.raises(SystemExit):
        calibrate.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "so f must be at least --control-rate-hz; the node's own frame deadline" in text, text


def test_a_compiled_calibration_says_first_that_packages_are_built_and_then_a_line_per_bucket(
        tmp_path, random_tiny_dir, capsys, monkeypatch):
    """A walkthrough: --compile on built packages for 2 minutes without a word. (The buckets run
    eager here: the lines are the same, without the build.)"""
    import functools

    from oxygen_ros.core import piece_timing
    from oxygen_ros.core.model.compiled import CompiledVLA

    monkeypatch.setattr(piece_timing, "CompiledVLA", functools.partial(CompiledVLA, compile=False))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert calibrate.main(["--model-path", random_tiny_dir, "--target-hz", "5", "--max-decode", "4", "--repeats", "2",
                           "--cameras", "1", "--compile", "on", "--out", str(tmp_path / "calibrated.yaml")]) == 0
    err = capsys.readouterr().err.splitlines()
    first = next(i for i, line in enumerate(err) if line.startswith("compiled: the packages"))
    assert f"not in the cache ({tmp_path / 'cache'}) are built first, a few minutes when it is empty" in err[first]
    buckets = [line for line in err[first:] if line.startswith("bucket ")]
    assert buckets and buckets[0].startswith("bucket 1/") and " s in all)" in buckets[-1], err
