"""`oxygen-agent robots:=a,b demo:=true --no-robot-processes` as a user runs it: a subprocess on
real DDS with two synthetic robots and one inference node, all in the agent's process (the
default, each robot's camera side in a process of its own: test_agent_robot_processes.py); the
report has both robots' figures."""

import json
import subprocess

from ros_harness import checkout_env, installed_script

ROBOT_KEYS = ("tick_rate_hz", "tick_jitter_p50_ms", "tick_jitter_p99_ms", "obs_to_action_p50_ms",
              "obs_to_action_p99_ms", "underruns", "actions_published", "actions_received", "action_frequency_hz",
              "chunk_age_ms", "tokens_per_s", "frame_share")


def test_two_demo_robots_both_get_actions_and_the_report_has_each(ros_env, tmp_path):
    report = tmp_path / "out.json"
    proc = subprocess.run([installed_script("oxygen-agent"), "robots:=a,b", "demo:=true", "--no-robot-processes",
                           "--duration", "8", "--report", str(report)], cwd=tmp_path, env=checkout_env(), capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for node in ("a/oxygen_synthetic_camera", "b/oxygen_synthetic_camera", "a/oxygen_camera", "b/oxygen_camera",
                 "oxygen_inference"):
        assert node in proc.stdout, node  # the start-up line names every node
    data = json.loads(report.read_text())
    assert set(data["robots"]) == {"a", "b"}
    for robot, figures in data["robots"].items():
        assert set(ROBOT_KEYS) <= set(figures), (robot, figures)
        assert figures["actions_published"] > 0 and figures["actions_received"] > 0, (robot, figures)
        assert figures["tick_rate_hz"] > 0 and figures["tick_jitter_p99_ms"] is not None, (robot, figures)
        assert figures["obs_to_action_p99_ms"] is not None and figures["obs_to_action_p99_ms"] > 0, (robot, figures)
        assert 0 < figures["frame_share"] <= 1, (robot, figures)
    # the top-level figures cover both robots
    assert data["actions_published"] == sum(f["actions_published"] for f in data["robots"].values())
    assert data["measured_by"] == "arrival_probe (own process)"
    assert data["tick_jitter_p99_ms"] is not None
    # the printed summary has a per-robot table, the status line each robot
    assert "oxygen-agent: robot  tick_rate_hz" in proc.stdout
    assert any(line.startswith("oxygen-agent: a ") for line in proc.stdout.splitlines())
    assert "[a f=" in proc.stdout and "[b f=" in proc.stdout
