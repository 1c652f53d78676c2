"""A tiny 2-D "move the gripper to the named object" task (numpy only).

The task exists so that a small vision-language-action model can be trained,
evaluated and demonstrated without a robot:

* a :class:`Scene` holds 1-3 coloured shapes, one of which is the *target*, and
  the gripper position;
* :func:`render` draws it as an RGB image, :func:`instruction` names the target
  (``"move to the red circle"``) and :func:`describe` says where it is relative
  to the gripper (``"red circle upper left of gripper"``);
* :func:`sample_scene` draws random scenes; :class:`Simulator` closes the loop
  for evaluation and for a demo camera;
* the expert's ideal action chunks and the training examples made of scenes
  are in :mod:`oxygen_ros.core.sim.demonstrations`.

Coordinates
    Everything is in normalised image coordinates ``[-1, 1] x [-1, 1]``: ``x``
    grows to the **right** and ``y`` grows **downwards** (like image rows), so
    ``(-1, -1)`` is the top-left corner of the image. The robot state is the
    gripper position ``(x, y)`` and an action is a displacement ``(dx, dy)`` of
    the gripper in the same units.

Gripper marker
    A white ``+`` cross with a black outline, drawn over the shapes, so it never
    looks like one of the (filled, coloured) objects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from oxygen_ros.core.sim import raster

# --------------------------------------------------------------------------
# Vocabulary and geometry constants
# --------------------------------------------------------------------------

#: Object colours and their RGB values (kept far apart from each other, from
#: the background and from the white gripper).
COLOURS: dict[str, raster.RGB] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 230),
    "yellow": (235, 205, 35),
}
#: Object shapes, see :func:`raster.shape_mask`.
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")

BACKGROUND_RGB: raster.RGB = (64, 64, 64)
GRIPPER_RGB: raster.RGB = (255, 255, 255)
GRIPPER_OUTLINE_RGB: raster.RGB = (0, 0, 0)

#: Half-size of every object (8 px across at 32 px, 56 px at 224 px).
OBJECT_HALF_SIZE = 0.25
#: Object centres stay in ``[-OBJECT_BOUND, OBJECT_BOUND]^2`` so that every
#: shape lies well inside the image.
OBJECT_BOUND = 0.65
#: Minimum distance between object centres: twice the radius of the circle
#: enclosing any shape, plus a gap, so objects never touch.
MIN_OBJECT_DISTANCE = 2 * math.sqrt(2) * OBJECT_HALF_SIZE + 0.05
#: Random gripper positions are drawn from ``[-GRIPPER_BOUND, GRIPPER_BOUND]^2``.
GRIPPER_BOUND = 0.9
#: Arm length of the gripper cross.
GRIPPER_HALF_SIZE = 0.15
#: The gripper has reached the target (and :func:`describe` says "at gripper")
#: within this distance of the target's centre.
REACH_TOLERANCE = 0.1
#: Default bound on the norm of one action (displacement per step).
MAX_STEP = 0.1
#: The workspace: gripper positions are clipped to ``[-1, 1]^2``.
WORKSPACE = (-1.0, 1.0)

# tan(22.5 deg): a direction component is named when it is at least this
# fraction of the other one, which splits the plane into eight 45-degree sectors.
_TAN_22_5 = math.tan(math.radians(22.5))

Point = tuple[float, float]


# --------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------


def _point(xy: Sequence[float] | np.ndarray) -> Point:
    x, y = (float(v) for v in np.asarray(xy, dtype=np.float64).reshape(2))
    return (x, y)


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One coloured shape at ``position`` (its centre, normalised coordinates)."""

    colour: str
    shape: str
    position: Point

    def __post_init__(self) -> None:
        if self.colour not in COLOURS:
            raise ValueError(f"unknown colour {self.colour!r}; expected one of {sorted(COLOURS)}")
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; expected one of {list(SHAPES)}")
        object.__setattr__(self, "position", _point(self.position))

    @property
    def name(self) -> str:
        """``"{colour} {shape}"``, e.g. ``"red circle"``."""
        return f"{self.colour} {self.shape}"


@dataclasses.dataclass(frozen=True)
class Scene:
    """Objects on the table, which one is the target, and where the gripper is.

    No two objects share both colour and shape, so the instruction naming the
    target is never ambiguous.
    """

    objects: tuple[SceneObject, ...]
    target_index: int
    gripper: Point

    def __post_init__(self) -> None:
        object.__setattr__(self, "objects", tuple(self.objects))
        object.__setattr__(self, "gripper", _point(self.gripper))
        if not self.objects:
            raise ValueError("a scene needs at least one object")
        if not 0 <= self.target_index < len(self.objects):
            raise ValueError(f"target_index {self.target_index} out of range for {len(self.objects)} objects")
        names = [o.name for o in self.objects]
        if len(set(names)) != len(names):
            raise ValueError(f"objects must differ in colour or shape, got {names}")

    @property
    def target(self) -> SceneObject:
        """The object the gripper should move to."""
        return self.objects[self.target_index]

    @property
    def instruction(self) -> str:
        """The task instruction for this scene, see :func:`instruction`."""
        return instruction(self)

    @property
    def state(self) -> np.ndarray:
        """The robot state: the gripper position as ``float32[2]``."""
        return np.asarray(self.gripper, dtype=np.float32)

    def with_gripper(self, xy: Sequence[float] | np.ndarray) -> Scene:
        """A copy of the scene with the gripper at ``xy``."""
        return dataclasses.replace(self, gripper=_point(xy))


