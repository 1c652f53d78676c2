"""Demonstrations of the synthetic task: the expert's ideal actions and the training examples.

:func:`expert_actions` gives the ideal chunk of gripper displacements for a
scene; :func:`make_example` puts a scene's image, state, instruction, expert
chunk and description into one :class:`Example`, and :func:`examples` yields
them for random scenes (:func:`gripper_near_target` puts a share of the
grippers within reach of the target, so that "at gripper" descriptions and
near-zero chunks are well represented).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from oxygen_ros.core.sim.scene import MAX_STEP, REACH_TOLERANCE, Scene, describe, instruction, render, sample_scene

#: Dimensions of an action: the gripper displacement ``(dx, dy)``.
ACTION_DIMS = 2
#: Dimensions of the state: the gripper position ``(x, y)``.
STATE_DIMS = 2


def expert_actions(scene: Scene, horizon: int, max_step: float = MAX_STEP) -> np.ndarray:
    """The ideal chunk of ``horizon`` gripper displacements, ``float32[horizon, ACTION_DIMS]``.

    Each step moves straight toward the target's centre by ``max_step`` (the
    last one by the remaining distance) and every step after arrival is exactly
    zero.
    """
    if horizon < 0:
        raise ValueError(f"horizon must be >= 0, got {horizon}")
    if max_step <= 0:
        raise ValueError(f"max_step must be > 0, got {max_step}")
    target = np.asarray(scene.target.position, dtype=np.float64)
    position = np.asarray(scene.gripper, dtype=np.float64)
    actions = np.zeros((horizon, ACTION_DIMS), dtype=np.float64)
    for t in range(horizon):
        offset = target - position
        distance = float(np.hypot(*offset))
        if distance == 0.0:
            break
        step = offset if distance <= max_step else offset * (max_step / distance)
        actions[t] = step
        position = target.copy() if distance <= max_step else position + step
    return actions.astype(np.float32)


def gripper_near_target(scene: Scene, rng: np.random.Generator) -> Scene:
    """The scene with the gripper moved to a uniformly drawn point within 0.9 x reach of the target."""
    angle = rng.uniform(0.0, 2 * math.pi)
    radius = 0.9 * REACH_TOLERANCE * math.sqrt(rng.random())
    tx, ty = scene.target.position
    return scene.with_gripper((tx + radius * math.cos(angle), ty + radius * math.sin(angle)))


class Example(NamedTuple):
    """One training example (also unpacks as a plain tuple in this order)."""

    image: np.ndarray  # uint8[size, size, 3]
    state: np.ndarray  # float32[STATE_DIMS], the gripper position
    instruction: str  # "move to the red circle"
    actions: np.ndarray  # float32[horizon, ACTION_DIMS], see expert_actions
    description: str  # "red circle upper left of gripper"
    question: str = ""  # "where is the target?" (see questions.py); empty: the periodic description
    answer: str = ""  # its answer, "upper left of gripper"

    @property
    def text(self) -> str:
        """The text the model is trained to decode: the answer to the question, else the description."""
        return self.answer if self.question else self.description


def make_example(scene: Scene, size: int, horizon: int, max_step: float = MAX_STEP) -> Example:
    """The example for one scene."""
    return Example(
        image=render(scene, size),
        state=scene.state,
        instruction=instruction(scene),
        actions=expert_actions(scene, horizon, max_step),
        description=describe(scene),
    )


def examples(
    seed: int,
    count: int | None = None,
    *,
    size: int = 64,
    horizon: int = 10,
    max_step: float = MAX_STEP,
    at_target_prob: float = 0.1,
) -> Iterator[Example]:
    """Yield ``count`` examples (forever when ``None``), the same ones for the same arguments.

    Scenes come from :func:`sample_scene` with the gripper anywhere
    (``min_gripper_distance=0``); with probability ``at_target_prob`` the gripper
    is instead put within reach of the target, so that "at gripper" descriptions
    and near-zero action chunks are well represented.
    """
    rng = np.random.default_rng(seed)
    produced = 0
    while count is None or produced < count:
        scene = sample_scene(rng, min_gripper_distance=0.0)
        if rng.random() < at_target_prob:
            scene = gripper_near_target(scene, rng)
        yield make_example(scene, size, horizon, max_step)
        produced += 1
