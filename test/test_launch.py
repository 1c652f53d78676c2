"""launch/agent.launch.py and config/agent.yaml: consistent with the nodes and installed.

launch_ros is not installable from the ROS 2 wheels, so the launch file is
loaded only where it is importable; everything else is checked structurally:
the launch file's nodes and arguments (shared with ``oxygen-agent`` through
``oxygen_ros.ros.plan``), the installed executables, and the parameters
declared by the real nodes (started here) against the YAML and the overrides.
"""

import ast
import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from ros_harness import REPO, Ros, executables, installed_prefix

LAUNCH_FILE = REPO / "launch" / "agent.launch.py"
YAML_FILE = REPO / "config" / "agent.yaml"
BAG_PLAYER_YAML = REPO / "config" / "bag_player.yaml"
IMPLICIT = {"use_sim_time", "start_type_description_service"}  # declared by rclpy itself


@pytest.fixture(scope="module")
def declared(module_ros_env):
    """{node name: {parameter: default value}} of every node the launch file can start."""
    from oxygen_ros.ros.plan_tables import NODES

    out = {}
    with Ros() as ros:
        for spec in NODES:
            cls = getattr(importlib.import_module(spec.module), spec.cls)
            node = ros.add(cls(context=ros.context, namespace=f"/launch_test_{spec.name}"))
            out[spec.name] = {name: p.value for name, p in node.get_parameters_by_prefix("").items()
                              if name not in IMPLICIT and not name.startswith("qos_overrides.")}  # rclpy's own
    return out


def test_launch_file_structure():
    """The launch file declares the shared arguments and starts launch_ros Nodes with
    parameters=[params_file, the overrides' own file] and the camera remapping."""
    tree = ast.parse(LAUNCH_FILE.read_text())
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names}
    assert {"DeclareLaunchArgument", "LaunchConfiguration", "Node", "OpaqueFunction", "LaunchDescription",
            "get_package_share_directory", "ARGUMENTS", "resolve", "RegisterEventHandler", "OnProcessExit",
            "node_exit_message", "overrides_file", "respawn_message", "LogInfo"} <= imported
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    calls = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            calls.setdefault(n.func.id, []).append(n)
    assert len(calls["Node"]) == 1
    keywords = {k.arg for k in calls["Node"][0].keywords}
    assert {"package", "executable", "name", "namespace", "parameters", "remappings"} <= keywords
    assert "'config', 'agent.yaml'" in LAUNCH_FILE.read_text()
    # the overrides as a file (launch_ros refuses a dict holding an empty list; see test_robot_plan)
    assert "parameters.append(overrides_file(item, overrides_dir))" in LAUNCH_FILE.read_text()
    # ... in a folder removed when the launch shuts down
    assert "RegisterEventHandler(OnShutdown(on_shutdown=partial(_remove, overrides_dir)))" in LAUNCH_FILE.read_text()
    assert "shutil.rmtree(directory" in ast.unparse(functions["_remove"])
    # the plan's warnings at the warning level of launch's own user logger (LogInfo's is info)
    assert "log = launch.logging.get_logger('launch.user')" in LAUNCH_FILE.read_text()
    assert "log.warning(line)" in ast.unparse(functions["_nodes"])
    # ... named by the launch's process id, after removing those of launches that no longer run
    assert "overrides_dir, left_behind = new_overrides_folder()" in LAUNCH_FILE.read_text()
    # the plan and the params file come from resolve() (which refuses a missing file) ...
    (resolved,) = calls["resolve"]
    assert [a.id for a in resolved.args] == ["values"]
    # ... and every node started gets an OnProcessExit handler on that very node, whose
    # callback raises (ending the launch non-zero) with node_exit_message's text
    (handler,) = calls["OnProcessExit"]
    targets = {k.arg: k.value for k in handler.keywords}
    assert isinstance(targets["target_action"], ast.Name) and targets["target_action"].id == "node"
    assert "node = Node(" in LAUNCH_FILE.read_text()
    assert isinstance(targets["on_exit"], ast.Name) and targets["on_exit"].id == "on_exit"
    # (the node's restarts counted from 0 in a list of its own, for respawn_max_retries)
    assert "on_exit = partial(_on_exit, label, item['respawn_delay'], item['respawn_max_retries'], [0])" \
        in LAUNCH_FILE.read_text()
    assert "spec, label = item['spec'], node_label(item)" in LAUNCH_FILE.read_text()
    on_exit = functions["_on_exit"]
    assert any(isinstance(n, ast.Raise) for n in ast.walk(on_exit))
    assert ("node_exit_message(name, event.returncode, context.is_shutdown, respawn_delay, restarted[0], "
            "max_retries)") in ast.unparse(on_exit)
    # respawn:=true: the plan's camera-side nodes are restarted by launch_ros, and the restart is logged
    node_keywords = {k.arg: ast.unparse(k.value) for k in calls["Node"][0].keywords}
    assert node_keywords["respawn"] == "item['respawn_delay'] is not None"
    assert node_keywords["respawn_delay"] == "item['respawn_delay']"
    # ... at most respawn_max_retries times (launch_ros's -1: no limit), the restarts counted as launch_ros does
    assert node_keywords["respawn_max_retries"] == (
        "-1 if item['respawn_max_retries'] is None else item['respawn_max_retries']")
    assert "restarted[0] += 1" in ast.unparse(on_exit)
    assert "respawn_message(name, event.returncode, respawn_delay, restarted[0], max_retries)" in ast.unparse(on_exit)


