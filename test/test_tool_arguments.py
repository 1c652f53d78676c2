"""The commands' arguments: a bad value ends a command at once, with argparse's one line naming
the option, before a model loads or a run starts: an output path that cannot be written
(nothing produced is lost to it at the end), a count out of range (``oxygen-eval --execute 0``
looped for ever)."""

import argparse
from pathlib import Path

import pytest

from oxygen_ros.tools.arguments import (non_negative_float, output_dir, output_file, positive_float, positive_int,
                                        write_output)


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("")
    return path


def test_output_paths_are_checked_up_front(tmp_path, a_file):
    assert output_file(str(tmp_path / "new" / "deeper" / "report.json")) == tmp_path / "new" / "deeper" / "report.json"
    assert output_dir(str(tmp_path / "figures")) == tmp_path / "figures"
    with pytest.raises(argparse.ArgumentTypeError, match="a_file is a file, not a folder"):
        output_file(str(a_file / "report.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder; give a file name"):
        output_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="is a file, not a folder"):
        output_dir(str(a_file))
    with pytest.raises(argparse.ArgumentTypeError, match="a_file is a file"):
        output_dir(str(a_file / "model"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device every write to fails)")
def test_an_output_that_fails_when_written_goes_to_stdout_naming_the_path(tmp_path, capsys):
    """What the up-front checks cannot see (a full disk) failed after the whole run, in a
    traceback, and its figures were lost (a walkthrough: ``oxygen-bench --json /dev/full``)."""
    assert not write_output(Path("/dev/full"), '{"f": 1}', "oxygen-bench")
    printed = capsys.readouterr()
    assert printed.err == ("oxygen-bench: could not write /dev/full: No space left on device; what it would hold "
                           "follows on stdout\n"), printed.err
    assert printed.out == '{"f": 1}\n'
    assert write_output(tmp_path / "new" / "r.json", "{}\n", "oxygen-bench")  # its folders made
    assert (tmp_path / "new" / "r.json").read_text() == "{}\n" and capsys.readouterr().out == ""


def test_numbers_in_range():
    assert positive_int("3") == 3 and positive_float("0.5") == 0.5
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="an integer >= 1"):
            positive_int(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="a number > 0"):
        positive_float("0")
    assert non_negative_float("0") == 0.0
    assert positive_int("9" * 400) == int("9" * 400)  # too large for a float, still an integer >= 1
    for bad in ("nan", "inf", "-inf", "-0.5"):  # float() takes "nan" and "inf": they are not numbers in range
        with pytest.raises(argparse.ArgumentTypeError):
            non_negative_float(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(bad)


def _refused(parse, argv, capsys, *names):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert all(name in err for name in names), err


def test_each_command_refuses_an_unusable_output_naming_it(capsys, a_file):
    from oxygen_ros.tools import bench, calibrate, eval as eval_tool, prefill_bench, train, train_tokenizer

    bad = str(a_file / "out.json")
    _refused(bench.parse_args, ["--json", bad], capsys, "--json", "is a file")
    _refused(bench.parse_args, ["--plot", str(a_file)], capsys, "--plot", "is a file")
    same = str(a_file.parent / "same")
    _refused(bench.parse_args, ["--json", same, "--plot", same], capsys, "--json and --plot name the same path")
    _refused(bench.parse_args, ["--pieces-only", "--tick-probe", "5"], capsys, "two different runs")
    _refused(bench.parse_args, ["--pieces-only", "--plot", same], capsys, "--plot draws the frames of runs")
    _refused(calibrate.parse_args, ["--out", bad, "--target-hz", "50"], capsys, "--out")
    _refused(calibrate.parse_args, ["--out", "x.yaml", "--target-hz", "nan"], capsys, "--target-hz")
    _refused(eval_tool.parse_args, ["--json", bad], capsys, "--json")
    _refused(prefill_bench.parse_args, ["--json", bad], capsys, "--json")
    # --compare naming nothing, or only the setting it runs anyway: accepted, it compared nothing
    _refused(eval_tool.parse_args, ["--compare"], capsys, "--compare")
    _refused(eval_tool.parse_args, ["--compare", "oxygen"], capsys, "--compare", "other than --setting (oxygen)")
    assert eval_tool.parse_args(["--compare", "oxygen", "baseline"]).compare == ["oxygen", "baseline"]
    _refused(train.parse_args, ["--out", str(a_file / "model")], capsys, "--out", "is a file")
    _refused(train.parse_args, [], capsys, "--out")  # no default: the installed package's model
    _refused(train_tokenizer.main, ["--out", bad], capsys, "--out")


def test_ros_commands_refuse_bad_outputs_and_values_naming_them(capsys, a_file):
    from oxygen_ros.tools import agent, ask, record, soak

    _refused(record.parse_args, [str(a_file / "bag")], capsys, "out", "is a file, not a folder")
    _refused(record.parse_args, [str(a_file)], capsys, "exists already")

    _refused(agent.parse_args, ["--report", str(a_file / "r.json")], capsys, "--report")
    _refused(soak.main, ["--json", str(a_file / "s.json")], capsys, "--json")
    _refused(ask.parse_args, ["--max-tokens", "-1", "q?"], capsys, "--max-tokens")
    _refused(ask.parse_args, ["--action", "bad//name", "q?"], capsys, "--action", "not a valid action")
    _refused(ask.parse_args, ["--timeout", "0", "q?"], capsys, "--timeout")


def test_eval_and_train_refuse_counts_out_of_range(capsys, tmp_path):
    from oxygen_ros.tools import eval as eval_tool, train

    for option in ("--execute", "--scenes", "--concurrency", "--max-steps", "--camera-size"):
        _refused(eval_tool.parse_args, [option, "0"], capsys, option)
    _refused(eval_tool.parse_args, ["--setting", "fast"], capsys, "--setting")
    out = ["--out", str(tmp_path / "m")]
    for option, value in (("--steps", "-1"), ("--batch-size", "0"), ("--lr", "-1"), ("--log-every", "0"),
                          ("--threads", "0"), ("--workers", "-1"), ("--preset", "foo"), ("--size", "foo=1")):
        _refused(train.parse_args, [*out, option, value], capsys, option)


def test_evaluate_refuses_an_execute_count_outside_the_chunk(lively_tiny):
    from oxygen_ros.core.tokenizer import Tokenizer
    from oxygen_ros.tools.eval import evaluate

    horizon = lively_tiny.config.action_horizon
    for execute in (0, horizon + 1):
        with pytest.raises(ValueError, match=f"execute must be in 1..{horizon}"):
            evaluate(lively_tiny, Tokenizer.default(), None, scenes=1, execute=execute)


def test_evaluate_refuses_statistics_with_fewer_actions_than_the_reach_task_takes(lively_tiny):
    from oxygen_ros.core.normalization import openpi_normalizer
    from oxygen_ros.core.tokenizer import Tokenizer
    from oxygen_ros.tools.eval import evaluate

    one = {"mean": [0.0], "std": [1.0], "q01": [-1.0], "q99": [1.0]}
    normalizer = openpi_normalizer({"norm_stats": {"state": one, "actions": one}}, "one action dimension")
    with pytest.raises(ValueError, match=r"actions are \(dx, dy\); the normalisation statistics' actions have 1"):
        evaluate(lively_tiny, Tokenizer.default(), normalizer, scenes=1)


def test_evaluate_runs_a_model_with_fewer_camera_slots_than_three():
    """The reach task's scenes have one camera, but the evaluation named three, and a model with
    two slots (a LeRobot policy of two cameras) ended in a traceback: max_cameras 3 exceeds..."""
    import dataclasses

    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model
    from oxygen_ros.core.tokenizer import Tokenizer
    from oxygen_ros.tools.eval import evaluate

    two = build_model(dataclasses.replace(TINY, max_cameras=2), seed=0)
    report = evaluate(two, Tokenizer.default(), None, scenes=1, max_steps=1, questions=False)
    assert report["scenes"] == 1, report


def test_training_and_evaluation_numbers_are_checked_up_front(capsys, tmp_path):
    """Values that used to end in a traceback after the start (lr nan, seeds out of range) or be
    dropped silently (a negative loss weight turned the loss off while the card printed it)."""
    from oxygen_ros.tools import eval as eval_tool, train

    out = ["--out", str(tmp_path / "model")]
    _refused(train.parse_args, out + ["--lr", "nan"], capsys, "--lr")
    _refused(train.parse_args, out + ["--seed", "1000000"], capsys, "--seed", "held out")
    _refused(train.parse_args, out + ["--seed", "-1"], capsys, "--seed")
    _refused(train.parse_args, out + ["--patch-shape-weight", "-5"], capsys, "--patch-shape-weight")
    _refused(eval_tool.parse_args, ["--seed", "-1"], capsys, "--seed")
    _refused(eval_tool.parse_args, ["--steps-per-frame", "0"], capsys, "--steps-per-frame")


def test_help_shows_each_default_as_it_is_typed(capsys):
    """bench, calibrate and prefill-bench end an option's help with its default: as a comma list (not
    a Python list), once (not "(default cpu) (default: cpu)"), and not at all where there is none."""
    from oxygen_ros.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: baseline,parallel,shared_kv,oxygen)" in text and "(default: 30)" in text
    assert "cpu or cuda[:N] (default: cpu) --dtype" in text
    assert "(default: None)" not in text and "['" not in text and "(default: False)" not in text


