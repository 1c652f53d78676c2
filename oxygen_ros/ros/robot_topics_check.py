"""Warnings for a plan of several robots whose topics would cross or miss: found before anything starts.

Two mistakes in a robot's own section that no node can see from where it
stands, since each node takes the topics it is given:

* two robots' camera nodes reading the same camera topic: each robot acts on
  the other's images (unless that is one camera shared by the cell, which is
  why it is a warning);
* a robot's camera node publishing its observations elsewhere than where the
  inference node takes that robot's (``observation_topic`` set in the robot's
  own section): the robot would never get an action.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .robot_plan import CAMERA, INFERENCE, node_defaults, planned_parameters
from .robots import resolved_topic, robot_topic


def _resolved(item: dict[str, Any], topic: str) -> str:
    """``topic`` as the plan item's node resolves it (in its namespace, then its remappings)."""
    return resolved_topic(item["namespace"], topic, item["remappings"])


def _names(value: Any) -> list[str]:
    """The topic names of a list parameter's value (none when it is no list of strings)."""
    return list(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else []


def robot_topic_warnings(plan: list[dict[str, Any]], sections: list) -> list[str]:
    """The lines to warn of for ``plan`` (none without robots), with the parameters file's ``sections``."""
    from .inference_parameters import PARAMETERS as INFERENCE_PARAMETERS

    cameras = [item for item in plan if item["spec"].name == CAMERA and item.get("robot")]
    inference = next((item for item in plan if item["spec"].name == INFERENCE), None)
    if not cameras or inference is None:
        return []
    camera_defaults = node_defaults(CAMERA)
    observation = planned_parameters(inference, sections,
                                     {s.name: s.default for s in INFERENCE_PARAMETERS})["observation_topic"]
    readers, lines = defaultdict(list), []
    for item in cameras:  # a value of the wrong type is the node's to refuse, naming it: passed over here
        params, robot = planned_parameters(item, sections, camera_defaults), item["robot"]
        for topic in _names(params["image_topics"]) + _names(params["compressed_image_topics"]):
            readers[_resolved(item, topic)].append(robot)
        if not isinstance(params["observation_topic"], str) or not isinstance(observation, str):
            continue
        published = _resolved(item, params["observation_topic"])
        expected = _resolved(inference, robot_topic(robot, observation))
        if published != expected:
            lines.append(f"robot {robot}'s camera node publishes its observations on {published}, but the inference "
                         f"node takes robot {robot}'s from {expected}: that robot would get no action (leave "
                         "observation_topic out of a robot's own section)")
    for topic, robots in readers.items():
        if len(robots) > 1:
            lines.append(f"robots {', '.join(robots)} read the same camera topic {topic}: each acts on the same "
                         "images (right for one camera shared by the cell; else set image_topics in each robot's "
                         "own section)")
    return lines


__all__ = ["robot_topic_warnings"]