def test_a_node_exit_ends_the_launch_unless_it_is_shutting_down():
    from oxygen_ros.ros.plan import node_exit_message

    assert node_exit_message("oxygen_inference", 2, shutting_down=False) == (
        "oxygen_inference exited with code 2; ending the launch (the node's own log above says why)")
    assert node_exit_message("oxygen_camera", -9, shutting_down=False) == (
        "oxygen_camera was killed by signal 9; ending the launch")  # its own log says nothing of a kill
    assert "exited with code 0" in node_exit_message("oxygen_camera", 0, shutting_down=False)
    assert node_exit_message("oxygen_inference", 2, shutting_down=True) is None


@pytest.mark.parametrize("content", [None, "oxygen_camera: [unclosed\n", b"\xff\xfe\x00bad",
                                     "oxygen_camera:\n  ros__parameters:\n    image_size: 48\n"
                                     "oxygen_inference:\n  ros__parameters:\n"])
def test_a_missing_or_unreadable_params_file_is_an_error(tmp_path, capsys, content):
    """The launch file and oxygen-agent share resolve(): nothing starts from a params
    file that is missing, not YAML, or has a section ROS 2 refuses (an empty ros__parameters,
    its parameters commented out, ended oxygen-agent in rcl's traceback), and the error names
    the file."""
    from oxygen_ros.ros.agent import run_agent
    from oxygen_ros.ros.plan import resolve

    path = tmp_path / "agent.yaml"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=str(path)):
        resolve({"params_file": str(path)})
    assert run_agent("oxygen-test", {"params_file": str(path)}, None) == 2
    assert f"oxygen-test: parameters file {path}" in capsys.readouterr().err


