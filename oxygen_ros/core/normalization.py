"""State and action normalisation as π0.5 applies it (openpi and LeRobot conventions).

π0.5 sees the robot state normalised (by default with the 1st/99th
percentiles into [-1, 1]) and discretised into 256 bins in its prompt, and it
predicts actions in the same normalised space, padded to the model's 32
action dimensions. :class:`Normalizer` does both conversions:

* :meth:`Normalizer.normalize_state`: robot units -> normalised, with the
  statistics sliced to the state's length (openpi's ``Normalize``). Values
  are not clipped, here nor in the prompt's discretisation, as in openpi and
  LeRobot (``oxygen_ros.core.tokenizer.discretize_state``: below -1 is bin
  -1, from ``1 - 2/256`` up bin 255). π0.5 tokenizes the
  state at the robot's own dimension; :meth:`Normalizer.pad_state` zero-pads
  to the model's 32 dims where a padded vector is wanted (openpi's
  ``PadStatesAndActions``).
* :meth:`Normalizer.unnormalize_actions`: [H, 32] model output -> [H, action_dim]
  robot units, the padding dropped (``action_dim`` = length of the action
  statistics).

Formulas (``convention="openpi"``, ``openpi/transforms.py``)::

    quantile:  n = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1     x = (n + 1) / 2 * (q99 - q01 + 1e-6) + q01
    zscore:    n = (x - mean) / (std + 1e-6)                  x = n * (std + 1e-6) + mean

``convention="lerobot"`` (``lerobot/processor/normalize_processor.py``, eps 1e-8)::

    quantile:  n = 2 (x - q01) / d - 1,  d = q99 - q01 (eps where d == 0)   x = (n + 1) d / 2 + q01
    zscore:    n = (x - mean) / (std + eps)                              x = n * std + mean

Stats files read by :func:`load_norm_stats`: openpi's ``norm_stats.json``
(``{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}``,
``openpi/shared/normalize.py``) and LeRobot's normalizer processor state
(``policy_preprocessor_step_*_normalizer_processor.safetensors`` with flat
keys ``observation.state.{mean,std,q01,q99,...}`` and ``action.{...}``,
its modes and eps from ``policy_preprocessor.json``).
"""

from __future__ import annotations

import json
import numbers
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MODES = ("quantile", "zscore", "identity")
CONVENTIONS = ("openpi", "lerobot")
OPENPI_EPS = 1e-6
LEROBOT_EPS = 1e-8
MODEL_ACTION_DIM = 32

#: LeRobot's NormalizationMode values -> our modes.
LEROBOT_MODES = {"QUANTILES": "quantile", "MEAN_STD": "zscore", "IDENTITY": "identity"}


class NormStatsError(ValueError):
    """A statistics file is missing, malformed or does not fit the mode."""


