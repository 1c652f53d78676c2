"""A warning, before anything starts, for a camera node that groups more cameras than the
inference node takes (``max_cameras``): every observation it sends would be refused.

The inference node refuses such an observation when it comes, naming ``max_cameras``,
once per observation; from the parameters file the plan can tell before the start.
With ``max_cameras: 0`` (the model's camera slots) nothing is known before the model
loads, and nothing is said here (the default: read without importing the inference node's
table, which would take the launch seconds to import torch).
"""

from __future__ import annotations

from typing import Any

from .plan_tables import node_label
from .robot_plan import CAMERA, INFERENCE, node_defaults, planned_parameters


def _topics(value: Any) -> int:
    """How many topics a list parameter's value names (0 when it is no list: the node refuses it)."""
    return len(value) if isinstance(value, list) else 0


def camera_count_warnings(plan: list[dict[str, Any]], sections: list) -> list[str]:
    """The lines to warn of for ``plan`` with the parameters file's ``sections``."""
    inference = next((item for item in plan if item["spec"].name == INFERENCE), None)
    if inference is None:
        return []
    most = planned_parameters(inference, sections).get("max_cameras", 0)
    if not isinstance(most, int) or isinstance(most, bool) or most <= 0:
        return []
    lines, defaults = [], node_defaults(CAMERA)
    for item in plan:
        if item["spec"].name != CAMERA:
            continue
        params = planned_parameters(item, sections, defaults)
        count = _topics(params["image_topics"]) + _topics(params["compressed_image_topics"])
        if count > most:
            lines.append(f"{node_label(item)} groups {count} cameras, but the inference node's max_cameras is "
                         f"{most}: it would refuse every observation (set max_cameras to {count}, or 0 for the "
                         "model's camera slots)")
    return lines
