"""Synthetic 2-D manipulation task: scenes, rendering, simulator (:mod:`.scene`), expert and dataset
(:mod:`.demonstrations`), questions about a scene and their answers (:mod:`.questions`).

See :mod:`oxygen_ros.core.sim.scene` for the task definition and coordinate
convention (normalised ``[-1, 1]^2``, ``x`` right, ``y`` down).
"""

from oxygen_ros.core.sim.demonstrations import (
    ACTION_DIMS,
    STATE_DIMS,
    Example,
    examples,
    expert_actions,
    gripper_near_target,
    make_example,
)
from oxygen_ros.core.sim.scene import (
    COLOURS,
    MAX_STEP,
    REACH_TOLERANCE,
    RELATIONS,
    SHAPES,
    Scene,
    SceneObject,
    Simulator,
    all_descriptions,
    all_instructions,
    describe,
    instruction,
    relation,
    render,
    sample_scene,
)

__all__ = [
    "ACTION_DIMS",
    "STATE_DIMS",
    "gripper_near_target",
    "COLOURS",
    "MAX_STEP",
    "REACH_TOLERANCE",
    "RELATIONS",
    "SHAPES",
    "Example",
    "Scene",
    "SceneObject",
    "Simulator",
    "all_descriptions",
    "all_instructions",
    "describe",
    "examples",
    "expert_actions",
    "instruction",
    "make_example",
    "relation",
    "render",
    "sample_scene",
]
