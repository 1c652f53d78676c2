"""Every node's parameters through the ROS 2 parameter services, as `ros2 param` uses them.

For each node the launch file or a replay starts (camera, inference, plain and managed,
synthetic camera, bag player) the test lists every parameter, gets and describes every one of them in one
request each (a single value the services cannot answer leaves `ros2 param dump` with
nothing), writes the dump the way `ros2 param dump` does, starts the node again from that
dump as its params file, and checks that it comes up with the same values and types.
The nodes start from a params file holding empty lists (``joint_names: []``,
``camera_names: []``), the case that used to come out untyped.
"""

from __future__ import annotations

import uuid

import pytest
import yaml
from ros_harness import Ros, until

NOT_SET = 0


def _call(client_node, service_type, service: str, request):
    client = client_node.create_client(service_type, service)
    try:
        assert client.wait_for_service(timeout_sec=10.0), f"{service} not offered"
        future = client.call_async(request)
        assert until(future.done, timeout=10.0), f"{service} did not answer"
        return future.result()
    finally:
        client_node.destroy_client(client)


def _python_value(value):
    """A ParameterValue as the Python value `ros2 param dump` writes (None for NOT_SET)."""
    field = {1: "bool_value", 2: "integer_value", 3: "double_value", 4: "string_value", 5: "byte_array_value",
             6: "bool_array_value", 7: "integer_array_value", 8: "double_array_value", 9: "string_array_value"}
    if value.type == NOT_SET:
        return None
    out = getattr(value, field[value.type])
    return list(out) if value.type >= 5 else out


def parameter_services(client_node, full_name: str) -> dict:
    """{name: (type, value, descriptor)} of the node ``full_name`` through list, get and describe."""
    from rcl_interfaces.srv import DescribeParameters, GetParameters, ListParameters

    names = list(_call(client_node, ListParameters, f"{full_name}/list_parameters",
                       ListParameters.Request()).result.names)
    assert names, f"{full_name} lists no parameter"
    values = _call(client_node, GetParameters, f"{full_name}/get_parameters", GetParameters.Request(names=names))
    described = _call(client_node, DescribeParameters, f"{full_name}/describe_parameters",
                      DescribeParameters.Request(names=names))
    assert len(values.values) == len(names) and len(described.descriptors) == len(names)
    return {name: (v.type, _python_value(v), d) for name, v, d in zip(names, values.values, described.descriptors)}


def dump_file(tmp_path, full_name: str, parameters: dict):
    """The params file `ros2 param dump` writes for these parameters."""
    path = tmp_path / f"dump_{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump({full_name: {"ros__parameters": {n: v for n, (_, v, _) in parameters.items()}}}))
    return path


def _bag(tmp_path):
    from message_builders import bag_recording

    from oxygen_ros.ros.bags import write_bag

    return str(write_bag(tmp_path / "bag", "mcap", bag_recording("/roundtrip", images=2)))


def _nodes(tmp_path):
    """(class, the params file's values) for every node; empty lists on purpose."""
    from oxygen_ros.ros.bag_player import BagPlayer
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode
    from oxygen_ros.ros.managed_inference_node import ManagedInferenceNode
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    return {
        "camera": (CameraNode, {"image_topics": ["/rt/cam"], "compressed_image_topics": [], "camera_names": [],
                                "max_age": 2.5}),
        "inference": (InferenceNode, {"joint_names": [], "warmup_frames": 0, "control_rate_hz": 40.0,
                                      "hold_action": "last"}),
        "managed_inference": (ManagedInferenceNode, {"joint_names": [], "warmup_frames": 0, "autostart": True}),
        "synthetic_camera": (SyntheticCamera, {"rate_hz": 5.0}),
        "bag_player": (BagPlayer, {"bag_path": _bag(tmp_path), "topics": [], "latched_topics": [],
                                   "shutdown_when_done": False}),
    }


@pytest.mark.parametrize("which", ["camera", "inference", "managed_inference", "synthetic_camera", "bag_player"])
def test_parameter_services_answer_and_a_dump_starts_the_same_node(ros_env, tmp_path, which):
    cls, values = _nodes(tmp_path)[which]
    namespace = f"/rt_{uuid.uuid4().hex[:8]}"
    with Ros() as ros:
        client = ros.node("oxygen_test_param_client")

        def start(params_file):
            return ros.add(cls(context=ros.context, namespace=namespace,
                               cli_args=["--ros-args", "--params-file", str(params_file)]))

        first_file = tmp_path / "params.yaml"
        first_file.write_text(yaml.safe_dump({"/**": {"ros__parameters": values}}))
        node = start(first_file)
        full_name = node.get_fully_qualified_name()
        before = parameter_services(client, full_name)
        unset = [n for n, (kind, _, _) in before.items() if kind == NOT_SET]
        assert not unset, f"parameters without a value (the services cannot answer for them): {unset}"
        for name, value in values.items():
            assert before[name][1] == value, name
        for name, (_, _, descriptor) in before.items():
            assert descriptor.name == name
        ros.remove(node)

        again = start(dump_file(tmp_path, full_name, before))
        after = parameter_services(client, again.get_fully_qualified_name())
        assert {n: (t, v) for n, (t, v, _) in after.items()} == {n: (t, v) for n, (t, v, _) in before.items()}
        assert {n: d.read_only for n, (_, _, d) in after.items()} == {n: d.read_only for n, (_, _, d) in before.items()}


