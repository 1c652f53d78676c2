"""oxygen-bench and oxygen-calibrate as a user runs them (tiny preset, few frames)."""

import json

import pytest
import torch
import yaml

from oxygen_ros.tools import bench, bench_table, calibrate

FIELDS = ("setting", "preset", "S", "N", "k", "H", "arrivals", "frame_latency_ms", "frame_latency_p99_ms",
          "action_frequency_hz", "language_throughput_tps", "avg_batch_size", "avg_request_latency_ms",
          "kv_bytes_reserved", "kv_copy_bytes_per_frame")


def test_bench_writes_json_and_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--settings", "baseline,oxygen", "--max-decode", "6,8",
                     "--steps-per-frame", "2", "--frames", "6", "--warmup", "2", "--arrivals", "poisson:1",
                     "--json", str(out), "--plot", str(tmp_path / "figs")])
    assert rc == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 4
    for run in result["runs"]:
        assert all(f in run for f in FIELDS)
        assert run["action_frequency_hz"] > 0 and run["frame_latency_ms"]["mean"] > 0
    oxygen = [r for r in result["runs"] if r["setting"] == "oxygen"]
    assert all(r["avg_batch_size"] >= 1 for r in oxygen)
    assert set(result["upper_bound"]) == {"S=10,N=6,k=2", "S=10,N=8,k=2"}
    # the pieces behind the bound were timed once after every round of the runs' 8 frames
    assert result["components"]["samples"] == 8
    for name in ("frequency_vs_throughput.png", "speedup_vs_N.png", "speedup_vs_k.png"):
        assert (tmp_path / "figs" / name).read_bytes()[:4] == b"\x89PNG"
    table = capsys.readouterr().out
    assert "oxygen" in table and "upper bound" in table
    legend = " ".join(table.split("columns:", 1)[1].split())  # every column said, units with it
    for column in ("comp compiled", "N tokens per request at most", "T frame time in ms", "T/obs", "x1", "f action frequency H/T (Hz)", "f/robot",
                   "tau tokens the measured frames produced over their time (tokens/s: B*k/T plus each new "
                   "request's first token", "B mean decode batch", "copy B/fr K/V bytes",
                   "queue requests waiting for a decode slot", "rej requests rejected", "speedup", "ideal"):
        assert column in legend, column


