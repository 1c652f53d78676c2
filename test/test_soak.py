"""`oxygen-soak` as a user runs it, for a few seconds (the long run is done by hand:
``oxygen-soak --duration 600 --json soak.json``).

The installed launcher is used; PYTHONPATH puts this checkout first, so the sources
under test are the ones run even before `make venv` reinstalled them.
"""

import json
import re
import subprocess

from ros_harness import checkout_env, installed_script


def test_soak_smoke(ros_env, tmp_path):
    env = checkout_env()
    out = tmp_path / "soak.json"
    proc = subprocess.run([installed_script("oxygen-soak"), "--duration", "10", "--gap-every", "4", "--gap-s", "1.5", "--inject-every",
                           "0.25", "--json", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    print("\n" + "\n".join(line for line in proc.stdout.splitlines() if line.startswith("  ")))
    for key in ("ticks", "underruns_in_gaps", "underruns_outside_gaps", "recovery_ticks", "frames", "requests_started",
                "requests_finished", "requests_rejected", "requests_cancelled", "tokens_lost", "rss_start_mb",
                "rss_end_mb", "rss_growth_pct"):
        assert key in report, key
    assert report["ticks"] > 0 and report["frames"] > 0 and report["requests_started"] > 0
    assert report["tokens_lost"] == 0 and report["token_index_gaps"] == 0 and report["requests_open_at_end"] == 0
    assert report["questions_unanswered"] == 0
    assert report["gaps"] >= 1
    # output resumes by itself after each camera gap: a recovery figure for every gap, and a bounded one
    # (idle, the first chunk goes out within one camera period plus one frame, 7 ticks at 10 Hz / 50 Hz;
    # the bound leaves room for a loaded machine: one second, ten camera periods, 50 ticks)
    assert len(report["recovery_ticks"]) == report["gaps"]
    assert all(r is not None and 0 < r <= 50 for r in report["recovery_ticks"]), report["recovery_ticks"]
    # the bad input went where it should: refused by the nodes, each with its reason
    assert sum(report["camera_rejected"]["oxygen_camera"].values()) > 0
    assert sum(report["camera_rejected"]["oxygen_soak_compressed_camera"].values()) > 0
    assert report["inference_refused"]["observations_invalid"] > 0
    assert report["requests_rejected"] > 0  # the empty questions
    assert "underruns" in proc.stdout and "recovery" in proc.stdout and "memory (RSS)" in proc.stdout
    # the kinds of bad input said at the start are those counted at the end (the valid questions apart)
    started = re.search(r"with (\d+) kinds of bad input", proc.stdout)
    ended = re.search(r"messages of (\d+) kinds of bad input, and (\d+) valid questions", proc.stdout)
    assert started and ended and started[1] == ended[1] and int(ended[2]) > 0, proc.stdout[-3000:]
    # the compressed camera gets bad data only, by design: no rate warning about it
    said = proc.stdout + proc.stderr
    assert not [line for line in said.splitlines() if "compressed_camera" in line and "min_camera_rate_hz" in line]


def _soak_report(elapsed, rss_start_mb, rss_end_mb):
    """The report oxygen-soak makes at the end of a run (``soak.build_report``), from a session whose
    nodes are stand-ins that counted nothing wrong: only the memory differs between calls."""
    from collections import defaultdict
    from types import SimpleNamespace

    from oxygen_ros.tools import soak

    ns, _ = soak.parse_args(["--duration", str(elapsed)])
    s = soak.SoakSession(ns)
    s.rss_launch, s.rss_start = 80 * 2**20, rss_start_mb * 2**20
    s.soak = SimpleNamespace(counts=lambda: defaultdict(int), injected={}, cameras=[])
    s.inference = SimpleNamespace(params={"setting": "oxygen", "control_rate_hz": 50.0},
                                  counters=defaultdict(int), diagnostics=lambda: {"k": 1})
    return soak.build_report(s, float(elapsed), {"ticks": 100, "underruns": 0}, rss_end_mb * 2**20)


def test_a_long_soak_whose_memory_grew_5_percent_fails_its_memory_check():
    from oxygen_ros.tools.soak import MEMORY_CHECK_MIN_S

    grew = _soak_report(MEMORY_CHECK_MIN_S + 80, 100, 106)
    assert grew["rss_growth_pct"] == 6.0
    assert grew["checks"]["memory_flat"] is False
    assert all(ok for name, ok in grew["checks"].items() if name != "memory_flat")
    assert _soak_report(MEMORY_CHECK_MIN_S + 80, 100, 105)["checks"]["memory_flat"] is False  # 5 % itself fails
    assert _soak_report(MEMORY_CHECK_MIN_S + 80, 100, 104)["checks"]["memory_flat"] is True
    # a run shorter than MEMORY_CHECK_MIN_S is not judged on its memory (the allocators still fill)
    assert _soak_report(MEMORY_CHECK_MIN_S - 20, 100, 106)["checks"]["memory_flat"] is True
