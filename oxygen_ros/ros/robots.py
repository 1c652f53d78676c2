"""Robot names and the topic rule of one inference node serving several robots.

With ``robots:=left,right`` (the launch file, ``oxygen-agent``) every robot's
topics are the configured ones under ``/<robot>``: an absolute topic parameter
``/oxygen/observation`` becomes ``/left/oxygen/observation``
(:func:`robot_topic`); a relative one is left as it is, since it resolves in
the node's namespace (``left``) anyway, and an empty one (no topic) stays
empty. The inference node applies the same rule to its own topics. Robot
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


def parse_robots(text: str, argument: str = "robots") -> tuple[str, ...]:
    """``"left,right"`` as ``("left", "right")``; empty text: no robots (today's single
    robot). ValueError naming the bad name (not a name token, or listed twice)."""
    text = str(text).strip()
    if not text:
        return ()
    names = [name.strip() for name in text.split(",")]
    reason = bad_robot_names(names, f" in {text!r}")
    if reason is not None:
        raise ValueError(f"argument '{argument}': {reason}")
    return tuple(names)


def robot_topic(robot: str | None, topic: str) -> str:
    """``topic`` for ``robot``: ``/<robot>`` + an absolute topic; a relative, private
    (``~/...``) or empty one unchanged; any topic unchanged without a robot."""
    if not robot or not topic.startswith("/"):
        return topic
    return f"/{robot}{topic}"


def robot_value(robot: str | None, value):
    """:func:`robot_topic` applied to a topic parameter's value (a name or a list of names)."""
    if isinstance(value, str):
        return robot_topic(robot, value)
    if isinstance(value, (list, tuple)):
        return [robot_topic(robot, v) if isinstance(v, str) else v for v in value]
    return value


__all__ = ["NAME_RULE", "bad_robot_names", "parse_robots", "robot_names_check", "robot_topic", "robot_value"]
