"""With robots named: who sends to the inputs the node would take without them, which no one takes now.

A node serving ``robots: [left, right]`` (or ``[left]``) takes each robot's questions on
``/left/oxygen/question`` and ``/right/oxygen/question``, and nothing on the
bare ``/oxygen/question``. A question script, a camera node or an
``ros2 action send_goal /oxygen/ask`` kept from a one-robot set-up sends
there all the same, and is never answered: ROS says nothing of a topic
without subscribers. :func:`unserved_inputs` looks at the graph for them (a
publisher of questions or observations on the bare topic, a client of the
bare Ask action), unless something else takes them there (another node
serving one robot, on the same ROS network), and names them; the node's
status (WARN, and on the console) says where they should send instead.
"""

from __future__ import annotations

from .robots import robot_topic

#: The node's inputs, by parameter: what goes on them, and (for the action) its status topic: an
#: action client subscribes to it, and a server publishes on it.
INPUTS = (("question_topic", "questions", None), ("observation_topic", "observations", None),
          ("ask_action", "Ask goals", "/_action/status"))


def _names(infos) -> str:
    """The fully qualified names of the nodes of ``infos`` (TopicEndpointInfo), each once, sorted."""
    return ", ".join(sorted({f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in infos}))


def unserved_inputs(node, params: dict) -> list[str]:
    """What is sent to the node's one-robot inputs, and taken by no one, while it serves named
    robots (none without), each as ``"questions on <topic> from <nodes> (robot <r>'s go to <its topic>)"``;
    ``params``: the node's parameters."""
    robots = params["robots"]
    if not robots:
        return []
    found = []
    for key, what, status in INPUTS:
        name = node.resolve_topic_name(params[key])
        if status is None:  # senders, unless something takes them (another node serving one robot)
            senders = "" if node.count_subscribers(name) else _names(node.get_publishers_info_by_topic(name))
        else:  # clients, unless a server answers them
            topic = name + status
            senders = "" if node.count_publishers(topic) else _names(node.get_subscriptions_info_by_topic(topic))
        if senders:
            robots_name = node.resolve_topic_name(robot_topic(robots[0], params[key]))
            found.append(f"{what} on {name} from {senders} (robot {robots[0]}'s go to {robots_name})")
    return found


__all__ = ["unserved_inputs"]