@dataclass(frozen=True)
class Stats:
    """Per-dimension statistics of one vector (state or actions)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "stats") -> "Stats":
        if not isinstance(data, Mapping):
            raise NormStatsError(f"{where}: expected a mapping of mean, std (q01, q99), got {type(data).__name__}")

        def vec(name: str, required: bool) -> np.ndarray | None:
            value = data.get(name)
            if value is None:
                if required:
                    raise NormStatsError(f"{where}: missing '{name}'")
                return None
            try:
                arr = np.asarray(value, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise NormStatsError(f"{where}.{name}: expected a list of numbers, got {value!r:.80}") from None
            if arr.size == 0:
                raise NormStatsError(f"{where}.{name} is empty")
            if not np.all(np.isfinite(arr)):
                raise NormStatsError(f"{where}.{name} contains NaN or infinite values")
            return arr

        stats = cls(vec("mean", True), vec("std", True), vec("q01", False), vec("q99", False))
        dims = {n: len(v) for n, v in stats.vectors().items()}
        if len(set(dims.values())) != 1:
            raise NormStatsError(f"{where}: statistics of different lengths {dims}")
        if (stats.q01 is None) != (stats.q99 is None):
            raise NormStatsError(f"{where}: needs both q01 and q99 or neither")
        return stats

    def vectors(self) -> dict[str, np.ndarray]:
        return {n: v for n, v in (("mean", self.mean), ("std", self.std), ("q01", self.q01), ("q99", self.q99))
                if v is not None}

    @property
    def dim(self) -> int:
        return len(self.mean)

    def to_dict(self) -> dict[str, list[float] | None]:
        return {n: (None if v is None else v.tolist()) for n, v in
                (("mean", self.mean), ("std", self.std), ("q01", self.q01), ("q99", self.q99))}


class Normalizer:
    """Normalises robot states and unnormalises model actions (see the module doc).

    ``state_stats`` may be ``None`` for a policy without state input
    (:meth:`normalize_state` then raises). ``mode`` applies to both vectors
    unless ``action_mode`` is given.
    """

    def __init__(
        self,
        state_stats: Stats | Mapping[str, Any] | None,
        action_stats: Stats | Mapping[str, Any],
        mode: str = "quantile",
        *,
        action_mode: str | None = None,
        convention: str = "openpi",
        eps: float | None = None,
        model_action_dim: int = MODEL_ACTION_DIM,
    ) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        action_mode = action_mode or mode
        for m in (mode, action_mode):
            if m not in MODES:
                raise ValueError(f"mode must be one of {MODES}, got {m!r}")
        self.state_stats = _as_stats(state_stats, "state") if state_stats is not None else None
        self.action_stats = _as_stats(action_stats, "actions")
        self.mode, self.action_mode, self.convention = mode, action_mode, convention
        eps = eps if eps is not None else (OPENPI_EPS if convention == "openpi" else LEROBOT_EPS)
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        self.eps = float(eps)
        self.model_action_dim = model_action_dim
        self.source: str | None = None  # the file read (load_norm_stats), for the logs
        for name, stats, m in (("state", self.state_stats, mode), ("actions", self.action_stats, action_mode)):
            if stats is not None and m == "quantile" and stats.q01 is None:
                raise NormStatsError(f"{name} statistics have no q01/q99, which quantile normalisation needs")
        if self.action_dim > model_action_dim:
            raise NormStatsError(f"action statistics have {self.action_dim} dims, more than the model's "
                                 f"{model_action_dim}")

    def __repr__(self) -> str:
        return (f"Normalizer(state_dim={self.state_dim}, action_dim={self.action_dim}, mode={self.mode!r}, "
                f"action_mode={self.action_mode!r}, convention={self.convention!r})")

    @property
    def action_dim(self) -> int:
        """The robot's action dimension (the model's output beyond it is padding)."""
        return self.action_stats.dim

    @property
    def state_dim(self) -> int | None:
        return None if self.state_stats is None else self.state_stats.dim

    # ------------------------------------------------------------------ state
    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Robot units [..., d] -> normalised [..., d] (float64), d <= len(state stats)."""
        if self.state_stats is None:
            raise NormStatsError("these statistics have no state entry; cannot normalise a state")
        x = _finite(state, "state")
        d = x.shape[-1]
        if d > self.state_dim:
            raise NormStatsError(f"state has {d} values but the statistics cover only {self.state_dim}")
        return self._forward(x, self.state_stats, self.mode, d)

    def pad_state(self, state: np.ndarray, dim: int | None = None) -> np.ndarray:
        """Zero-pad [..., d] to [..., dim] (default: the model's action dim), as openpi's PadStatesAndActions."""
        return _pad(np.asarray(state, dtype=np.float64), dim or self.model_action_dim)

    # ------------------------------------------------------------------ actions
    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Model actions [..., H, D >= action_dim] -> robot units [..., H, action_dim] (float64)."""
        a = _finite(actions, "actions")
        if a.shape[-1] < self.action_dim:
            raise NormStatsError(f"actions have {a.shape[-1]} dims, fewer than the robot's {self.action_dim}")
        a = a[..., : self.action_dim]
        s = self.action_stats
        if self.action_mode == "identity":
            return a.copy()
        if self.action_mode == "quantile":
            span = self._span(s.q01, s.q99)
            return (a + 1.0) / 2.0 * span + s.q01
        scale = s.std + self.eps if self.convention == "openpi" else s.std
        return a * scale + s.mean

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot units [..., action_dim] -> normalised [..., model_action_dim] (zero padded), for training data."""
        a = _finite(actions, "actions")
        if a.shape[-1] != self.action_dim:
            raise NormStatsError(f"actions have {a.shape[-1]} dims, the statistics {self.action_dim}")
        return _pad(self._forward(a, self.action_stats, self.action_mode, self.action_dim), self.model_action_dim)

    # ------------------------------------------------------------------ io
    def to_openpi_dict(self) -> dict[str, Any]:
        """The statistics in openpi's ``norm_stats.json`` form (plus our mode/convention keys)."""
        out: dict[str, Any] = {"norm_stats": {"actions": self.action_stats.to_dict()}}
        if self.state_stats is not None:
            out["norm_stats"]["state"] = self.state_stats.to_dict()
        out["oxygen_ros"] = {"mode": self.mode, "action_mode": self.action_mode,
                             "convention": self.convention, "eps": self.eps}
        return out

    def save(self, path: str | os.PathLike[str]) -> pathlib.Path:
        path = pathlib.Path(path)
        path.write_text(json.dumps(self.to_openpi_dict(), indent=2) + "\n")
        return path

    # ------------------------------------------------------------------ helpers
    def _span(self, q01: np.ndarray, q99: np.ndarray) -> np.ndarray:
        if self.convention == "openpi":
            return q99 - q01 + self.eps
        span = q99 - q01
        return np.where(span == 0, self.eps, span)

    def _forward(self, x: np.ndarray, s: Stats, mode: str, d: int) -> np.ndarray:
        if mode == "identity":
            return x.copy()
        if mode == "quantile":
            q01, q99 = s.q01[:d], s.q99[:d]
            return (x - q01) / self._span(q01, q99) * 2.0 - 1.0
        return (x - s.mean[:d]) / (s.std[:d] + self.eps)


