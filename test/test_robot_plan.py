"""The node plan for several robots (robots:=left,right), shared by the launch file and
oxygen-agent: per robot a camera node (and synthetic camera) in the robot's namespace
on /<robot>/... topics, one inference node serving them all; the parameters-file
sections a namespaced node gets, worked out as rcl does (checked against real nodes).
"""

import importlib

import pytest
from ros_harness import REPO, Ros

YAML_FILE = REPO / "config" / "agent.yaml"


def _plan(values, params_file=YAML_FILE):
    from oxygen_ros.ros.plan import node_label, node_plan

    return {node_label(item): item for item in node_plan(values, str(params_file))}


def _topic(item, key, index=None):
    """The planned topic parameter ``key`` of ``item`` as its node resolves it in its namespace
    (the defaults are relative names: camera/image_raw in namespace left is /left/camera/image_raw)."""
    from oxygen_ros.ros.robots import resolved_topic

    value = item["parameters"][key] if index is None else item["parameters"][key][index]
    return resolved_topic(item["namespace"], value)


def _write(tmp_path, text):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_two_robots_give_a_camera_node_each_in_its_namespace_and_one_inference_node():
    plan = _plan({"robots": "left,right"})
    assert list(plan) == ["left/oxygen_camera", "right/oxygen_camera", "oxygen_inference"]
    inference = plan["oxygen_inference"]
    assert inference["namespace"] == "" and inference["parameters"] == {"robots": ["left", "right"]}
    for robot in ("left", "right"):
        item = plan[f"{robot}/oxygen_camera"]
        assert item["spec"].name == "oxygen_camera" and item["namespace"] == robot == item["robot"]
        p = item["parameters"]
        assert len(p["image_topics"]) == 1 and p["compressed_image_topics"] == []
        assert _topic(item, "image_topics", 0) == f"/{robot}/camera/image_raw"
        assert _topic(item, "instruction_topic") == f"/{robot}/oxygen/instruction"
        assert _topic(item, "observation_topic") == f"/{robot}/oxygen/observation"
        assert p["state_topic"] == ""  # no topic stays no topic
        assert p["image_size"] == 224 and p["max_age"] == 0.5  # the generic section, which rcl would not give it
        assert item["remappings"] == []
    # launch arguments still go to the inference node only
    plan = _plan({"robots": "left,right", "control_rate_hz": "25"})
    assert plan["oxygen_inference"]["parameters"] == {"control_rate_hz": 25, "robots": ["left", "right"]}


def test_demo_gives_every_robot_its_own_scene_and_closes_each_loop():
    plan = _plan({"robots": "a,b,c", "demo": "true"})
    assert list(plan) == ["a/oxygen_synthetic_camera", "b/oxygen_synthetic_camera", "c/oxygen_synthetic_camera",
                          "a/oxygen_camera", "b/oxygen_camera", "c/oxygen_camera", "oxygen_inference"]
    seeds = [plan[f"{r}/oxygen_synthetic_camera"]["parameters"]["seed"] for r in "abc"]
    assert seeds == [0, 1, 2]  # the YAML's seed + the robot's index
    for r in "abc":
        synthetic, camera = plan[f"{r}/oxygen_synthetic_camera"], plan[f"{r}/oxygen_camera"]
        assert _topic(synthetic, "image_topic") == f"/{r}/camera/image_raw" == _topic(camera, "image_topics", 0)
        assert _topic(synthetic, "action_topic") == f"/{r}/oxygen/actions"
        assert _topic(camera, "state_topic") == _topic(synthetic, "joint_state_topic") == f"/{r}/joint_states"
        assert camera["parameters"]["image_size"] == 48


SECTIONS = """
oxygen_camera:
  ros__parameters:
    image_size: 100
    image_topics: ["/camera/image_raw", "/camera/wrist"]
    qos_overrides:
      /camera/wrist:
        subscription: {reliability: reliable, depth: 2}
left/oxygen_camera:
  ros__parameters:
    image_topics: ["/arm_left/camera/image_raw"]
    max_age: 0.25
right:
  oxygen_camera:
    ros__parameters:
      state_topic: /arm_right/joint_states
oxygen_synthetic_camera:
  ros__parameters:
    seed: 7
/right/oxygen_synthetic_camera:
  ros__parameters:
    seed: 42
"""


