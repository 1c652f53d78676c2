"""The inference node's /diagnostics statuses are named with its namespace, as the camera node's
are (``robot1/oxygen_camera: cameras``): two inference nodes in /robot1 and /robot2 both named
their status ``oxygen_inference: engine``, so that a monitor could not tell whose figures it read.
In the root namespace the names stay ``oxygen_inference: engine`` and ``oxygen_inference: robot <r>``."""

from ros_harness import inference_node, inference_topics, params, reliable, unique_prefix, until


def _status_names(ros) -> set:
    """The names of every status on /diagnostics from now on (a set that grows)."""
    from diagnostic_msgs.msg import DiagnosticArray

    names = set()
    ros.node("oxygen_test_monitor").create_subscription(
        DiagnosticArray, "/diagnostics", lambda m: names.update(s.name for s in m.status), reliable(50))
    return names


def test_nodes_in_two_namespaces_publish_statuses_named_apart(ros):
    prefix = unique_prefix()
    names = _status_names(ros)
    inference_node(ros, f"{prefix}/robot1", control_process=False)
    inference_node(ros, f"{prefix}/robot2", control_process=False, robots=["a", "b"])
    ns = prefix.lstrip("/")
    wanted = {f"{ns}/robot1/oxygen_inference: engine", f"{ns}/robot2/oxygen_inference: engine",
              f"{ns}/robot2/oxygen_inference: robot a", f"{ns}/robot2/oxygen_inference: robot b"}
    assert until(lambda: wanted <= names, timeout=20.0), sorted(n for n in names if "oxygen_inference" in n)


def test_a_node_in_the_root_namespace_keeps_the_names_it_had(ros):
    from oxygen_ros.ros.inference_node import InferenceNode

    names = _status_names(ros)
    values = {**inference_topics(unique_prefix()), "preset": "tiny", "model_path": "", "control_process": False,
              "robots": ["a", "b"]}
    node = ros.add(InferenceNode(context=ros.context, parameter_overrides=params(**values)))
    assert node.get_fully_qualified_name() == "/oxygen_inference"
    wanted = {"oxygen_inference: engine", "oxygen_inference: robot a", "oxygen_inference: robot b"}
    assert until(lambda: wanted <= names, timeout=20.0), sorted(names)