def _as_stats(value: Stats | Mapping[str, Any], where: str) -> Stats:
    return value if isinstance(value, Stats) else Stats.from_mapping(value, where)


def _finite(x: Any, what: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        raise NormStatsError(f"{what} must be a vector or array, got a scalar")
    if not np.all(np.isfinite(arr)):
        raise NormStatsError(f"{what} contains NaN or infinite values")
    return arr


def _pad(x: np.ndarray, dim: int) -> np.ndarray:
    if x.shape[-1] > dim:
        raise NormStatsError(f"vector of {x.shape[-1]} values does not fit {dim} dims")
    out = np.zeros((*x.shape[:-1], dim), dtype=np.float64)
    out[..., : x.shape[-1]] = x
    return out


# ---------------------------------------------------------------------------- loading
def load_norm_stats(path: str | os.PathLike[str], *, mode: str | None = None) -> Normalizer:
    """Read statistics from any of:

    * an openpi ``norm_stats.json`` (or a directory holding it, directly or in
      ``assets/<asset_id>/``, e.g. ``assets/droid/`` or ``assets/physical-intelligence/libero/``); mode ``quantile`` (π0.5) unless the file or ``mode`` says otherwise;
    * a LeRobot policy directory (``policy_preprocessor.json`` and its
      ``*_normalizer_processor.safetensors``), or that safetensors file itself;
      modes and eps from the processor config (``mode`` overrides).
    """
    p = pathlib.Path(path)
    if not p.exists():
        raise NormStatsError(f"statistics not found: {p}")
    if p.is_dir():
        return _load_from_dir(p, mode)
    if p.suffix == ".json":
        return _load_openpi_json(p, mode)
    if p.suffix == ".safetensors":
        return _load_lerobot_stats(p, mode, config=_lerobot_step_config(p.parent, p.name))
    raise NormStatsError(f"{p}: unknown statistics file type (expected norm_stats.json or a LeRobot "
                         "normalizer .safetensors); pickles are never read")


def _load_from_dir(d: pathlib.Path, mode: str | None) -> Normalizer:
    direct = d / "norm_stats.json"
    if direct.is_file():
        return _load_openpi_json(direct, mode)
    lerobot = (sorted(d.glob("policy_preprocessor*_normalizer_processor.safetensors"))
               or sorted(d.glob("*_normalizer_processor.safetensors"))
               or sorted(d.glob("*_unnormalizer_processor.safetensors")))
    if lerobot:
        return _load_lerobot_stats(lerobot[0], mode, config=_lerobot_step_config(d, lerobot[0].name))
    nested = sorted(d.glob("assets/**/norm_stats.json"))  # assets/<asset_id>/, the id may hold a "/"
    if len(nested) == 1:
        return _load_openpi_json(nested[0], mode)
    if len(nested) > 1:
        raise NormStatsError(f"{d} holds statistics for several robots {[str(n) for n in nested]}; "
                             "name the one to use (norm_stats_path / --norm-stats)")
    raise NormStatsError(f"no norm_stats.json or LeRobot normalizer statistics in {d}")


def _load_openpi_json(p: pathlib.Path, mode: str | None) -> Normalizer:
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise NormStatsError(f"{p} is not valid JSON: {exc}") from exc
    normalizer = openpi_normalizer(data, str(p), mode)
    normalizer.source = str(p)
    return normalizer


def openpi_normalizer(data: Any, where: str = "norm_stats.json", mode: str | None = None) -> Normalizer:
    """The Normalizer of an openpi ``norm_stats.json``'s content (with this package's optional
    ``oxygen_ros`` entry: mode, action_mode, convention, eps), or NormStatsError naming the fault."""
    if not isinstance(data, dict) or not isinstance(data.get("norm_stats"), dict):
        raise NormStatsError(f"{where}: expected openpi's form {{\"norm_stats\": {{\"state\": {{...}}, "
                             "\"actions\": {...}}}")
    stats = data["norm_stats"]
    if "actions" not in stats:
        raise NormStatsError(f"{where}: norm_stats has no 'actions' entry (keys: {sorted(stats)})")
    ours = data.get("oxygen_ros", {}) if isinstance(data.get("oxygen_ros"), dict) else {}
    state = Stats.from_mapping(stats["state"], f"{where}: norm_stats.state") if "state" in stats else None
    actions = Stats.from_mapping(stats["actions"], f"{where}: norm_stats.actions")
    try:
        return Normalizer(state, actions, mode or ours.get("mode", "quantile"),
                          action_mode=None if mode else ours.get("action_mode"),
                          convention=ours.get("convention", "openpi"), eps=ours.get("eps"))
    except ValueError as exc:  # what the Normalizer refuses (the oxygen_ros entry's mode, eps, ...), with the file
        raise NormStatsError(f"{where}: {exc}") from None


def _lerobot_step_config(d: pathlib.Path, state_file: str) -> dict[str, Any]:
    """The config of the processor step whose state lives in ``state_file`` (empty if not found)."""
    for cfg in sorted(d.glob("*.json")):
        try:
            data = json.loads(cfg.read_text())
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        for step in data.get("steps", []) or []:
            if isinstance(step, dict) and step.get("state_file") == state_file:
                return step.get("config", {}) or {}
    return {}


def _load_lerobot_stats(p: pathlib.Path, mode: str | None, config: Mapping[str, Any]) -> Normalizer:
    from safetensors.numpy import load_file  # numpy: no torch needed to read stats

    try:
        flat = load_file(str(p))
    except Exception as exc:  # safetensors raises its own error types
        raise NormStatsError(f"{p}: not a safetensors statistics file ({exc})") from exc
    grouped: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition(".")
        grouped.setdefault(feature, {})[stat] = value
    if "action" not in grouped:
        raise NormStatsError(f"{p}: no 'action.*' statistics (features: {sorted(grouped)})")
    norm_map = config.get("norm_map", {}) or {}
    state_mode = mode or LEROBOT_MODES.get(norm_map.get("STATE", "QUANTILES"))
    action_mode = mode or LEROBOT_MODES.get(norm_map.get("ACTION", "QUANTILES"))
    if state_mode is None or action_mode is None:
        raise NormStatsError(f"{p}: unsupported LeRobot normalisation modes {norm_map} "
                             f"(supported: {sorted(LEROBOT_MODES)})")
    state = grouped.get("observation.state")
    normalizer = Normalizer(
        None if state is None else Stats.from_mapping(state, f"{p}: observation.state"),
        Stats.from_mapping(grouped["action"], f"{p}: action"),
        state_mode, action_mode=action_mode, convention="lerobot", eps=config.get("eps", LEROBOT_EPS),
    )
    normalizer.source = str(p)
    return normalizer


#: Why a state is refused with statistics that have no state entry (a LeRobot checkpoint with
#: only its postprocessor's files, an openpi norm_stats.json without "state"): the prompt would
#: carry the state in the robot's units, which the model never saw.
STATE_NEEDS_STATISTICS = (
    "π0.5 takes its state normalised, and in the robot's units it would make every action wrong. Give "
    "statistics with a state (norm_stats_path: openpi's norm_stats.json with a 'state' entry, or LeRobot's "
    "policy_preprocessor_*_normalizer_processor.safetensors), or run without a state (the camera node's "
    "state_topic empty)")
STATE_WITHOUT_STATISTICS = "given, but the checkpoint's normalisation statistics have no state entry: " + \
    STATE_NEEDS_STATISTICS


def statistics_without_state(normalizer: "Normalizer | None") -> bool:
    """Statistics that unnormalise actions but cannot normalise a state (see
    :data:`STATE_WITHOUT_STATISTICS`); False without statistics at all (random weights)."""
    return normalizer is not None and normalizer.state_stats is None


__all__ = ["Normalizer", "Stats", "NormStatsError", "load_norm_stats", "MODEL_ACTION_DIM",
           "STATE_NEEDS_STATISTICS", "STATE_WITHOUT_STATISTICS", "statistics_without_state"]