def test_a_robot_section_goes_over_the_generic_one_and_its_topics_are_taken_as_written(tmp_path):
    plan = _plan({"robots": "left,right", "demo": "false"}, _write(tmp_path, SECTIONS))
    left, right = plan["left/oxygen_camera"]["parameters"], plan["right/oxygen_camera"]["parameters"]
    assert left["image_topics"] == ["/arm_left/camera/image_raw"] and left["max_age"] == 0.25
    assert right["image_topics"] == ["/right/camera/image_raw", "/right/camera/wrist"]
    assert right["state_topic"] == "/arm_right/joint_states" and "max_age" not in right  # the node's default
    assert left["image_size"] == right["image_size"] == 100
    # QoS overrides follow their topic under /<robot>
    assert right["qos_overrides./right/camera/wrist.subscription.reliability"] == "reliable"
    assert left["qos_overrides./left/camera/wrist.subscription.depth"] == 2
    assert not any("./camera/wrist" in name for name in left)
    seeds = _plan({"robots": "left,right", "demo": "true"}, _write(tmp_path, SECTIONS))
    assert seeds["left/oxygen_synthetic_camera"]["parameters"]["seed"] == 7  # 7 + index 0
    assert seeds["right/oxygen_synthetic_camera"]["parameters"]["seed"] == 42  # its own, as written


def test_robots_whose_topics_cross_or_miss_are_warned_of_before_anything_starts(tmp_path):
    """Two robots reading one camera topic act on each other's images; a robot whose camera node
    publishes its observations where the inference node does not look never gets an action. The
    plan is fine as far as each node can tell, so the plan says it (oxygen-agent and the launch)."""
    from oxygen_ros.ros.plan import node_plan, plan_warnings

    def warnings(extra, **args):
        path = _write(tmp_path, YAML_FILE.read_text() + extra)
        return plan_warnings(node_plan({"robots": "left,right", **args}, str(path)), str(path))

    assert warnings("") == [] and warnings("", demo="true", camera_topic="/cam/rgb") == []
    (line,) = warnings('\nleft/oxygen_camera:\n  ros__parameters:\n    image_topics: ["/right/camera/image_raw"]\n')
    assert line.startswith("robots left, right read the same camera topic /right/camera/image_raw")
    (line,) = warnings('\nleft/oxygen_camera:\n  ros__parameters:\n    observation_topic: /oxygen/observation\n')
    assert line.startswith("robot left's camera node publishes its observations on /oxygen/observation, but the "
                           "inference node takes robot left's from /left/oxygen/observation")
    # values of the wrong type are the nodes' to refuse: no warning, no traceback here
    assert warnings("\nleft/oxygen_camera:\n  ros__parameters:\n    image_topics: 5\n    observation_topic: 7\n") == []
    # the inference node's own topic moved with it: the robots' camera nodes follow (no warning)
    assert warnings("\noxygen_camera:\n  ros__parameters:\n    observation_topic: /obs\n"
                    "oxygen_inference:\n  ros__parameters:\n    observation_topic: /obs\n") == []


def test_a_wildcard_section_for_every_camera_node_is_the_generic_one_for_each_robot(tmp_path):
    """``/**/oxygen_camera`` names every camera node, the robots' too: it is each robot's generic
    section (topics under /<robot>), not a robot's own one (topics as written, which would put
    both robots' cameras on the one /camera/image_raw)."""
    sections = _write(tmp_path, """
/**/oxygen_camera:
  ros__parameters:
    image_topics: ["/camera/image_raw"]
    max_age: 0.3
""")
    plan = _plan({"robots": "left,right", "demo": "false"}, sections)
    for robot in ("left", "right"):
        p = plan[f"{robot}/oxygen_camera"]["parameters"]
        assert p["image_topics"] == [f"/{robot}/camera/image_raw"], (robot, p["image_topics"])
        assert p["max_age"] == 0.3


def test_camera_topic_applies_per_robot_after_the_prefix():
    plan = _plan({"robots": "left,right", "demo": "true", "camera_topic": "/cam/rgb"})
    for r in ("left", "right"):
        for node in ("oxygen_camera", "oxygen_synthetic_camera"):
            assert plan[f"{r}/{node}"]["remappings"] == [(f"/{r}/camera/image_raw", f"/{r}/cam/rgb")]
    assert plan["oxygen_inference"]["remappings"] == []


def test_robots_set_in_the_parameters_file_plan_each_robot_s_nodes(tmp_path):
    """The inference node reads ``robots`` from the file: without the argument, the plan takes
    them from there too, so each robot gets its camera node on its own topics."""
    text = YAML_FILE.read_text().replace("    robots: []\n", "    robots: [left, right]\n")
    assert "robots: [left, right]" in text
    path = _write(tmp_path, text)
    plan = _plan({"demo": "true"}, path)
    assert sorted(plan) == ["left/oxygen_camera", "left/oxygen_synthetic_camera", "oxygen_inference",
                            "right/oxygen_camera", "right/oxygen_synthetic_camera"]
    assert _topic(plan["left/oxygen_camera"], "observation_topic") == "/left/oxygen/observation"
    assert list(_plan({"robots": "a"}, path)) == ["a/oxygen_camera", "oxygen_inference"]  # the argument wins
    bad = _write(tmp_path, text.replace("robots: [left, right]", "robots: [left, left]"))
    with pytest.raises(ValueError, match=r"parameters file .*agent.yaml: oxygen_inference's robots: robot name "
                                         r"'left' is listed twice"):
        _plan({}, bad)