def test_bench_notes_requests_that_end_well_before_n(tmp_path, capsys):
    """The embedded default model ends its answers at its end-of-sequence token after a few
    tokens: the table says so under the runs, with N and the tokens decoded, since N, B and
    'ideal' then mean less than they say; the same run on random weights decodes N each."""
    out = tmp_path / "bench.json"
    assert bench.main(["--settings", "oxygen", "--max-decode", "20", "--steps-per-frame", "2", "--frames", "8",
                       "--warmup", "2", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["tokens_per_request"] < 0.8 * 20
    note = " ".join(capsys.readouterr().out.split("note:", 1)[1].split())
    assert note.startswith(f"requests ended at the model's end-of-sequence token after {run['tokens_per_request']:.1f} "
                           "tokens at N=20 on average") and "--preset tiny" in note
    assert run["eos_share"] > 0.5
    assert bench_table.early_end_note([dict(run, tokens_per_request=19.0)]) == ""
    # requests of their own lengths (random-length arrivals) end short of N, not at the model's EOS
    assert bench_table.early_end_note([dict(run, eos_share=0.1)]) == ""


def test_upper_bound_decodes_as_the_engine_calls_the_decode():
    """Eager, k decode steps are k one-step calls; compiled, one k-step call, whose fixed cost is
    paid once: on the line through the one-step call and the K-step call that were measured."""
    from oxygen_ros.core.benchmark import decode_call_ms, upper_bound

    eager = {"prefill_ms": 2.0, "denoise_step_ms": 0.5, "decode_step_ms": {1: 0.3}, "decode_round_step_ms": {},
             "decode_round_steps": 0}
    compiled = dict(eager, decode_round_step_ms={1: 0.14}, decode_round_steps=5)  # a 5-step call: 0.7 ms
    assert decode_call_ms(eager, 5) == pytest.approx(1.5)
    assert decode_call_ms(compiled, 5) == pytest.approx(0.7)
    assert decode_call_ms(compiled, 3) == pytest.approx(0.3 + 2 * 0.1)
    assert decode_call_ms(compiled, 1) == pytest.approx(0.3)
    assert upper_bound(compiled, S=10, k=5, H=10)["frame_latency_ms"] == pytest.approx(2.0 + 5.0 + 0.7)
    assert upper_bound(eager, S=10, k=5, H=10)["frame_latency_ms"] == pytest.approx(2.0 + 5.0 + 1.5)


def test_bench_refuses_bad_options(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--settings", "fastest"])
    assert "unknown setting(s) fastest; choose from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--arrivals", "burst:2"])
    assert "bad arrivals spec" in capsys.readouterr().err
    for spec, says in (("uniform:nan", "finite number"), ("poisson:inf", "finite number"),
                       ("random-length:20-30", "more than N = 10")):  # before any model is built
        with pytest.raises(SystemExit):
            bench.main(["--max-decode", "10,40", "--arrivals", spec])
        assert says in capsys.readouterr().err, spec


def test_calibrate_writes_a_parameters_file(tmp_path):
    out = tmp_path / "calibrated.yaml"
    assert calibrate.main(["--preset", "tiny", "--target-hz", "50", "--max-decode", "12", "--repeats", "3",
                           "--out", str(out)]) == 0
    params = yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]
    assert params["setting"] == "oxygen" and 0 <= params["steps_per_frame"] <= 12 and params["max_decode"] == 12
    assert params["denoise_steps"] == 0  # none given: the node uses the checkpoint's
    assert params["compile"] == "auto"  # the node runs the way k was measured
    assert "S=10," in out.read_text()  # the tiny preset's own
    # a preset is not what the node runs: the file says so and puts none of its sizes on that model
    assert calibrate.main(["--preset", "tiny", "--size", "max_token_len=48", "--target-hz", "50", "--max-decode", "12",
                           "--repeats", "3", "--out", str(out)]) == 0
    assert "which the inference node does not run" in out.read_text()
    assert "model_sizes" not in yaml.safe_load(out.read_text())["oxygen_inference"]["ros__parameters"]


def test_choose_k_takes_the_largest_budget_within_the_deadline():
    comp = {"prefill_ms": 2.0, "denoise_step_ms": 1.0, "decode_step_ms": {1: 1.0, 2: 1.0, 4: 1.5, 8: 2.0}}
    # deadline 10 / 500 Hz = 20 ms * 1.0: 2 + 10 + k * step <= 20
    k, table = calibrate.choose_k(comp, n=30, s=10, horizon=10, target_hz=500, margin=1.0, arrivals=1)
    assert k == max(row["k"] for row in table if row["ok"])
    assert table[k - 1]["frame_ms"] <= 20 and (k == 30 or table[k]["frame_ms"] > 20)
    k0, _ = calibrate.choose_k(comp, n=30, s=10, horizon=10, target_hz=5000, margin=1.0, arrivals=1)
    assert k0 == 0


def test_choose_k_keeps_the_margin_of_the_deadline_free():
    comp = {"prefill_ms": 2.0, "denoise_step_ms": 1.0, "decode_step_ms": {1: 1.0, 64: 1.0}}
    # deadline 10 / 500 Hz = 20 ms; at margin 0.8 a frame may take 16 ms: 2 + 10 + k * 1 <= 16
    k, table = calibrate.choose_k(comp, n=30, s=10, horizon=10, target_hz=500, margin=0.8, arrivals=1)
    assert k == 4
    assert [row["ok"] for row in table[:6]] == [True] * 4 + [False] * 2
    assert calibrate.choose_k(comp, n=30, s=10, horizon=10, target_hz=500, margin=1.0, arrivals=1)[0] == 8


def test_choose_k_costs_an_unmeasured_batch_at_the_next_larger_measured_one():
    # N=4 and one arrival a frame: batches 4, 3, 2, 2 for k = 1..4, none measured; between
    # the measured 1 and 8 each decode step is costed at 8's 3 ms (never at 1's 1 ms: too optimistic)
    comp = {"prefill_ms": 2.0, "denoise_step_ms": 1.0, "decode_step_ms": {1: 1.0, 8: 3.0}}
    k, table = calibrate.choose_k(comp, n=4, s=10, horizon=10, target_hz=500, margin=1.0, arrivals=1)
    assert [(row["k"], row["batch"], row["frame_ms"]) for row in table] == [
        (1, 4, 15.0), (2, 3, 18.0), (3, 2, 21.0), (4, 2, 24.0)]
    assert k == 2


