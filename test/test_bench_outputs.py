"""What oxygen-bench leaves behind and how it refuses options, as a walkthrough found them:
a Ctrl-C kept nothing, a failing write ended in a traceback, the JSON could not reproduce the
table, and a few options were refused late, with a traceback or without saying the range."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from oxygen_ros.core import benchmark
from oxygen_ros.tools import bench
from oxygen_ros.tools.bench_output import model_fields
from oxygen_ros.tools.bench_table import compile_note

SMALL = ["--preset", "tiny", "--compile", "off", "--max-decode", "4", "--steps-per-frame", "2", "--warmup", "1"]


def test_a_ctrl_c_during_the_runs_keeps_the_frames_measured(tmp_path, capsys, monkeypatch):
    """The runs take turns frame by frame: a Ctrl-C printed 'interrupted' and kept nothing. What was
    measured is kept, and the exit status says the sweep was cut short (130; it was 0, as for a
    whole sweep)."""
    frame = benchmark.Run.frame

    def interrupted_at_the_fifth(run):
        if run.spec.setting == "oxygen" and run.f == 5:
            raise KeyboardInterrupt
        frame(run)

    monkeypatch.setattr(benchmark.Run, "frame", interrupted_at_the_fifth)
    out = tmp_path / "int.json"
    assert bench.main([*SMALL, "--settings", "baseline,oxygen", "--frames", "20", "--json", str(out)]) == 130
    result = json.loads(out.read_text())
    assert result["interrupted"] is True
    assert [(r["setting"], r["frames"], r["frames_measured"]) for r in result["runs"]] == [
        ("baseline", 20, 5), ("oxygen", 20, 4)]  # frames 1-5 and 1-4 after the warm-up frame
    printed = capsys.readouterr()
    assert "oxygen-bench: interrupted: the table and --json hold the 4-5 of 20 frames measured so far" in printed.err
    assert printed.out.startswith("setting") and "speedup" in printed.out


def test_a_json_that_cannot_be_written_goes_to_stdout_and_a_failing_figure_keeps_the_json(tmp_path, capsys):
    if Path("/dev/full").exists():
        assert bench.main([*SMALL, "--settings", "oxygen", "--frames", "2", "--json", "/dev/full"]) == 1
        printed = capsys.readouterr()
        assert "oxygen-bench: could not write /dev/full: No space left on device" in printed.err
        assert '"runs": [' in printed.out
    figures = tmp_path / "figs"
    (figures / "frequency_vs_throughput.png").mkdir(parents=True)  # a folder where the figure goes
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--settings", "baseline,oxygen", "--frames", "2", "--json", str(out),
                       "--plot", str(figures)]) == 1
    err = capsys.readouterr().err
    assert f"oxygen-bench: could not write the figures into {figures}: Is a directory" in err
    assert f"the JSON is in {out}" in err and "Traceback" not in err
    assert len(json.loads(out.read_text())["runs"]) == 2


def test_each_run_in_the_json_holds_what_its_table_row_shows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--settings", "baseline,oxygen", "--frames", "3", "--seed", "3", "--cameras", "2",
                       "--prompt-tokens", "20", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("baseline", "oxygen"))]
    for run, row in zip(result["runs"], rows):
        assert row[-2:] == [f"{run['speedup']:.2f}", f"{run['ideal']:.2f}"]
        assert row[-4:-2] == [str(run["queued_at_end"]), str(run["requests_rejected"])]
        assert (run["seed"], run["cameras"], run["prompt_tokens"], run["max_active"]) == (3, 2, 20, 16)
        assert (run["preset"], run["config"]) == ("tiny", "tiny") and run["model"].startswith("preset tiny")
    assert result["model"]["preset"] == "tiny"


def test_trained_weights_are_not_called_a_preset():
    """Every run said "preset": "tiny" for the trained default model (whose sizes are tiny's)."""
    trained = SimpleNamespace(source="/x/default_model", layout="native", config=SimpleNamespace(name="tiny"))
    assert model_fields(trained) == {"model": "/x/default_model", "preset": None, "config": "tiny"}


def test_packages_loaded_from_the_cache_are_said_so():
    run = {"setting": "oxygen", "compile_s": 0.01, "recompiles": 0, "packages": 12}
    assert "its 12 packages loaded from the cache in 0.0 s" in compile_note(dict(run, packages_built=0))
    assert "its 12 packages compiled in 0.0 s" in compile_note(dict(run, packages_built=12))
    assert "3 of its 12 packages compiled, the others loaded from the cache" in compile_note(dict(run, packages_built=3))


@pytest.mark.parametrize("argv, says", [
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (["--settings", "oxygen,oxygen"], "argument --settings: oxygen given twice in 'oxygen,oxygen'"),
    (["--max-decode", "10,10"], "argument --max-decode: 10 given twice"),
    (["--compile", "on,off,on"], "argument --compile: on given twice in 'on,off,on'"),
    (["--settings", ""], "argument --settings: no setting given (the value is empty); choose from baseline"),
])
def test_bench_refuses_at_once_with_argparse(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "oxygen-bench: error: " + says in err


def test_a_prompt_too_short_for_the_template_is_refused_with_the_range():
    with pytest.raises(SystemExit, match=r"--prompt-tokens 10: the prompt's template and state alone take up to 1\d "
                                         r"tokens in these scenes: give 1\d to 32"):
        bench.main(["--preset", "tiny", "--prompt-tokens", "10"])


def test_the_help_says_every_options_default_and_choices(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--compile {on,off,auto}[,...]" in text and "COMPILE" not in text
    assert "the arrivals (poisson, random-length) and the action noise (default: 0)" in text
    assert "precision of the model's weights and activations" in text
    assert "calibrate's default is the model's every camera slot" in text  # (oxygen-calibrate, wrapped)


def test_the_figures_ring_the_points_of_saturated_runs(tmp_path, monkeypatch):
    """A saturated run (its queue grew: part of its language work was never done) was drawn as
    any other point, so the README's speedup_vs_k figure showed k=1 speedups of 2.4 and 3.1 as
    results. Each figure now rings such points, with a legend that says why; a sweep without one
    has no ring and no such legend."""
    from oxygen_ros.tools import plots

    def run(setting, n, k, hz, saturated=False):
        return {"setting": setting, "N": n, "k": k, "S": 10, "action_frequency_hz": hz,
                "language_throughput_tps": 10.0 * n, "saturated": saturated}

    def legends(runs):
        figures = []
        monkeypatch.setattr(plots.plt, "close", figures.append)
        paths = plots.write_plots({"runs": runs}, tmp_path)
        assert all(p.is_file() for p in paths) and len(figures) == 3
        return [[t.get_text() for t in f.axes[0].get_legend().get_texts()] for f in figures]

    runs = [run("baseline", 10, 1, 100.0), run("oxygen", 10, 1, 300.0, saturated=True),
            run("baseline", 20, 1, 90.0), run("oxygen", 20, 1, 200.0)]
    for names in legends(runs):
        assert names[-1] == plots.SATURATED, names
    for names in legends([dict(r, saturated=False) for r in runs]):
        assert plots.SATURATED not in names, names