@pytest.mark.parametrize("robots, bad", [("left,2nd", "'2nd'"), ("left,,right", "''"), ("le-ft", "'le-ft'"),
                                         ("left,right,left", "'left' is listed twice"), ("a b", "'a b'")])
def test_a_bad_robot_name_is_refused_naming_it(robots, bad, capsys):
    from oxygen_ros.ros.agent import run_agent
    from oxygen_ros.ros.plan import node_plan

    with pytest.raises(ValueError, match=f"argument 'robots': robot name {bad}"):
        node_plan({"robots": robots})
    assert run_agent("oxygen-test", {"robots": robots}, None) == 2
    assert bad in capsys.readouterr().err


def test_robot_topics_name_every_topic_parameter_of_the_robot_side_nodes():
    from oxygen_ros.ros.plan_tables import NODES
    from oxygen_ros.ros.parameters import optional_topic_name, topic_list, topic_name
    from oxygen_ros.ros.robot_plan import PARAMETER_TABLES, ROBOT_TOPICS

    robot_side = {spec.name for spec in NODES if spec.name != "oxygen_inference"}
    assert set(ROBOT_TOPICS) == set(PARAMETER_TABLES) == robot_side
    for node, (module, attribute) in PARAMETER_TABLES.items():
        table = getattr(importlib.import_module(module), attribute)
        topics = {s.name for s in table if s.check in (topic_name, topic_list, optional_topic_name)}
        assert topics == set(ROBOT_TOPICS[node]), node


RCL_CASES = """
oxygen_camera: {ros__parameters: {a: plain, b: plain}}
/**/oxygen_camera: {ros__parameters: {b: any_ns, c: any_ns}}
left/oxygen_camera: {ros__parameters: {c: left, d: left}}
/*/oxygen_camera: {ros__parameters: {e: one_ns}}
/left/oxygen_camera: {ros__parameters: {f: {g: nested}}}
right: {oxygen_camera: {ros__parameters: {d: right}}}
/**: {ros__parameters: {h: all}}
other: {ros__parameters: {a: other}}
"""


def test_sections_are_matched_as_rcl_matches_them(ros_env, tmp_path):
    """read_sections + node_parameters give a node what rclpy gives it from the same file."""
    from rclpy.node import Node

    from oxygen_ros.ros.params_sections import node_parameters, read_sections

    path = _write(tmp_path, RCL_CASES)
    sections = read_sections(str(path))
    with Ros() as ros:
        for namespace in ("", "left", "right", "left/deep"):
            node = Node("oxygen_camera", namespace=namespace, context=ros.context,
                        cli_args=["--ros-args", "--params-file", str(path)],
                        automatically_declare_parameters_from_overrides=True)
            got = {n: p.value for n, p in node.get_parameters_by_prefix("").items()
                   if n not in ("use_sim_time", "start_type_description_service")}
            assert got == node_parameters(sections, node.get_fully_qualified_name()), namespace
            node.destroy_node()
    # the generic section never reaches a namespaced node: the plan passes it on itself
    assert "a" not in node_parameters(sections, "/left/oxygen_camera")


def test_a_params_file_that_is_not_sections_is_named(tmp_path):
    from oxygen_ros.ros.params_sections import read_sections

    for text in ("- a\n- b\n", "oxygen_camera: 3\n", "oxygen_camera: {ros__parameters: [1]}\n"):
        path = _write(tmp_path, text)
        with pytest.raises(ValueError, match=str(path)):
            read_sections(str(path))
    with pytest.raises(ValueError, match="not found"):
        read_sections(str(tmp_path / "missing.yaml"))
    broken = _write(tmp_path, "oxygen_camera:\n  ros__parameters:\n    image_topics: [/a, /b\n")
    with pytest.raises(ValueError, match="cannot be read") as error:
        read_sections(str(broken))
    assert f'in "{broken}", line' in str(error.value)  # the syntax error placed in the file, not in a string