def test_bench_matches_another_systems_horizon_and_prompt_length(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "oxygen", "--compile", "off", "--action-horizon", "4",
                       "--prompt-tokens", "20", "--max-decode", "4", "--steps-per-frame", "2", "--frames", "3",
                       "--warmup", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    run = result["runs"][0]
    assert run["H"] == 4 and run["compile"] == "off" and not run["compiled"] and run["recompiles"] == 0
    assert result["components_compile_s"] is None  # no compiled pieces timed


def test_a_compiled_bench_says_how_long_its_pieces_own_packages_took(tmp_path, monkeypatch, capsys):
    """The compiled pieces are timed on packages of their own shapes, built beside the runs' on a
    cold start: their seconds are in the JSON and printed, not hidden outside every figure. (The
    bucketed pieces run eager here: the bookkeeping without the compile time.)"""
    import functools

    from oxygen_ros.core import model_runner, piece_timing
    from oxygen_ros.core.model.compiled import CompiledVLA

    for module in (model_runner, piece_timing):
        monkeypatch.setattr(module, "CompiledVLA", functools.partial(CompiledVLA, compile=False))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # the bench sets it for the process
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "oxygen", "--compile", "on", "--max-decode", "4",
                       "--steps-per-frame", "2", "--frames", "3", "--warmup", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["runs"][0]["compiled"] and result["components_compiled"] is not None
    assert result["components_compile_s"] > 0
    assert f"(the compiled pieces' own packages: loaded or built in {result['components_compile_s']:.1f} s)" in \
        capsys.readouterr().out


def test_prompt_tokens_pads_or_cuts_the_instruction_to_exactly_that_many_tokens():
    from oxygen_ros.core.benchmark import synthetic_observations, with_prompt_tokens
    from oxygen_ros.core.tokenizer import Tokenizer, prompt_ids

    tok = Tokenizer.default()
    obs = synthetic_observations(3, 32)
    for n in (18, 24, 32):  # shorter and longer than the scenes say it (the state alone takes 16)
        for o in obs:
            assert len(prompt_ids(tok, with_prompt_tokens(o, tok, n).instruction, o.state)) == n
    with pytest.raises(ValueError, match="the prompt's template and state alone take"):
        with_prompt_tokens(obs[0], tok, 1)


def test_bench_refuses_bad_compile_and_prompt_options(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--compile", "fast"])
    assert "expected a comma list of auto, on, off, got 'fast'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--prompt-tokens 999 exceeds the model's max_token_len 32"):
        bench.main(["--preset", "tiny", "--prompt-tokens", "999"])
    with pytest.raises(SystemExit, match="--device must be cpu, cuda or cuda:N, got 'gpu'"):
        bench.main(["--device", "gpu"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match=r"--device cuda: this torch \(.*\) sees no CUDA device"):
            bench.main(["--device", "cuda"])


def test_bench_sweeps_agents_and_compares_each_frame_with_the_single_robot_one(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "baseline,oxygen", "--compile", "off", "--agents", "1,2,4",
                       "--max-decode", "4", "--steps-per-frame", "2", "--frames", "3", "--warmup", "1",
                       "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["setting"], r["agents"]) for r in runs] == [(s, a) for s in ("baseline", "oxygen") for a in (1, 2, 4)]
    for r in runs:
        assert all(f in r for f in FIELDS)
        median = r["frame_latency_ms"]["median"]
        assert r["observations_per_frame"] == r["agents"]
        assert r["per_observation_ms"] == pytest.approx(median / r["agents"])
        assert r["action_frequency_hz"] == pytest.approx(r["agents"] * r["action_frequency_per_robot_hz"])
        assert r["action_frequency_per_robot_hz"] == pytest.approx(r["H"] / (r["frame_latency_ms"]["mean"] / 1e3))
        single = next(o for o in runs if o["setting"] == r["setting"] and o["agents"] == 1)
        assert r["frame_ratio_vs_1_agent"] == pytest.approx(median / single["frame_latency_ms"]["median"])
    header, _, *rows = capsys.readouterr().out.splitlines()
    assert all(column in header.split() for column in ("obs", "T/obs", "x1", "f/robot"))
    assert [row.split()[5] for row in rows[:6]] == ["1", "2", "4"] * 2
    assert all(row.split()[10] == "1.00" for row in rows[:6:3])  # the 1-agent frame against itself


def test_bench_with_agents_but_no_single_robot_run_has_no_ratio(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "oxygen", "--compile", "off", "--agents", "2",
                       "--max-decode", "4", "--steps-per-frame", "2", "--frames", "2", "--warmup", "0",
                       "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["agents"] == 2 and run["observations_per_frame"] == 2 and run["frame_ratio_vs_1_agent"] is None
    assert capsys.readouterr().out.splitlines()[2].split()[10] == "-"
    with pytest.raises(SystemExit):
        bench.main(["--agents", "1,0"])
    assert "expected positive integers, got '1,0'" in capsys.readouterr().err


def test_interleaved_runs_compute_what_each_run_alone_does():
    from oxygen_ros.core.benchmark import RunSpec, run_interleaved, run_setting, synthetic_observations
    from oxygen_ros.core.model.vla import build_model
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.tokenizer import Tokenizer

    model, tok = build_model(TINY), Tokenizer.default()
    obs = synthetic_observations(8, TINY.vision.image_size)
    specs = [RunSpec("oxygen", 4, 2, 10, frames=4, warmup=1, arrivals="poisson:1", agents=a) for a in (1, 3)]
    rounds = []  # after each round: its index, and the frames each run has done
    together = run_interleaved(model, tok, specs, obs,
                               after_round=lambda runs, f: rounds.append((f, [r.f for r in runs])))
    assert rounds == [(f, [f + 1, f + 1]) for f in range(5)]  # a frame of each run, then the hook
    alone = [run_setting(model, tok, spec, obs) for spec in specs]
    untimed = ("agents", "observations_per_frame", "avg_batch_size", "requests_finished", "kv_copy_bytes_per_frame")
    assert [{f: r[f] for f in untimed} for r in together] == [{f: r[f] for f in untimed} for r in alone]
    assert [r["observations_per_frame"] for r in together] == [1, 3]
    assert all(r["requests_finished"] > 0 and r["avg_request_latency_ms"] > 0 for r in together)


def test_the_mean_batch_counts_the_frames_that_decode_nothing():
    """B of tau = B*k/T is the batch per frame: a request every 4th frame that lives 2 frames
    keeps the pool idle half the time, and B shows it (every decode step has batch 1)."""
    from oxygen_ros.core.benchmark import RunSpec, run_setting, synthetic_observations
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model
    from oxygen_ros.core.tokenizer import Tokenizer

    model, tok = build_model(TINY), Tokenizer.default()
    spec = RunSpec("oxygen", 4, 2, 2, frames=24, warmup=0, arrivals="uniform:0.25")
    run = run_setting(model, tok, spec, synthetic_observations(4, TINY.vision.image_size))
    assert 0.0 < run["avg_batch_size"] <= 0.5 + 1e-9, run["avg_batch_size"]


def test_matmul_reference_counts_every_product_of_a_piece():
    """The products recorded are the ones made (linear layers under inference mode, batched
    products), with their FLOPs; timed as plain products they take some time."""
    from oxygen_ros.core.matmul_reference import ProductTimer, flops, record_matmuls

    lin = torch.nn.Linear(4, 5)
    x, a, b = torch.randn(2, 3, 4), torch.randn(6, 3, 7), torch.randn(6, 7, 2)
    products = record_matmuls(lambda: (lin(x), lin(x[0]), torch.bmm(a, b), torch.matmul(a[0], b[0])))
    assert products == {("mm", 1, 6, 4, 5, torch.float32): 1, ("mm", 1, 3, 4, 5, torch.float32): 1,
                        ("bmm", 6, 3, 7, 2, torch.float32): 1, ("mm", 1, 3, 7, 2, torch.float32): 1}
    assert flops(products) == 2 * (6 * 4 * 5 + 3 * 4 * 5 + 6 * 3 * 7 * 2 + 3 * 7 * 2)
    ms = ProductTimer(products).sample()
    assert ms["linear"] > 0 and ms["attention"] == 0


def test_matmul_reference_counts_the_two_products_inside_a_fused_attention_call():
    """A fused attention kernel makes two products per head: the scores (q @ k.T) and the
    values (probabilities @ v); the reference counts both, apart from the linear layers'."""
    from oxygen_ros.core.matmul_reference import ProductTimer, flops, record_matmuls

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    products = record_matmuls(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert products == {("attention", 6, 5, 8, 7, torch.float32): 1, ("attention", 6, 5, 7, 4, torch.float32): 1}
    assert flops(products) == 2 * 6 * (5 * 8 * 7 + 5 * 7 * 4)
    ms = ProductTimer(products).sample()
    assert ms["attention"] > 0 and ms["linear"] == 0


def test_matmul_reference_takes_the_faster_layout_of_each_product(monkeypatch):
    """Each shape is timed with its second operand as [K, N] and as a transposed [N, K] (a
    linear layer's weight); the faster one, times how often the piece makes it, counts."""
    from oxygen_ros.core import matmul_reference

    seen, sampled = [], []

    def fake_median_ms(call, repeats, warmup, device):
        out = call()
        seen.append(out.shape)
        return 3.0 if len(seen) % 2 else 2.0  # the transposed layout, timed second, is faster

    def fake_elapsed_s(call, device):
        sampled.append(call)
        return 0.002

    monkeypatch.setattr(matmul_reference, "median_ms", fake_median_ms)
    monkeypatch.setattr(matmul_reference, "elapsed_s", fake_elapsed_s)
    products = {("mm", 1, 6, 4, 5, torch.float32): 3, ("bmm", 2, 3, 7, 4, torch.float32): 1}
    timer = matmul_reference.ProductTimer(products)
    assert seen == [(6, 5), (6, 5), (2, 3, 4), (2, 3, 4)]
    assert timer.layouts == ["[N, K]", "[N, K]"]
    assert timer.sample() == {"linear": 3 * 2.0 + 1 * 2.0, "attention": 0.0}  # each shape's time, as often as made
    assert sampled == [c for _, _, c in timer.calls]  # one call of each shape, in the faster layout
    assert timer.sample()["linear"] == 8.0  # and again in the next sample


def test_bench_pieces_only_times_the_pieces_against_their_matrix_products(tmp_path, capsys):
    out = tmp_path / "pieces.json"
    assert bench.main(["--preset", "tiny", "--pieces-only", "--compile", "off", "--repeats", "2", "--cameras", "2",
                       "--max-decode", "4", "--json", str(out)]) == 0  # N under the default k=5 was refused
    result = json.loads(out.read_text())
    eager = result["pieces"]["eager"]
    assert set(eager["decode_step_ms"]) == {"1", "8"} and eager["cameras"] == 2 and not eager["compiled"]
    assert eager["prefill_ms"] > 0 and eager["denoise_step_ms"] > 0
    ref = result["prefill_matmuls"]
    assert ref["gflop"] > ref["attention_gflop"] > 0 and ref["ms"] > ref["linear_ms"] > 0 and ref["attention_ms"] > 0
    assert 0 < eager["prefill_vs_linear_matmuls"] < eager["prefill_vs_matmuls"]
    assert "runs" not in result  # no frames were run
    printed = capsys.readouterr().out
    assert "decode step, batch 8" in printed and "of the plain products'" in printed
    assert "of the linear layers' alone" in printed


def test_bench_pieces_only_keeps_the_eager_figures_when_the_compiled_library_cannot_load(tmp_path, capsys,
                                                                                       monkeypatch):
    """Where a compiled library would crash the process (``load_probe.py``; here the CPU's are
    probed and the child is killed), the eager figures still come out and the compiled mode
    says why it did not run."""
    from oxygen_ros.core.model import load_probe

    monkeypatch.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(load_probe, "PROBED_DEVICES", ("cpu",))
    monkeypatch.setattr(load_probe, "_verdicts", {})
    monkeypatch.setattr(load_probe, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    out = tmp_path / "pieces.json"
    assert bench.main(["--preset", "tiny", "--pieces-only", "--compile", "off,on", "--repeats", "2",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["pieces"]) == ["eager"] and result["pieces"]["eager"]["prefill_ms"] > 0
    assert "killed a test process (SIGSEGV)" in result["not_run"]["compiled"]
    captured = capsys.readouterr()
    printed = captured.out
    assert "decode step, batch 8" in printed and "compiled: not run: " in printed
    # said before the builds, which print nothing for minutes on an empty cache
    assert f"compiled runs: their packages not in the cache ({tmp_path / 'cache'}) are built first" in captured.err


def test_bench_tick_probe_reports_tick_lateness_beside_frames_with_and_without_the_guard(tmp_path, capsys):
    out = tmp_path / "ticks.json"
    assert bench.main(["--preset", "tiny", "--tick-probe", "0.5", "--compile", "off", "--settings", "oxygen",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["compiled"], r["tick_guard"]) for r in result["rows"]] == [(False, True), (False, False)]
    for r in result["rows"]:
        assert r["frames"] > 0 and r["ticks"] > 50 and 0 <= r["late_p50_ms"] <= r["late_p99_ms"] <= r["late_max_ms"]
    assert result["setting"] == "oxygen" and result["model"]["preset"] == "tiny"
    assert "runs" not in result
    printed = capsys.readouterr().out
    assert "ticks every 2.0 ms beside oxygen frames of 1 observation(s)" in printed and "late p99" in printed


def test_bench_tick_probe_runs_frames_of_several_robots(tmp_path):
    """``--agents N``: the probe's frames serve N observations, as the inference node's do for N robots."""
    out = tmp_path / "ticks.json"
    assert bench.main(["--preset", "tiny", "--tick-probe", "0.3", "--compile", "off", "--settings", "oxygen",
                       "--agents", "3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["agents"], r["observations_per_frame"]) for r in rows] == [(3, 3.0), (3, 3.0)]
    assert all(r["frames"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        bench.parse_args(["--tick-probe", "0"])


def test_components_time_a_step_of_a_frames_decode_call_at_each_batch_size(monkeypatch, lively_tiny, tok):
    """Compiled with ``round_steps`` K, the pieces include the time per step of a decode call of K steps
    at every batch size (the bucketed pieces run eager here: the bookkeeping without the compile time)."""
    import functools

    from oxygen_ros.core import benchmark, piece_timing
    from oxygen_ros.core.model.compiled import CompiledVLA

    monkeypatch.setattr(piece_timing, "CompiledVLA", functools.partial(CompiledVLA, compile=False))
    comp = benchmark.measure_components(lively_tiny, tok, batch_sizes=(1, 2), repeats=2, compile=True,
                                        round_steps=3, warm_all=False)
    assert set(comp["decode_round_step_ms"]) == {1, 2} and all(t > 0 for t in comp["decode_round_step_ms"].values())
    steps = benchmark.measure_components(lively_tiny, tok, batch_sizes=(1,), repeats=2, compile=True, warm_all=False)
    assert steps["decode_round_step_ms"] == {} and set(steps["decode_step_ms"]) == {1}  # K = 1: a step a call
    eager = benchmark.measure_components(lively_tiny, tok, batch_sizes=(1,), repeats=2, round_steps=3)
    assert eager["decode_round_step_ms"] == {}  # eager decodes a step at a time


def _measured_run(model, tok, spec):
    """A benchmark run of ``spec``, frame by frame, with the engine's result of every frame."""
    from oxygen_ros.core.benchmark import Run, synthetic_observations
    from oxygen_ros.core.model.config import TINY

    run = Run(model, tok, spec, synthetic_observations(4, TINY.vision.image_size))
    results, step = [], run.engine.step

    def recorded(*args, **kwargs):
        results.append(step(*args, **kwargs))
        return results[-1]

    run.engine.step = recorded
    while not run.done:
        run.frame()
    return run, results


def test_tau_counts_the_tokens_of_the_measured_frames_not_the_requests_ends(lively_tiny, tok):
    """The language throughput tau counts the tokens streamed in the measured frames: a request
    refused (a full queue) or ended without a token closes with an event of no token, which is
    not a token; nor are the warm-up frames' tokens."""
    from oxygen_ros.core.benchmark import RunSpec

    spec = RunSpec("oxygen", 4, 2, 2, frames=6, warmup=2, arrivals="uniform:3", max_active=1, queue_limit=1)
    run, results = _measured_run(lively_tiny, tok, spec)
    measured = [e for res in results[spec.warmup:] for e in res.tokens]
    ends = [e for e in measured if e.token_id < 0]
    assert ends, "the workload overflows the queue: some requests end without a token"
    assert sum(1 for e in results[0].tokens if e.token_id >= 0) > 0, "the warm-up frames stream tokens too"
    assert run.tokens == len(measured) - len(ends) > 0
    assert run.result()["language_throughput_tps"] == run.tokens / run.own_s


def test_the_p99_frame_latency_is_the_99th_percentile_of_the_measured_frames(lively_tiny, tok):
    """``frame_latency_p99_ms`` (the table's ``T p99``, the JSON's figure) is the 99th percentile of
    the measured frames' times: the slow tail a robot's control loop must absorb, not the 90th."""
    import numpy as np

    from oxygen_ros.core.benchmark import RunSpec

    spec = RunSpec("oxygen", 4, 2, 2, frames=6, warmup=1, arrivals="uniform:0")
    run, results = _measured_run(lively_tiny, tok, spec)
    run.latencies = [float(ms) for ms in range(1, 7)]  # the measured frames' times, as if they took 1..6 ms
    figures = run.result()
    assert figures["frame_latency_p99_ms"] == pytest.approx(np.percentile(np.arange(1.0, 7.0), 99)) \
        == pytest.approx(5.95)
    assert figures["frame_latency_ms"]["p99"] == figures["frame_latency_p99_ms"]
    run.latencies = [res.total_ms for res in results[spec.warmup:]]
    assert run.result()["frame_latency_p99_ms"] == pytest.approx(np.percentile(run.latencies, 99))


def test_the_table_row_shows_the_speedup_over_the_baseline_and_the_ideal_one():
    """A row's ``speedup`` is its action frequency over the baseline's (2.00: twice as many
    actions a second) and ``ideal`` the baseline's mean frame over the upper bound's (what
    free batching would give); one run of several agents has no ideal, a baseline-less none."""
    def run(setting, hz, mean_ms, agents=1):
        return {"setting": setting, "compiled": False, "N": 4, "k": 2, "S": 10, "observations_per_frame": agents,
                "frame_latency_ms": {"mean": mean_ms, "median": mean_ms}, "frame_latency_p99_ms": mean_ms,
                "per_observation_ms": mean_ms, "action_frequency_hz": hz, "action_frequency_per_robot_hz": hz,
                "language_throughput_tps": 10.0, "avg_batch_size": 1.0, "kv_copy_bytes_per_frame": 0.0,
                "agents": agents}

    baseline, oxygen = run("baseline", 100.0, 20.0), run("oxygen", 200.0, 10.0)
    bound = {"frame_latency_ms": 8.0}
    assert bench_table.table_row(oxygen, baseline, bound).split()[-2:] == ["2.00", "2.50"]
    assert bench_table.table_row(baseline, baseline, bound).split()[-2:] == ["1.00", "2.50"]
    assert bench_table.table_row(run("oxygen", 400.0, 10.0, agents=3), baseline, bound).split()[-2:] == ["4.00", "-"]
    assert bench_table.table_row(oxygen, None, bound).split()[-2:] == ["-", "-"]


def test_the_denoise_step_figure_is_the_denoise_call_over_its_steps(monkeypatch, lively_tiny, tok):
    """``denoise_step_ms`` (the upper bound's S x step) is one step's time: the denoise call
    of S steps over S. Every call is timed 6 ms here (a fake timer)."""
    from oxygen_ros.core import benchmark, timing

    monkeypatch.setattr(timing, "elapsed_s", lambda fn, device="cpu": (fn(), 0.006)[1])
    comp = benchmark.measure_components(lively_tiny, tok, batch_sizes=(1, 2), repeats=2, denoise_steps=3)
    assert comp["prefill_ms"] == pytest.approx(6.0) and comp["decode_step_ms"] == pytest.approx({1: 6.0, 2: 6.0})
    assert comp["denoise_step_ms"] == pytest.approx(2.0)