def test_a_camera_node_grouping_more_cameras_than_max_cameras_is_warned_of_before_the_start(tmp_path):
    """Every observation would be refused at run time, one by one; with robots, per robot."""
    from oxygen_ros.ros.plan import node_plan, plan_warnings

    path = tmp_path / "agent.yaml"
    path.write_text(YAML_FILE.read_text().replace("    max_cameras: 0\n", "    max_cameras: 1\n").replace(
        '    compressed_image_topics: []\n', '    compressed_image_topics: ["/wrist/image_raw/compressed"]\n', 1))
    assert "max_cameras: 1" in path.read_text() and "/wrist/image_raw/compressed" in path.read_text()
    assert plan_warnings(node_plan({}, str(path)), str(path)) == [
        "oxygen_camera groups 2 cameras, but the inference node's max_cameras is 1: it would refuse every "
        "observation (set max_cameras to 2, or 0 for the model's camera slots)"]
    lines = plan_warnings(node_plan({"robots": "a,b"}, str(path)), str(path))
    assert [line.split(" groups")[0] for line in lines] == ["a/oxygen_camera", "b/oxygen_camera"], lines
    assert plan_warnings(node_plan({"model_path": ""}, str(YAML_FILE)), str(YAML_FILE)) == []  # max_cameras 0


def test_a_section_without_ros__parameters_is_named_as_such(tmp_path):
    """It read "section '/oxygen_camera/image_size' is not a mapping", which named no cause."""
    from oxygen_ros.ros.plan import resolve

    path = tmp_path / "agent.yaml"
    path.write_text("oxygen_camera:\n  image_size: 48\n")
    with pytest.raises(ValueError) as err:
        resolve({"params_file": str(path)})
    assert str(err.value) == (f"parameters file {path}: 'image_size' in section '/oxygen_camera' is a value, not a "
                              "section: a node's parameters go under ros__parameters (is 'ros__parameters:' missing "
                              "under 'oxygen_camera'?)")


def test_a_launch_removes_the_overrides_folders_of_launches_that_no_longer_run(tmp_path):
    """SIGTERM ends ``ros2 launch`` without its OnShutdown handlers: its folder stays, and the next
    launch removes it. A running launch's folder, and other names, stay."""
    from oxygen_ros.ros.launch_folder import new_overrides_folder

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    left = tmp_path / f"oxygen_launch_{ended.pid}_abc123"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "oxygen_camera.yaml").write_text("x: 1\n")
    running = tmp_path / f"oxygen_launch_{os.getppid()}_def456"  # pytest's parent runs
    running.mkdir()
    others = [tmp_path / "oxygen_launch_abc123", tmp_path / "oxygen_launch_7_notes.txt", tmp_path / "other_1_x"]
    others[0].mkdir()
    others[1].write_text("a file, not a launch's folder\n")
    others[2].mkdir()

    folder, removed = new_overrides_folder(str(tmp_path))
    assert removed == [str(left)] and not left.exists()
    assert running.is_dir() and all(p.exists() for p in others)
    assert pathlib.Path(folder).is_dir() and pathlib.Path(folder).name.startswith(f"oxygen_launch_{os.getpid()}_")
    # this process runs: a second launch from it keeps the first's folder
    second, removed = new_overrides_folder(str(tmp_path))
    assert removed == [] and pathlib.Path(folder).is_dir() and second != folder