def test_built_nodes_run_in_their_robots_namespaces_with_the_merged_parameters(ros_env, tmp_path):
    """build_nodes (oxygen-agent's start-up) makes real nodes in the namespaces with the
    plan's overrides: the generic section, the robot's own, the QoS override of a topic."""
    import rclpy
    from rclpy.context import Context

    from oxygen_ros.ros.plan import build_nodes, node_plan

    path = _write(tmp_path, SECTIONS)
    plan = [i for i in node_plan({"robots": "left,right", "demo": "true"}, str(path)) if i["robot"]]
    nodes = []
    context = Context()
    rclpy.init(context=context)
    try:
        build_nodes(plan, str(path), nodes, context=context)
        names = sorted(n.get_fully_qualified_name() for n in nodes)
        assert names == ["/left/oxygen_camera", "/left/oxygen_synthetic_camera", "/right/oxygen_camera",
                         "/right/oxygen_synthetic_camera"]
        cameras = {n.get_namespace(): n for n in nodes if n.get_name() == "oxygen_camera"}
        assert cameras["/left"].get_parameter("image_topics").value == ["/arm_left/camera/image_raw"]
        assert cameras["/right"].get_parameter("image_size").value == 48  # demo over the generic 100
        wrist = [s for s in cameras["/right"].subscriptions if s.topic_name == "/right/camera/wrist"]
        assert len(wrist) == 1 and wrist[0].qos_profile.depth == 2
    finally:
        for node in nodes:
            node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_robot_topic_is_the_inference_nodes_rule():
    from oxygen_ros.ros.robot_io import robot_topic as node_rule
    from oxygen_ros.ros.robots import namespaced_topic, robot_topic

    assert node_rule is robot_topic  # one rule for the node and the plan
    assert robot_topic("left", "/oxygen/actions") == "/left/oxygen/actions"
    assert robot_topic("left", "oxygen/actions") == "left/oxygen/actions"
    assert robot_topic("", "/oxygen/actions") == robot_topic(None, "/oxygen/actions") == "/oxygen/actions"
    # a node in the robot's namespace: a relative name resolves below /left by itself
    assert namespaced_topic("left", "/oxygen/actions") == "/left/oxygen/actions"
    assert namespaced_topic("left", "oxygen/actions") == "oxygen/actions"
    assert namespaced_topic("left", "") == ""


def test_oxygen_soak_refuses_robots(capsys):
    from oxygen_ros.tools.soak import main

    with pytest.raises(SystemExit) as exc:
        main(["robots:=left,right", "--duration", "5"])
    assert exc.value.code == 2
    assert "robots:= is not supported" in capsys.readouterr().err


def test_nodes_started_as_ros2_launch_starts_them_get_the_plans_parameters(ros_env, tmp_path):
    """The launch file gives each node ``--params-file <params_file> --params-file
    <overrides_file>`` (launch_ros would refuse the empty lists of a parameter dict:
    the plan's ``compressed_image_topics: []``, and here a robot's own ``image_topics: []``
    that only compressed images feed). Real nodes started that way, in their robots'
    namespaces, have every parameter of the plan, and only their own section's."""
    import rclpy
    from rclpy.context import Context

    from oxygen_ros.ros.plan import overrides_file

    text = SECTIONS + """
/right/oxygen_camera:
  ros__parameters:
    image_topics: []
    compressed_image_topics: ["/arm_right/camera/image_raw/compressed"]
"""
    path = _write(tmp_path, text)
    plan = {label: item for label, item in _plan({"robots": "left,right", "demo": "true"}, path).items()
            if item["robot"]}
    right = plan["right/oxygen_camera"]["parameters"]
    assert right["image_topics"] == [] and right["compressed_image_topics"] == ["/arm_right/camera/image_raw/compressed"]
    assert plan["left/oxygen_camera"]["parameters"]["compressed_image_topics"] == []
    folder = tmp_path / "overrides"
    folder.mkdir()
    context = Context()
    rclpy.init(context=context)
    nodes = []
    try:
        for label, item in plan.items():
            cls = getattr(importlib.import_module(item["spec"].module), item["spec"].cls)
            cli = ["--ros-args", "--params-file", str(path), "--params-file", overrides_file(item, str(folder))]
            node = cls(context=context, namespace=item["namespace"], cli_args=cli)
            nodes.append(node)
            # a QoS override is declared only where its topic is subscribed (not left's wrist camera)
            expected = {name: value for name, value in item["parameters"].items()
                        if node.has_parameter(name) or not name.startswith("qos_overrides.")}
            assert {name: node.get_parameter(name).value for name in expected} == expected, label
        assert len(list(folder.iterdir())) == len(plan)
    finally:
        for node in nodes:
            node.destroy_node()
        rclpy.try_shutdown(context=context)