@pytest.mark.parametrize("which, typo, meant", [("camera", "imge_size", "image_size"),
                                                ("inference", "control_rate", "control_rate_hz"),
                                                ("synthetic_camera", "rate_hzz", "rate_hz")])
def test_a_misspelt_parameter_is_named_with_the_one_it_is_closest_to(ros_env, tmp_path, which, typo, meant):
    """A typo in the params file would leave that parameter at its default, unnoticed: every
    node names it (and warns in its log); its own parameters, as `ros2 param dump` writes
    them, are never reported."""
    from oxygen_ros.ros.parameters import unknown_parameters

    cls, values = _nodes(tmp_path)[which]
    table = {"camera": "oxygen_ros.ros.camera_parameters:PARAMETERS",
             "inference": "oxygen_ros.ros.inference_parameters:PARAMETERS",
             "synthetic_camera": "oxygen_ros.ros.synthetic_camera:SYNTHETIC_CAMERA_PARAMETERS"}[which]
    module, name = table.split(":")
    specs = getattr(__import__(module, fromlist=[name]), name)
    namespace = f"/typo_{uuid.uuid4().hex[:8]}"
    with Ros() as ros:
        client = ros.node("oxygen_test_typo_client")
        path = tmp_path / "typo.yaml"
        path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {**values, typo: 1.0}}}))
        node = ros.add(cls(context=ros.context, namespace=namespace, cli_args=["--ros-args", "--params-file", str(path)]))
        assert unknown_parameters(node, specs) == [f"{typo!r} (did you mean {meant!r}?)"]
        full_name = node.get_fully_qualified_name()
        dumped = parameter_services(client, full_name)
        ros.remove(node)
        again = ros.add(cls(context=ros.context, namespace=namespace,
                            cli_args=["--ros-args", "--params-file", str(dump_file(tmp_path, full_name, dumped))]))
        assert unknown_parameters(again, specs) == []


@pytest.mark.parametrize("which, name, given, later", [("inference", "control_rate_hz", 40, 25),
                                                       ("camera", "max_age", 2, 3),
                                                       ("synthetic_camera", "rate_hz", 5, 7)])
def test_a_whole_number_given_for_a_float_parameter_is_stored_as_a_float(ros_env, tmp_path, which, name, given,
                                                                         later):
    """`control_rate_hz: 40` in a params file (or `control_rate_hz:=40`, `ros2 param set ...
    25`) is a float parameter's value: `ros2 param get` answers a double, and `dump` writes
    40.0, at start and after a run-time change. A string is still refused, naming it."""
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.msg import ParameterValue
    from rcl_interfaces.srv import SetParameters

    double, integer, string = 3, 2, 4
    cls, values = _nodes(tmp_path)[which]
    namespace = f"/num_{uuid.uuid4().hex[:8]}"
    with Ros() as ros:
        client = ros.node("oxygen_test_number_client")
        path = tmp_path / "numbers.yaml"
        path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {**values, name: given}}}))
        node = ros.add(cls(context=ros.context, namespace=namespace, cli_args=["--ros-args", "--params-file", str(path)]))
        full_name = node.get_fully_qualified_name()
        kind, value, _ = parameter_services(client, full_name)[name]
        assert (kind, value) == (double, float(given)) and isinstance(value, float)

        def set_to(kind, **field):
            msg = ParameterMsg(name=name, value=ParameterValue(type=kind, **field))
            return _call(client, SetParameters, f"{full_name}/set_parameters",
                         SetParameters.Request(parameters=[msg])).results[0]

        assert set_to(integer, integer_value=later).successful
        kind, value, _ = parameter_services(client, full_name)[name]
        assert (kind, value) == (double, float(later))
        refused = set_to(string, string_value="fast")
        assert not refused.successful and name in refused.reason
        assert parameter_services(client, full_name)[name][1] == float(later)


@pytest.mark.parametrize("which, other, owner", [("camera", "hold_action", "oxygen_inference"),
                                                 ("inference", "image_topics", "oxygen_camera")])
def test_another_node_s_parameter_in_a_node_s_section_names_that_node(ros_env, tmp_path, which, other, owner):
    """hold_action in oxygen_camera's section was "unknown parameter(s) ignored: 'hold_action'",
    leaving the user to find whose it is."""
    from rcl_interfaces.msg import Log
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    cls, values = _nodes(tmp_path)[which]
    namespace = f"/owner_{uuid.uuid4().hex[:8]}"
    with Ros() as ros:
        logs = []
        ros.node("oxygen_test_owner_log").create_subscription(Log, "/rosout", logs.append, QoSProfile(
            depth=1000, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        path = tmp_path / "misplaced.yaml"  # in the node's own section (a shared /** one holds every node's)
        path.write_text(yaml.safe_dump({"/**": {"ros__parameters": values},
                                        f"/**/oxygen_{which}": {"ros__parameters": {other: ["x"]}}}))
        node = ros.add(cls(context=ros.context, namespace=namespace, cli_args=["--ros-args", "--params-file", str(path)]))
        want = f"unknown parameter(s) ignored: {other!r} (a parameter of {owner}: in its section)"
        assert until(lambda: any(m.msg.startswith(want) and m.name == node.get_logger().name for m in logs), 10.0), \
            [m.msg for m in logs if m.name == node.get_logger().name]
