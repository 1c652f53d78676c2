"""What covers each image patch (which shape; the target or not): training-only targets for the image tokens.

:func:`shape_coverage` gives, for every ``patch_size`` x ``patch_size`` patch of a
scene rendered at ``image_size``, the fraction of its pixels that each shape
covers (column ``1 + SHAPES.index(shape)``) and the fraction no object covers
(column 0); :func:`target_coverage` the fraction the target covers. Rows are in
the order the vision tower makes its patch tokens (row-major, top-left first).
The gripper drawn on top is ignored: the target is the shape underneath it.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.core.sim import raster
from oxygen_ros.core.sim.scene import OBJECT_HALF_SIZE, SHAPES, Scene, SceneObject

#: Columns of :func:`shape_coverage`: no object, then one per shape.
CLASSES: tuple[str, ...] = ("none",) + SHAPES


def shape_coverage(scene: Scene, image_size: int, patch_size: int) -> np.ndarray:
    """``float32[(image_size // patch_size) ** 2, len(CLASSES)]``; each row sums to 1."""
    cover = np.zeros(((image_size // patch_size) ** 2, len(CLASSES)), dtype=np.float64)
    for obj in scene.objects:
        cover[:, 1 + SHAPES.index(obj.shape)] += _per_patch(obj, image_size, patch_size)
    cover[:, 0] = 1.0 - cover[:, 1:].sum(1)  # objects never overlap, so this stays in [0, 1]
    return cover.astype(np.float32)


def target_coverage(scene: Scene, image_size: int, patch_size: int) -> np.ndarray:
    """``float32[(image_size // patch_size) ** 2, 2]``: per patch, the fraction the target does not
    cover (column 0) and does (column 1)."""
    on = _per_patch(scene.target, image_size, patch_size)
    return np.stack([1.0 - on, on], 1).astype(np.float32)


def _per_patch(obj: SceneObject, image_size: int, patch_size: int) -> np.ndarray:
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    grid = image_size // patch_size
    mask = raster.shape_mask(obj.shape, obj.position, OBJECT_HALF_SIZE, image_size)
    return mask.reshape(grid, patch_size, grid, patch_size).mean(axis=(1, 3)).reshape(-1)