def test_an_empty_model_path_is_refused_not_taken_for_the_default(capsys):
    """``--model-path "$CKPT"`` with CKPT unset ran the embedded default model."""
    from oxygen_ros.tools import bench, common

    for option in ("--model-path", "--tokenizer-path", "--norm-stats"):
        with pytest.raises(SystemExit, match=f"{option} is empty"):
            common.load_model(bench.parse_args([option, ""]))


@pytest.mark.parametrize("tool", ["agent", "ask", "bench", "calibrate", "eval", "prefill_bench", "record", "soak",
                                  "train"])
def test_help_is_plain_text_and_names_the_defaults_of_the_long_runs(tool, capsys):
    """--help printed the docstrings' reST markup (````oxygen-record````:), and oxygen-train's did
    not say that its default --steps trains for 42 minutes."""
    import importlib

    module = importlib.import_module(f"oxygen_ros.tools.{tool}")
    with pytest.raises(SystemExit) as done:
        module.parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: oxygen-") and "``" not in text, text[:500]
    if tool == "train":
        assert "default 10500" in " ".join(text.split()), text


def test_eval_train_and_prefill_bench_help_name_every_default(capsys):
    """A walkthrough: eval's --seed, --concurrency (8), --execute (5), --max-steps (50), train's --preset,
    --workers, --log-every and prefill-bench's --seed had no help or no default shown."""
    from oxygen_ros.tools import eval as eval_tool
    from oxygen_ros.tools import prefill_bench, train

    def help_of(module) -> str:
        with pytest.raises(SystemExit):
            module.parse_args(["--help"])
        return " ".join(capsys.readouterr().out.split())

    text = help_of(eval_tool)
    for option, default in (("--seed SEED", "0"), ("--concurrency CONCURRENCY", "8"), ("--execute EXECUTE", "5"),
                            ("--max-steps MAX_STEPS", "50")):
        shown = text.split(option + " ", 1)[1].split(" --", 1)[0]
        assert shown.endswith(f"(default: {default})") and len(shown) > 20, (option, shown)
    text = help_of(train)
    assert "--preset {pi05,tiny} the model's shapes: tiny (the default;" in text, text
    assert "in this process) (default: 1)" in text and "one JSON line each (default: 100)" in text, text
    assert "--seed SEED seed of the random images and prompt tokens (default: 0)" in help_of(prefill_bench)