# --------------------------------------------------------------------------
# Language
# --------------------------------------------------------------------------


def instruction(scene: Scene) -> str:
    """``"move to the {colour} {shape}"`` for the scene's target."""
    return f"move to the {scene.target.name}"


def relation(offset: Sequence[float] | np.ndarray, reach: float = REACH_TOLERANCE) -> str:
    """Where a point lies relative to the gripper, given ``offset = point - gripper``.

    Returns ``"at gripper"`` within ``reach``, otherwise one of eight 45-degree
    sectors: ``"above gripper"``, ``"upper right of gripper"``,
    ``"right of gripper"``, ``"lower right of gripper"``, ``"below gripper"``,
    ``"lower left of gripper"``, ``"left of gripper"``, ``"upper left of gripper"``
    (``y`` grows downwards, so a negative ``dy`` is "upper").
    """
    dx, dy = _point(offset)
    if math.hypot(dx, dy) <= reach:
        return "at gripper"
    horizontal = abs(dx) > _TAN_22_5 * abs(dy)
    vertical = abs(dy) > _TAN_22_5 * abs(dx)
    side = "left" if dx < 0 else "right"
    if horizontal and vertical:
        return f"{'upper' if dy < 0 else 'lower'} {side} of gripper"
    if vertical:
        return "above gripper" if dy < 0 else "below gripper"
    return f"{side} of gripper"


def describe(scene: Scene) -> str:
    """A short description of the target grounded in the image.

    ``"{colour} {shape} {relation}"``, e.g. ``"red circle upper left of gripper"``
    or ``"blue square at gripper"``; see :func:`relation` for the vocabulary.
    """
    offset = np.subtract(scene.target.position, scene.gripper)
    return f"{scene.target.name} {relation(offset)}"


def all_instructions() -> list[str]:
    """Every instruction the task can produce, in a fixed order."""
    return [f"move to the {c} {s}" for c in COLOURS for s in SHAPES]


RELATIONS: tuple[str, ...] = (
    "at gripper",
    "above gripper",
    "upper right of gripper",
    "right of gripper",
    "lower right of gripper",
    "below gripper",
    "lower left of gripper",
    "left of gripper",
    "upper left of gripper",
)


def all_descriptions() -> list[str]:
    """Every description :func:`describe` can produce, in a fixed order."""
    return [f"{c} {s} {r}" for c in COLOURS for s in SHAPES for r in RELATIONS]


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


def render(scene: Scene, size: int) -> np.ndarray:
    """Draw ``scene`` as a ``uint8[size, size, 3]`` RGB image.

    Plain grey background, the objects filled in their colours, and the gripper
    as a white cross with a black outline on top. Deterministic; shapes scale
    with ``size`` (an object is ``size / 4`` pixels across).
    """
    if int(size) != size or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}")
    size = int(size)
    canvas = np.empty((size, size, 3), dtype=np.uint8)
    canvas[:] = np.asarray(BACKGROUND_RGB, dtype=np.uint8)
    for obj in scene.objects:
        raster.paint(canvas, raster.shape_mask(obj.shape, obj.position, OBJECT_HALF_SIZE, size), COLOURS[obj.colour])
    cross = raster.cross_mask(scene.gripper, GRIPPER_HALF_SIZE, size)
    raster.paint(canvas, _dilate(cross), GRIPPER_OUTLINE_RGB)
    raster.paint(canvas, cross, GRIPPER_RGB)
    return canvas


def _dilate(mask: np.ndarray) -> np.ndarray:
    """Grow a boolean mask by one pixel in all eight directions (3x3 square)."""
    rows = mask.copy()
    rows[1:, :] |= mask[:-1, :]
    rows[:-1, :] |= mask[1:, :]
    grown = rows.copy()
    grown[:, 1:] |= rows[:, :-1]
    grown[:, :-1] |= rows[:, 1:]
    return grown


# --------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------


