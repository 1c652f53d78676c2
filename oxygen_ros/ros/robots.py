"""Robot names and the topic rule of one inference node serving several robots.

With ``robots:=left,right`` (the launch file, ``oxygen-agent``) every robot's
topics are the configured ones under ``/<robot>``: an absolute topic parameter
``/oxygen/observation`` becomes ``/left/oxygen/observation``, for the nodes in
the root namespace (:func:`robot_topic`, the inference node's own rule) and
for those in the robot's namespace (:func:`namespaced_topic`, where a
relative name is left as it is: it resolves below ``/left`` anyway). Robot
names are ROS name tokens (:func:`parse_robots`). No rclpy here: the launch
file imports this for the plan alone.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
NAME_RULE = "a ROS name token: a letter, then letters, digits or underscores"


def bad_robot_names(names, where: str = "") -> str | None:
    """Why ``names`` is not a list of robot names (a bad name, one listed twice), or None.
    ``where``: how the reason names the list (`` in 'left,2b'``)."""
    for name in names:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return f"robot name {name!r}{where} is not valid ({NAME_RULE})"
    for name in names:
        if list(names).count(name) > 1:
            return f"robot name {name!r} is listed twice{where}"
    return None


def robot_names_check(value, values=None) -> str | None:
    """A ParamSpec check: a list of robot names (see :func:`bad_robot_names`)."""
    return bad_robot_names(value, f" in {list(value)}")


def parse_robots(text: str, what: str = "argument 'robots'") -> tuple[str, ...]:
    """``"left,right"`` as ``("left", "right")``; empty text: no robots (today's single
    robot). ValueError naming the bad name (not a name token, or listed twice), after ``what``
    (where the list came from)."""
    text = str(text).strip()
    if not text:
        return ()
    names = [name.strip() for name in text.split(",")]
    reason = bad_robot_names(names, f" in {text!r}")
    if reason is not None:
        raise ValueError(f"{what}: {reason}")
    return tuple(names)


def robot_topic(robot: str | None, topic: str) -> str:
    """``topic`` of ``robot`` as a node in the root namespace names it (the inference node,
    the agent's monitor and arrival probe, the bag player): ``/<robot>`` + an absolute
    topic, ``<robot>/`` + a relative one (the rule of ``robot_io.robot_topic``); any topic
    unchanged without a robot."""
    if not robot:
        return topic
    return f"/{robot}{topic}" if topic.startswith("/") else f"{robot}/{topic}"


def namespaced_topic(robot: str | None, topic: str) -> str:
    """``topic`` of ``robot`` as a node in the robot's namespace names it (its camera node,
    its synthetic camera): ``/<robot>`` + an absolute topic; a relative, private (``~/...``)
    or empty one unchanged, since it resolves in the namespace anyway (or is no topic)."""
    if not robot or not topic.startswith("/"):
        return topic
    return f"/{robot}{topic}"


def resolved_topic(namespace: str, topic: str, remappings=()) -> str:
    """``topic`` as a node in ``namespace`` resolves it: a relative one under the namespace,
    then its remappings (``(from, to)`` pairs of resolved names)."""
    if not topic.startswith("/"):
        topic = f"/{namespace.strip('/')}/{topic}".replace("//", "/")
    return dict(remappings).get(topic, topic)


def namespaced_value(robot: str | None, value):
    """:func:`namespaced_topic` applied to a topic parameter's value (a name or a list of names)."""
    if isinstance(value, str):
        return namespaced_topic(robot, value)
    if isinstance(value, (list, tuple)):
        return [namespaced_topic(robot, v) if isinstance(v, str) else v for v in value]
    return value


__all__ = ["NAME_RULE", "bad_robot_names", "namespaced_topic", "namespaced_value", "parse_robots", "resolved_topic",
           "robot_names_check", "robot_topic"]