def test_launch_file_loads_where_launch_ros_is_available(tmp_path, monkeypatch):
    pytest.importorskip("launch_ros")
    import tempfile

    from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction, RegisterEventHandler
    from launch_ros.actions import Node

    from launch import LaunchContext
    from oxygen_ros.ros.plan_tables import ARGUMENTS

    spec = importlib.util.spec_from_file_location("agent_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    names = [e.name for e in description.entities if isinstance(e, DeclareLaunchArgument)]
    assert names == [a.name for a in ARGUMENTS]
    (opaque,) = [e for e in description.entities if isinstance(e, OpaqueFunction)]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the overrides folders go
    import types

    import launch.logging

    said = []  # the warnings, at the warning level of launch.user (a LogInfo would say them at info)
    monkeypatch.setattr(launch.logging, "get_logger", lambda name=None: types.SimpleNamespace(warning=said.append))
    # each node, its OnProcessExit handler, and the OnShutdown handler that removes the overrides'
    # folder; with two robots: 2 cameras (+ 2 synthetic) + 1 inference
    for demo, robots, count in (("false", "", 2), ("true", "", 3), ("false", "a,b", 3), ("true", "a,b", 5)):
        context = LaunchContext()
        for a in ARGUMENTS:
            context.launch_configurations[a.name] = a.default
        context.launch_configurations["params_file"] = str(YAML_FILE)
        context.launch_configurations["demo"] = demo
        context.launch_configurations["robots"] = robots
        context.launch_configurations["respwan"] = "true"  # a misspelt argument: warned of
        said.clear()
        actions = opaque.execute(context)
        assert sum(isinstance(a, Node) for a in actions) == count, actions
        assert sum(isinstance(a, RegisterEventHandler) for a in actions) == count + 1, actions
        assert not [a for a in actions if isinstance(a, LogInfo)], actions
        assert len(said) == 1 and "'respwan' is none of this launch's (did you mean 'respawn'?)" in said[0], said


def test_node_plan_demo_is_off_by_default_and_overrides_are_typed():
    from oxygen_ros.ros.plan import node_plan
    from oxygen_ros.ros.plan_tables import CAMERA_TOPIC

    assert [i["spec"].name for i in node_plan({})] == ["oxygen_camera", "oxygen_inference"]
    plan = {i["spec"].name: i for i in node_plan({"demo": "true", "control_rate_hz": "25", "device": "cpu",
                                                    "camera_topic": "/cam/rgb"})}
    assert list(plan) == ["oxygen_synthetic_camera", "oxygen_camera", "oxygen_inference"]
    assert plan["oxygen_inference"]["parameters"] == {"control_rate_hz": 25, "device": "cpu"}
    assert plan["oxygen_camera"]["remappings"] == [(CAMERA_TOPIC, "/cam/rgb")]
    assert plan["oxygen_synthetic_camera"]["remappings"] == [(CAMERA_TOPIC, "/cam/rgb")]
    assert plan["oxygen_inference"]["remappings"] == []
    assert {i["namespace"] for i in plan.values()} == {""} and {i["robot"] for i in plan.values()} == {None}
    with pytest.raises(ValueError, match="demo"):
        node_plan({"demo": "maybe"})
    with pytest.raises(ValueError, match="unknown"):
        node_plan({"modle_path": "/x"})


def test_demo_closes_the_camera_node_s_loop_at_the_embedded_model_s_resolution():
    """demo:=true: the camera node reads the synthetic robot's /joint_states and passes its images
    on at 48 px (the embedded model's size); without demo it gets neither (the YAML's values)."""
    from oxygen_ros.ros.plan import node_plan

    demo = {i["spec"].name: i for i in node_plan({"demo": "true"})}
    assert demo["oxygen_camera"]["parameters"] == {"state_topic": "joint_states", "image_size": 48}  # (/joint_states)
    plain = {i["spec"].name: i for i in node_plan({"demo": "false"})}
    assert plain["oxygen_camera"]["parameters"] == {}


def test_launch_arguments_parse_and_a_bad_one_is_named():
    from oxygen_ros.ros.plan import parse_launch_args

    assert parse_launch_args(["demo:=true", " camera_topic :=/a:=b", "model_path:="]) == {
        "demo": "true", "camera_topic": "/a:=b", "model_path": ""}
    with pytest.raises(ValueError, match="'demo=true'"):
        parse_launch_args(["demo=true"])


def test_run_agent_refuses_a_bad_argument_before_starting_anything(capsys):
    """oxygen-agent and oxygen-soak share this start-up: a misspelt argument is named,
    exit status 2, and no node (nor the command's own part) is started."""
    from oxygen_ros.ros.agent import run_agent

    class Session:
        calls = []

        def start(self, agent):
            self.calls.append("start")

        def run(self, agent):
            self.calls.append("run")
            return 0

        def finish(self, agent):
            self.calls.append("finish")

    assert run_agent("oxygen-test", {"modle_path": "/x"}, Session()) == 2
    assert "oxygen-test: unknown argument(s) 'modle_path' (did you mean 'model_path'?); known: " \
        in capsys.readouterr().err
    assert Session.calls == []


def test_a_misspelt_launch_argument_is_warned_of():
    """ros2 launch takes any name:=value: demmo:=true would start without the demo, unsaid. A name
    close to an argument is warned of; one far from all of them (a parent launch's) is not."""
    from oxygen_ros.ros.plan import misspelt_arguments

    given = ["demo", "demmo", "camera_topc", "robot_name", "use_sim_time", "model"]
    assert misspelt_arguments(given) == [
        "launch argument 'camera_topc' is none of this launch's (did you mean 'camera_topic'?): it changes nothing",
        "launch argument 'demmo' is none of this launch's (did you mean 'demo'?): it changes nothing"]
    assert "misspelt_arguments(context.launch_configurations)" in LAUNCH_FILE.read_text()


def test_every_executable_is_installed():
    from oxygen_ros.ros.plan_tables import NODES

    prefix = installed_prefix()
    rows = {name: (where, f"{module}:{function}") for name, where, module, function in executables()}
    for spec in NODES:
        assert spec.executable in rows, f"{spec.executable} not in resource/executables.txt"
        where, target = rows[spec.executable]
        assert where == "lib" and target.startswith(spec.module + ":")
        path = prefix / "lib" / "oxygen_ros" / spec.executable
        assert path.is_file(), f"{path} missing (run `make venv`)"
        assert getattr(importlib.import_module(spec.module), spec.cls)
    assert (prefix / "bin" / "oxygen-agent").is_file()


def test_launch_and_config_are_installed():
    share = installed_prefix() / "share" / "oxygen_ros"
    for rel, source in (("launch/agent.launch.py", LAUNCH_FILE), ("config/agent.yaml", YAML_FILE),
                        ("config/bag_player.yaml", BAG_PLAYER_YAML)):
        installed = share / rel
        assert installed.is_file(), f"{installed} missing (run `make venv`)"
        assert installed.read_text() == source.read_text(), f"{installed} is stale (run `make venv`)"


def test_every_overridden_parameter_is_declared(declared):
    from oxygen_ros.ros.plan_tables import ARGUMENTS, DEMO_PARAMETERS

    for a in ARGUMENTS:
        if a.node is not None:
            assert a.parameter in declared[a.node], f"argument {a.name} sets {a.node}.{a.parameter}: not declared"
    for node, params in DEMO_PARAMETERS.items():
        assert set(params) <= set(declared[node])


def _yaml_sections():
    data = yaml.safe_load(YAML_FILE.read_text())
    return {node: section["ros__parameters"] for node, section in data.items()}


def test_yaml_has_every_parameter_of_every_node_with_its_default(declared):
    sections = _yaml_sections()
    assert set(sections) == set(declared)
    for node, params in sections.items():
        assert set(params) == set(declared[node]), (
            f"{node}: in the YAML only {sorted(set(params) - set(declared[node]))}, "
            f"declared only {sorted(set(declared[node]) - set(params))}")
        for name, value in params.items():
            default = declared[node][name]
            if value == [] or default in (None, []):  # an empty list is unset / untyped in ROS
                assert not default and value == [], (node, name, value, default)
            else:
                assert value == default and type(value) is type(default), (node, name, value, default)


@pytest.mark.parametrize("path", [YAML_FILE, BAG_PLAYER_YAML], ids=lambda p: p.name)
def test_yaml_comments_every_parameter(path):
    lines = path.read_text().splitlines()
    param = re.compile(r"^ {4}(\w+):")
    for i, line in enumerate(lines):
        if param.match(line):
            previous = lines[i - 1].strip()
            assert previous.startswith("#"), f"config/{path.name} line {i + 1}: {line.strip()} has no comment"


def test_the_bag_player_s_file_has_every_parameter_with_its_default():
    """config/bag_player.yaml documents the bag player's parameters (it is not a node of the
    launch file): every one, at its default, marked (run time) where it is."""
    from oxygen_ros.ros.bag_player import BAG_PLAYER_PARAMETERS

    text = BAG_PLAYER_YAML.read_text()
    params = yaml.safe_load(text)["oxygen_bag_player"]["ros__parameters"]
    assert list(params) == [s.name for s in BAG_PLAYER_PARAMETERS]
    for spec in BAG_PLAYER_PARAMETERS:
        assert params[spec.name] == (list(spec.default) if isinstance(spec.default, tuple) else spec.default), spec.name
        comment = text.split(f"\n    {spec.name}:")[0].rsplit("\n    ", 1)[-1]
        assert ("(run time)" in comment) == spec.dynamic, spec.name


def test_yaml_loads_into_the_nodes(ros):
    """Every node starts from the YAML (types accepted, values valid)."""
    from oxygen_ros.ros.plan_tables import NODES

    for spec in NODES:
        cls = getattr(importlib.import_module(spec.module), spec.cls)
        node = ros.add(cls(context=ros.context, namespace="/launch_test_yaml",
                           cli_args=["--ros-args", "--params-file", str(YAML_FILE)]))
        assert node.get_name() == spec.name


def test_a_params_file_section_that_names_no_node_is_reported(tmp_path, capsys):
    """A misspelt node name in the params file leaves every parameter of that node at its
    default: oxygen-agent (and the launch file, in its log) says which section no node reads.
    Sections of the installed file, a robot's own and the generic ones it reads are all used."""
    from oxygen_ros.ros.plan import node_plan, plan_warnings

    bad = tmp_path / "bad.yaml"
    bad.write_text("oxygen_inferense:\n  ros__parameters:\n    control_rate_hz: 25.0\n"
                   "oxygen_camera:\n  ros__parameters:\n    max_age: 1.0\n")
    (line,) = plan_warnings(node_plan({}, str(bad)), str(bad))
    assert "section '/oxygen_inferense' names no node of this launch (did you mean '/oxygen_inference'? " in line
    far = tmp_path / "far.yaml"  # nothing close: no guess, the nodes it could have named
    far.write_text("gripper_driver:\n  ros__parameters:\n    rate: 25.0\n")
    (line,) = plan_warnings(node_plan({}, str(far)), str(far))
    assert "section '/gripper_driver' names no node of this launch (its nodes: " in line and "/oxygen_camera" in line
    assert plan_warnings(node_plan({}, str(YAML_FILE)), str(YAML_FILE)) == []
    assert plan_warnings(node_plan({"demo": "true"}, str(YAML_FILE)), str(YAML_FILE)) == []
    assert plan_warnings(node_plan({"camera_topic": "/cam"}, str(YAML_FILE)), str(YAML_FILE)) == []
    assert plan_warnings(node_plan({"robots": "a,b", "camera_topic": "/cam"}, str(YAML_FILE)), str(YAML_FILE)) == []
    # camera_topic remaps /camera/image_raw: with other image_topics it would change nothing, unnoticed
    mine = tmp_path / "mine.yaml"
    mine.write_text("oxygen_camera:\n  ros__parameters:\n    image_topics: [/wrist/image_raw]\n")
    (line,) = plan_warnings(node_plan({"camera_topic": "/cam"}, str(mine)), str(mine))
    assert line == ("camera_topic:=/cam does not change oxygen_camera's cameras: it remaps /camera/image_raw, "
                    "which is not among its image_topics ['/wrist/image_raw']; set image_topics instead")
    robots = tmp_path / "robots.yaml"
    robots.write_text(YAML_FILE.read_text() + "left/oxygen_camera:\n  ros__parameters:\n    max_age: 1.0\n"
                      "/**:\n  ros__parameters:\n    use_sim_time: false\n")
    assert plan_warnings(node_plan({"robots": "left,right"}, str(robots)), str(robots)) == []
