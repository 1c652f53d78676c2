"""The engine's configuration: the setting, the sizes of the language task and the pool, the seed."""

from __future__ import annotations

from dataclasses import dataclass

from .model.compile_setup import COMPILE_CHOICES
from .model.config import ModelConfig
from .scheduler import SETTINGS


@dataclass(frozen=True)
class EngineConfig:
    setting: str = "oxygen"
    max_decode: int = 30  # N: tokens per language request
    steps_per_frame: int = 5  # k: decode steps per frame (oxygen)
    denoise_steps: int | None = None  # S; None: the model's own (its config's, i.e. the checkpoint's)
    max_active: int = 8  # language requests decoding at once
    queue_limit: int = 16  # requests waiting for a slot; past it they are rejected
    max_observations_per_frame: int = 4  # scratch slots for a frame's action prefixes
    max_question_tokens: int = 32
    language_every_n_frames: int = 1  # 0: only on demand (questions)
    seed: int = 0  # action noise seed
    camera_names: tuple[str, ...] | None = None
    #: cameras an observation carries at most (None: len(camera_names), else the model's camera slots);
    #: the compiled prefill runs over this many camera slots
    max_cameras: int | None = None
    compile: str = "auto"  # "on" | "off" | "auto" (CUDA: on, CPU: off): see core/model/compile_setup.py
    #: keep the memory frames free in the process for the next frame (no page faults; see core/heap.py)
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_CHOICES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {self.compile!r}")
        if self.setting not in SETTINGS:
            raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, got {self.setting!r}")
        if self.denoise_steps is not None and self.denoise_steps < 1:
            raise ValueError(f"denoise_steps must be >= 1 (or None: the model's), got {self.denoise_steps}")
        if self.max_cameras is not None and self.max_cameras < 1:
            raise ValueError(f"max_cameras must be >= 1 (or None: the model's camera slots), got {self.max_cameras}")
        if self.max_cameras is not None and self.camera_names and len(self.camera_names) > self.max_cameras:
            raise ValueError(f"{len(self.camera_names)} camera_names but max_cameras is {self.max_cameras}")
        for name in ("max_decode", "max_active", "max_observations_per_frame", "max_question_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps_per_frame", "queue_limit", "language_every_n_frames"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.steps_per_frame > self.max_decode:
            raise ValueError(f"steps_per_frame (k={self.steps_per_frame}) must not exceed max_decode "
                             f"(N={self.max_decode})")


def slot_len(config: EngineConfig, model: ModelConfig) -> int:
    """Positions one pool slot holds: the longest prefix (every camera the engine serves, and the
    longest prompt), a question's tokens and a full answer. A prefix is stored compacted, so a
    camera slot of the model that the robot never fills takes no place in the pool."""
    prefix = served_cameras(config, model.max_cameras) * model.vision.tokens_per_image + model.max_token_len
    return prefix + config.max_question_tokens + config.max_decode


def served_cameras(config: EngineConfig, model_slots: int) -> int:
    """Cameras an observation may carry: ``max_cameras``, else the count of ``camera_names``,
    else the model's camera slots; more than the model's slots is refused."""
    cameras = config.max_cameras or (len(config.camera_names) if config.camera_names else None) or model_slots
    if cameras > model_slots:
        raise ValueError(f"max_cameras {cameras} exceeds the model's {model_slots} camera slots")
    return cameras
