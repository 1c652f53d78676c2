"""oxygen-bench says when a run measured an overloaded server, or a batch still filling.

From a walkthrough: ``--max-decode 30 --steps-per-frame 1`` put oxygen at 3.13x baseline while
its JSON showed 19 requests finished against 60 (a request decodes for 29 frames, 16 slots,
one arrival a frame: the queue grew all run long), and nothing said so.
"""

import json

from oxygen_ros.core.benchmark import upper_bound
from oxygen_ros.tools import bench
from oxygen_ros.tools.bench_load import expected_decoding_share, frames_per_request
from oxygen_ros.tools.bench_table import bound_line


def test_a_saturated_run_is_said_in_the_table_and_marked_in_the_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "baseline,oxygen", "--compile", "off", "--max-decode", "8",
                       "--steps-per-frame", "1,4", "--frames", "8", "--warmup", "2", "--max-active", "3",
                       "--json", str(out)]) == 0
    runs = {(r["setting"], r["k"]): r for r in json.loads(out.read_text())["runs"]}
    over = runs[("oxygen", 1)]  # 7 frames a request, one a frame: 7 slots busy against 3
    assert over["saturated"] and over["slots_needed"] == 7 and over["requests_arrived"] == 8
    assert over["queued_at_end"] > over["queued_at_start"] and over["requests_rejected"] == 0
    assert over["warmup_short"]
    fine = runs[("oxygen", 4)]  # 2 frames a request: 2 slots
    assert not fine["saturated"] and fine["slots_needed"] == 2 and not fine["warmup_short"]
    assert not runs[("baseline", 1)]["saturated"] and runs[("baseline", 1)]["slots_needed"] is None
    table = capsys.readouterr().out
    oxygen_rows = [line for line in table.splitlines() if line.startswith("oxygen")]
    assert oxygen_rows[0].endswith("saturated") and not oxygen_rows[1].endswith("saturated")
    printed = " ".join(table.split())
    assert "warning: oxygen N=8 k=1 S=10 is saturated: 1 request(s) a frame, each decoding for 7 frame(s)" in printed
    assert "--max-active 3; the queue went from" in printed and "Helps: --max-active 7 or more" in printed
    assert "warning: oxygen N=8 k=1 S=10: --warmup 2 is shorter than the 7 frames" in printed
    assert "Helps: --warmup 7 or more" in printed
    assert "oxygen N=8 k=4" not in printed  # neither warning for the run that keeps up


def test_a_request_holds_a_slot_for_its_tokens_after_the_first_over_k():
    assert frames_per_request("oxygen", 30, 1) == 29  # the prefill chooses the first token
    assert frames_per_request("oxygen", 30, 5) == 6
    assert frames_per_request("shared_kv", 30, 1) == 1  # decoded whole in the frame it starts
    run = {"arrivals": "uniform:0", "N": 30, "k": 5}
    assert expected_decoding_share(run) == 0.0
    assert expected_decoding_share(dict(run, arrivals="uniform:0.25", N=10)) == 0.5  # 2 frames a request
    assert expected_decoding_share(dict(run, arrivals="uniform:1")) == 1.0


def test_the_upper_bound_of_frames_without_requests_has_no_decode_steps(tmp_path, capsys):
    """``--arrivals uniform:0`` put the bound's k decode steps in every frame: ideal 0.71 (< 1)."""
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--settings", "baseline,oxygen", "--compile", "off", "--max-decode", "4",
                       "--steps-per-frame", "2", "--frames", "3", "--warmup", "1", "--arrivals", "uniform:0",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    bound, pieces = result["upper_bound"]["S=10,N=4,k=2"], result["components"]
    assert bound["decoding_share"] == 0.0
    assert bound["frame_latency_ms"] == pieces["prefill_ms"] + 10 * pieces["denoise_step_ms"]
    assert "decoding in 0% of the frames" in capsys.readouterr().out
    full = upper_bound({"prefill_ms": 1.0, "denoise_step_ms": 0.5, "decode_step_ms": {1: 2.0}}, S=2, k=3, H=10)
    assert full["frame_latency_ms"] == 1.0 + 2 * 0.5 + 3 * 2.0  # every frame decodes: k steps


def test_the_upper_bound_line_says_it_is_a_frame_of_one_observation_beside_several_agents():
    ub = {"frame_latency_ms": 10.0, "action_frequency_hz": 1000.0, "language_throughput_tps": 100.0}
    assert "a frame of 1 observation" in bound_line("S=10,N=4,k=2", ub, several_agents=True)
    assert "observation" not in bound_line("S=10,N=4,k=2", ub, several_agents=False)