def _free_position(rng: np.random.Generator, others: Sequence[Point], max_tries: int = 1000) -> Point | None:
    """A random object centre at least ``MIN_OBJECT_DISTANCE`` from ``others``."""
    for _ in range(max_tries):
        p = rng.uniform(-OBJECT_BOUND, OBJECT_BOUND, size=2)
        if all(math.dist(p, o) >= MIN_OBJECT_DISTANCE for o in others):
            return _point(p)
    return None


def _gripper_position(rng: np.random.Generator, target: Point, min_distance: float) -> Point:
    """A random gripper position at least ``min_distance`` from ``target``."""
    for _ in range(1000):
        g = rng.uniform(-GRIPPER_BOUND, GRIPPER_BOUND, size=2)
        if math.dist(g, target) >= min_distance:
            return _point(g)
    raise RuntimeError(f"could not place the gripper {min_distance} away from {target}")


def sample_scene(
    rng: np.random.Generator,
    n_objects: int | None = None,
    min_gripper_distance: float = 0.3,
) -> Scene:
    """Draw a random scene.

    ``n_objects`` (1-3) defaults to a uniform draw. Objects get distinct
    (colour, shape) pairs and non-overlapping positions (rejection sampling),
    the target is chosen uniformly, and the gripper is placed uniformly in
    ``[-GRIPPER_BOUND, GRIPPER_BOUND]^2`` at least ``min_gripper_distance`` from
    the target. The result depends only on the state of ``rng``.
    """
    n = int(rng.integers(1, 4)) if n_objects is None else int(n_objects)
    if not 1 <= n <= 3:
        raise ValueError(f"n_objects must be 1, 2 or 3, got {n}")
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    chosen = rng.choice(len(pairs), size=n, replace=False)
    while True:
        positions: list[Point] = []
        for _ in range(n):
            p = _free_position(rng, positions)
            if p is None:
                break
            positions.append(p)
        if len(positions) == n:
            break
    objects = tuple(SceneObject(*pairs[i], positions[k]) for k, i in enumerate(chosen))
    target_index = int(rng.integers(n))
    gripper = _gripper_position(rng, objects[target_index].position, min_gripper_distance)
    return Scene(objects, target_index, gripper)


# --------------------------------------------------------------------------
# Closed loop
# --------------------------------------------------------------------------


class Simulator:
    """A minimal closed-loop simulator: actions move the gripper, nothing else moves.

    For a demo camera, call :meth:`retarget` now and then: it moves the target
    object somewhere else so that a policy has to follow it (the instruction
    stays valid), or :meth:`reset` for a whole new scene.
    """

    def __init__(self, scene: Scene) -> None:
        self.scene = scene

    @property
    def state(self) -> np.ndarray:
        """The gripper position as ``float32[2]``."""
        return self.scene.state

    @property
    def instruction(self) -> str:
        return self.scene.instruction

    def step(self, actions: Sequence[float] | Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
        """Apply one action ``(dx, dy)`` or a chunk ``(n, 2)`` of them in order.

        After each action the gripper is clipped to the workspace ``[-1, 1]^2``.
        Returns the new state.
        """
        chunk = np.asarray(actions, dtype=np.float64).reshape(-1, 2)
        position = np.asarray(self.scene.gripper, dtype=np.float64)
        for action in chunk:
            if not np.all(np.isfinite(action)):
                raise ValueError(f"non-finite action {action}")
            position = np.clip(position + action, *WORKSPACE)
        self.scene = self.scene.with_gripper(position)
        return self.state

    def observe(self, size: int) -> np.ndarray:
        """Render the current scene, see :func:`render`."""
        return render(self.scene, size)

    def reached(self, tol: float = REACH_TOLERANCE) -> bool:
        """Whether the gripper is within ``tol`` of the target's centre."""
        return math.dist(self.scene.gripper, self.scene.target.position) <= tol

    def retarget(self, rng: np.random.Generator, min_gripper_distance: float = 0.3) -> Scene:
        """Move the target object to a new free position away from the gripper.

        The other objects and the gripper stay put, so the instruction is
        unchanged but the policy has to head somewhere else. Returns the new scene.
        """
        others = [o.position for i, o in enumerate(self.scene.objects) if i != self.scene.target_index]
        for _ in range(1000):
            p = _free_position(rng, others)
            if p is not None and math.dist(p, self.scene.gripper) >= min_gripper_distance:
                break
        else:  # pragma: no cover - the free area is always large enough
            raise RuntimeError("could not find a free position for the target")
        objects = list(self.scene.objects)
        objects[self.scene.target_index] = dataclasses.replace(self.scene.target, position=p)
        self.scene = dataclasses.replace(self.scene, objects=tuple(objects))
        return self.scene

    def reset(self, rng: np.random.Generator, keep_gripper: bool = True) -> Scene:
        """Replace the scene with a new random one (keeping the gripper by default)."""
        scene = sample_scene(rng)
        if keep_gripper:
            scene = scene.with_gripper(self.scene.gripper)
        self.scene = scene
        return self.scene
