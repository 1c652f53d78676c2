"""The nodes' executables as a user (or ros2 launch) starts them: a bad parameter ends each
with one line naming it and the same exit status, 2, so that a launch or a supervisor can tell
a configuration error from a crash (1). Real processes on real DDS."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ros_harness import checkout_env, from_a_terminal, installed_prefix

CASES = [("camera_node", ["image_size:=-3"], ["image_size"]),
         ("synthetic_camera", ["rate_hz:=0.0"], ["rate_hz"]),
         ("inference_node", ["steps_per_frame:=-1"], ["steps_per_frame"]),
         # several mistakes are all named at once, not one per start
         ("camera_node", ["image_size:=-3", "max_age:=-1.0"], ["image_size", "max_age"]),
         ("inference_node", ["steps_per_frame:=-1", "control_rate_hz:=0.0", "queue_limit:=-2"],
          ["steps_per_frame", "control_rate_hz", "queue_limit"])]


@pytest.mark.parametrize("executable, parameters, names", CASES)
def test_a_bad_parameter_ends_a_node_with_status_2_naming_it(ros_env, tmp_path, executable, parameters, names):
    path = installed_prefix() / "lib" / "oxygen_ros" / executable
    args = [a for p in parameters for a in ("-p", p)]
    run = subprocess.run([str(path), "--ros-args", *args], cwd=tmp_path, env=checkout_env(),
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    assert all(out.count(f"parameter '{name}'") == 1 for name in names), out[-2000:]  # said once: the node's log


@pytest.mark.parametrize("executable", ["camera_node", "inference_node"])
def test_a_parameters_file_rcl_cannot_parse_ends_a_node_with_status_2(ros_env, tmp_path, executable):
    """rcl refuses it in rclpy.init, before any node exists: that was a traceback and status 1,
    which a launch with respawn:=true took for a crash and restarted every second for ever."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("oxygen_camera:\n  ros__parameters:\n    image_topics: [/a\n")
    path = installed_prefix() / "lib" / "oxygen_ros" / executable
    run = subprocess.run([str(path), "--ros-args", "--params-file", str(broken)], cwd=tmp_path, env=checkout_env(),
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    assert f"cannot start with these arguments: failed to initialize rcl: Couldn't parse params file: " \
           f"'--params-file {broken}'" in out, out[-2000:]


def _loading_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps: Linux only")
@pytest.mark.parametrize("command", ["lib/oxygen_ros/inference_node", "bin/oxygen-agent"])
def test_ctrl_c_while_the_modules_load_ends_with_one_line_and_no_traceback(ros_env, tmp_path, command):
    """Ctrl-C in the seconds torch takes to import, before the command handles it itself: one
    line and status 0, as during the run, instead of a screenful of import traceback."""
    path = installed_prefix() / command
    proc = subprocess.Popen([str(path)], cwd=tmp_path, env=checkout_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=from_a_terminal())
    try:
        deadline = time.monotonic() + 60
        while not _loading_torch(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _loading_torch(proc.pid), "torch was never loaded"
        proc.send_signal(signal.SIGINT)  # torch's own modules (and transformers') load for seconds more
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == f"{path.name}: interrupted", err[-2000:]


# a library whose start-up swallows a Ctrl-C, as torch's C start-up does when one lands while it
# imports numpy (the error cleared, about 0.2 s into `import torch`): the inference node then
# started and ran on (seen in a clean clone's run of the test above); AFTER the swallowed one
SWALLOWING_LIBRARY = """
import signal, time
try:
    signal.raise_signal(signal.SIGINT)
    time.sleep(1.0)
except KeyboardInterrupt:
    pass
{after}
def main():
    time.sleep(60)  # the command's run, which a Ctrl-C should have prevented
    return 3
"""


@pytest.mark.parametrize("after", ["", "import half_imported; half_imported.ndarray  # the next line fails"])
def test_a_ctrl_c_that_a_library_swallows_while_it_loads_still_ends_the_command(tmp_path, after):
    """The installed launcher, pointed at such a library: the interrupt is honoured once the
    import returns (or fails because of it), with one line and status 0."""
    (tmp_path / "swallowing_library.py").write_text(SWALLOWING_LIBRARY.format(after=after))
    (tmp_path / "half_imported.py").write_text("")
    source = (installed_prefix() / "lib" / "oxygen_ros" / "inference_node").read_text()
    assert "from oxygen_ros.ros.inference_node import main" in source
    launcher = tmp_path / "swallowing_command"
    launcher.write_text(source.replace("from oxygen_ros.ros.inference_node import main",
                                       "from swallowing_library import main")
                        .replace("inference_node: interrupted", "swallowing_command: interrupted"))
    env = checkout_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(launcher)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=30, preexec_fn=from_a_terminal())
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == "swallowing_command: interrupted", run.stderr[-2000:]


@pytest.mark.parametrize("transitions", [["unconfigured_shutdown"], ["configure", "inactive_shutdown"]])
def test_a_shutdown_transition_ends_the_managed_node_s_process(ros_env, tmp_path, transitions):
    """A finalized node publishes nothing and takes no transition: its process ends (0), so
    that a launch, whose nodes are all required, ends too instead of running on without
    actions. The transition is answered first."""
    from ros_harness import Lifecycle, Ros, inference_topics, unique_prefix

    prefix = unique_prefix()
    path = installed_prefix() / "lib" / "oxygen_ros" / "managed_inference_node"
    topics = [a for name, topic in inference_topics(prefix).items() for a in ("-p", f"{name}:={topic}")]
    proc = subprocess.Popen([str(path), "--ros-args", "-r", f"__ns:={prefix}", "-p", "autostart:=false",
                             "-p", "warmup_frames:=0", "-p", f"ask_action:={prefix}/ask", *topics],
                            cwd=tmp_path, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        with Ros() as ros:
            life = Lifecycle(ros.node("oxygen_test_lifecycle"), f"{prefix}/oxygen_inference")
            assert all(life.change(t) for t in transitions), transitions
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "finalized by a shutdown transition: the process ends" in out, out[-3000:]


def _parameter_table(executable: str):
    from oxygen_ros.ros import bag_player, camera_parameters, inference_parameters, synthetic_camera

    return {"camera_node": camera_parameters.PARAMETERS, "inference_node": inference_parameters.PARAMETERS,
            "managed_inference_node": inference_parameters.PARAMETERS,
            "synthetic_camera": synthetic_camera.SYNTHETIC_CAMERA_PARAMETERS,
            "bag_player": bag_player.BAG_PLAYER_PARAMETERS}[executable]


@pytest.mark.parametrize("executable", ["inference_node", "managed_inference_node", "camera_node",
                                        "synthetic_camera", "bag_player"])
def test_help_names_every_parameter_and_starts_no_node(ros_env, tmp_path, executable):
    """``ros2 run oxygen_ros NODE --help``: what the node does and each parameter with its type, default,
    when it is read and its description; nothing starts (it used to start the node)."""
    path = installed_prefix() / "lib" / "oxygen_ros" / executable
    run = subprocess.run([str(path), "--help"], cwd=tmp_path, env=checkout_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[INFO]" not in run.stdout + run.stderr, run.stderr[-2000:]  # no node: nothing logged
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"usage: ros2 run oxygen_ros {executable} [--ros-args"), lines[0]
    table = _parameter_table(executable)
    for spec in table:
        line = next((x for x in lines if x.startswith(f"  {spec.name} (")), None)
        assert line is not None, f"{spec.name} not in --help"
        assert ("changes at run time" in line) == spec.dynamic, line
    if executable == "managed_inference_node":  # read at configure, but held for its life: its Ask servers
        assert "  model_path (string, default ''; read at configure: changes while unconfigured)" in lines
        assert any(x.startswith("  robots (string array, default []; read at start)") for x in lines)
