"""A whole stack pushed into a namespace, as a ROS 2 integrator runs two robots' stacks on one
ROS_DOMAIN_ID (``--ros-args -r __ns:=/robot1``), on real DDS: with the default topic names, the
synthetic camera, the camera node and the inference node talk under the namespace and nowhere
else. The defaults were absolute (/oxygen/observation, ...): a namespace moved the nodes but not
their topics, and two stacks took each other's images, instructions and observations."""

from __future__ import annotations

from ros_harness import Ros, params, reliable, unique_prefix, until

#: what a node publishes outside its namespace, as every ROS 2 node does
GLOBAL_TOPICS = {"/diagnostics", "/rosout", "/parameter_events"}


def _stack(ros, namespace: str):
    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode
    from oxygen_ros.ros.synthetic_camera import SyntheticCamera

    nodes = [SyntheticCamera(context=ros.context, namespace=namespace),
             CameraNode(context=ros.context, namespace=namespace,
                        parameter_overrides=params(state_topic="joint_states", image_size=48)),
             InferenceNode(context=ros.context, namespace=namespace,
                           parameter_overrides=params(preset="tiny", model_path="", warmup_frames=0))]
    return [ros.add(node) for node in nodes]


def test_a_stack_in_a_namespace_talks_under_it_only(ros_env):
    from oxygen_ros.msg import ActionChunk

    namespace = unique_prefix()
    with Ros() as ros:
        nodes = _stack(ros, namespace)
        chunks = []
        ros.node("oxygen_test_namespaced").create_subscription(
            ActionChunk, f"{namespace}/oxygen/actions", chunks.append, reliable(10))
        assert until(lambda: len(chunks) >= 5, 60.0), "no ActionChunk under the namespace"
        probe = ros.node("oxygen_test_namespaced_graph")
        for node in nodes:
            name = node.get_name()
            topics = {t for t, _ in probe.get_publisher_names_and_types_by_node(name, namespace)}
            topics |= {t for t, _ in probe.get_subscriber_names_and_types_by_node(name, namespace)}
            outside = {t for t in topics - GLOBAL_TOPICS if not t.startswith(f"{namespace}/")}
            assert not outside, (name, sorted(outside))
        ask = {n for n, _ in probe.get_service_names_and_types_by_node(nodes[2].get_name(), namespace)
               if "/_action/" in n}
        assert ask and all(n.startswith(f"{namespace}/oxygen/ask/_action/") for n in ask), ask
