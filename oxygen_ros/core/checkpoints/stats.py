"""Finding the normalisation statistics that belong to a checkpoint directory."""

from __future__ import annotations

import os
import pathlib

from ..normalization import Normalizer, NormStatsError, load_norm_stats
from .errors import CheckpointError


def find_norm_stats(directory: pathlib.Path, explicit: str | os.PathLike[str] | None, *, required: bool
                    ) -> Normalizer | None:
    """``explicit`` if given, else what the checkpoint directory holds: openpi's
    ``norm_stats.json`` (directly or in ``assets/<robot>/``) or LeRobot's
    normalizer processor files. ``None`` when absent and not ``required``."""
    if explicit is not None:
        return read_norm_stats(explicit)
    present = ((directory / "norm_stats.json").is_file()
               or any(directory.glob("*normalizer_processor.safetensors"))
               or any(directory.glob("assets/**/norm_stats.json")))
    if present:
        return _read(directory)
    if required:
        raise CheckpointError(
            f"no normalisation statistics for {directory}: a real π0.5 checkpoint needs the state/action "
            "statistics of the robot it was trained for. Put openpi's norm_stats.json in the checkpoint "
            "directory (or its assets/<robot>/ folder), keep LeRobot's policy_preprocessor*.json/.safetensors "
            "files next to model.safetensors, or pass norm_stats_path (node parameter `norm_stats_path`, "
            "command option `--norm-stats`)."
        )
    return None


def read_norm_stats(explicit: str | os.PathLike[str]) -> Normalizer:
    """The statistics file (or folder) given as ``norm_stats_path`` / ``--norm-stats``."""
    path = pathlib.Path(explicit)
    if not path.exists():
        raise CheckpointError(f"norm_stats_path {path} does not exist", parameter="norm_stats_path")
    return _read(path, "norm_stats_path")


def _read(path: pathlib.Path, parameter: str | None = None) -> Normalizer:
    try:
        return load_norm_stats(path)
    except NormStatsError as exc:
        raise CheckpointError(f"unusable normalisation statistics ({exc}); fix the file or point "
                              "norm_stats_path / --norm-stats at the right one", parameter=parameter) from exc
