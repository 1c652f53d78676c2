"""Pixel-level drawing primitives for the synthetic task (numpy only).

Everything here works in *normalised* coordinates: the image covers
``[-1, 1] x [-1, 1]`` with ``x`` growing to the right and ``y`` growing
downwards (row order), whatever its size in pixels. A pixel is painted when its
centre falls inside the shape, so drawing is exact, deterministic and has no
anti-aliasing.

The functions know nothing about scenes; :mod:`oxygen_ros.core.sim.scene`
composes them.
"""

from __future__ import annotations

import numpy as np

RGB = tuple[int, int, int]

#: Half-side of a square relative to the shape's half-size, chosen so that a
#: square, a circle and a triangle of the same half-size look about as large.
SQUARE_SCALE = 0.85


def pixel_centres(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised coordinates of the pixel centres of a ``size`` x ``size`` image.

    Returns ``(x, y)``, each of shape ``(1, size)`` and ``(size, 1)`` so that they
    broadcast to the full grid.
    """
    c = (np.arange(size, dtype=np.float64) + 0.5) / size * 2.0 - 1.0
    return c[None, :], c[:, None]


def shape_mask(shape: str, centre: tuple[float, float], half_size: float, size: int) -> np.ndarray:
    """Boolean ``(size, size)`` mask of the pixels covered by ``shape``.

    ``shape`` is ``"circle"`` (radius ``half_size``), ``"square"`` (axis-aligned,
    half-side ``SQUARE_SCALE * half_size``) or ``"triangle"`` (isosceles, apex up,
    apex at ``half_size`` above the centre, base ``half_size`` below it and
    ``2 * half_size`` wide).
    """
    x, y = pixel_centres(size)
    dx, dy = x - centre[0], y - centre[1]
    if shape == "circle":
        return dx * dx + dy * dy <= half_size * half_size
    if shape == "square":
        h = SQUARE_SCALE * half_size
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "triangle":
        # Distance below the apex, from 0 (apex) to 2 * half_size (base); the
        # half-width grows linearly from 0 to half_size along it.
        depth = dy + half_size
        return (depth >= 0) & (depth <= 2 * half_size) & (np.abs(dx) <= depth / 2)
    raise ValueError(f"unknown shape {shape!r}")


def cross_mask(centre: tuple[float, float], half_size: float, size: int) -> np.ndarray:
    """Boolean mask of a ``+`` cross with arms ``half_size`` long.

    The arm thickness is a fifth of the arm length but never below one pixel, so
    the cross stays visible at 32 px.
    """
    x, y = pixel_centres(size)
    dx, dy = np.abs(x - centre[0]), np.abs(y - centre[1])
    pixel = 2.0 / size
    half_width = max(half_size / 5.0, pixel / 2.0)
    horizontal = (dx <= half_size) & (dy <= half_width)
    vertical = (dy <= half_size) & (dx <= half_width)
    return horizontal | vertical


def paint(canvas: np.ndarray, mask: np.ndarray, rgb: RGB) -> None:
    """Set the pixels of ``canvas`` (``(H, W, 3)`` uint8) selected by ``mask`` to ``rgb``."""
    canvas[mask] = np.asarray(rgb, dtype=np.uint8)