def test_prefill_bench_refuses_a_negative_seed_as_eval_does(capsys):
    from oxygen_ros.tools import prefill_bench

    _refused(prefill_bench.parse_args, ["--seed", "-1"], capsys, "--seed")


FULL = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device every write to fails)")


def _lost_nothing(capsys, tool: str, holds: str) -> None:
    """The failed write said why, naming the tool and the path, and the text went to stdout."""
    printed = capsys.readouterr()
    assert f"{tool}: could not write /dev/full: No space left on device; what it would hold follows on stdout" \
        in printed.err, printed.err
    assert holds in printed.out and "Traceback" not in printed.err, printed.out[-500:]


@FULL
def test_calibrate_s_file_that_cannot_be_written_goes_to_stdout(capsys, monkeypatch):
    """A walkthrough: an output found unwritable only at the end ended in a traceback, the run's
    figures lost."""
    from oxygen_ros.tools import calibrate

    monkeypatch.setattr(calibrate, "_measure", lambda args, measure: {  # no timing: figures given
        "prefill_ms": 1.0, "denoise_step_ms": 0.1, "decode_step_ms": {1: 0.5, 2: 0.5}})
    assert calibrate.main(["--preset", "tiny", "--target-hz", "5", "--max-decode", "4", "--cameras", "1",
                           "--out", "/dev/full"]) == 1
    _lost_nothing(capsys, "oxygen-calibrate", "steps_per_frame: 4")


@FULL
def test_eval_s_figures_that_cannot_be_written_go_to_stdout(capsys):
    from oxygen_ros.tools import eval as eval_tool

    assert eval_tool.main(["--scenes", "1", "--no-questions", "--json", "/dev/full"]) == 1
    _lost_nothing(capsys, "oxygen-eval", '"description_exact":')


@FULL
def test_prefill_bench_s_results_that_cannot_be_written_go_to_stdout(capsys):
    from oxygen_ros.tools import prefill_bench

    assert prefill_bench.main(["--preset", "tiny", "--present", "1", "--prompt-tokens", "4", "--repeats", "1",
                               "--attention", "eager", "--json", "/dev/full"]) == 1
    _lost_nothing(capsys, "oxygen-prefill-bench", '"logits_rel_diff":')
