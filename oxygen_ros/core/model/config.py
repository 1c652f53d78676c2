"""Model sizes: the published π0.5 preset and the embedded ``tiny`` default.

One frozen dataclass per part, checked in ``__post_init__``. Nothing here
imports torch, so configs can be built and validated anywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

DTYPES = ("float32", "bfloat16", "float64")


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP vision tower; each image becomes (image_size / patch_size) ** 2 tokens."""

    hidden: int
    depth: int
    heads: int
    mlp: int
    image_size: int
    patch_size: int

    def __post_init__(self) -> None:
        _positive(self, "hidden", "depth", "heads", "mlp", "image_size", "patch_size")
        if self.image_size % self.patch_size:
            raise ValueError(f"vision.image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.hidden % self.heads:
            raise ValueError(f"vision.hidden {self.hidden} is not divisible by heads {self.heads}")

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma decoder stack (the VLM or the action expert)."""

    width: int
    depth: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _positive(self, "width", "depth", "mlp", "heads", "kv_heads", "head_dim")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")


@dataclass(frozen=True)
class ModelConfig:
    """The whole Mixture-of-Transformers VLA.

    The expert shares depth and head layout with the VLM (each layer's joint
    attention needs the same number of heads and head size) but has its own
    width and MLP.
    """

    name: str
    vision: VisionConfig
    vlm: GemmaConfig
    expert: GemmaConfig
    vocab_size: int
    max_token_len: int = 200
    max_cameras: int = 3
    action_dim: int = 32
    action_horizon: int = 50
    denoise_steps: int = 10
    rope_base: float = 10_000.0
    rms_eps: float = 1e-6
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _positive(self, "vocab_size", "max_token_len", "max_cameras", "action_dim", "action_horizon", "denoise_steps")
        v, e = self.vlm, self.expert
        if (v.depth, v.heads, v.kv_heads, v.head_dim) != (e.depth, e.heads, e.kv_heads, e.head_dim):
            raise ValueError(
                "expert must share depth/heads/kv_heads/head_dim with the VLM: "
                f"vlm={(v.depth, v.heads, v.kv_heads, v.head_dim)} expert={(e.depth, e.heads, e.kv_heads, e.head_dim)}"
            )

    @property
    def image_tokens(self) -> int:
        """Tokens of all cameras together."""
        return self.max_cameras * self.vision.tokens_per_image

    @property
    def prefix_len(self) -> int:
        """Padded prefix length: every camera plus the tokenizer max length."""
        return self.image_tokens + self.max_token_len

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}")


PI05 = ModelConfig(
    name="pi05",
    vision=VisionConfig(hidden=1152, depth=27, heads=16, mlp=4304, image_size=224, patch_size=14),
    vlm=GemmaConfig(width=2048, depth=18, mlp=16_384, heads=8, kv_heads=1, head_dim=256),
    expert=GemmaConfig(width=1024, depth=18, mlp=4096, heads=8, kv_heads=1, head_dim=256),
    vocab_size=257_152,
    max_token_len=200,
    max_cameras=3,
    action_dim=32,
    action_horizon=50,
    denoise_steps=10,
)

# Same structure, sized so that a whole frame runs in a few milliseconds on
# one CPU core. The vocabulary matches the shipped SentencePiece model. The
# expert is as wide as the VLM: at width 32 it could not learn to find the
# named object among several (the shipped default model is trained on this
# preset, see oxygen_ros/data/default_model/card.md); depth is what costs
# time (every denoising step runs every layer), width hardly does.
TINY = ModelConfig(
    name="tiny",
    vision=VisionConfig(hidden=64, depth=2, heads=4, mlp=128, image_size=32, patch_size=8),
    vlm=GemmaConfig(width=64, depth=2, mlp=128, heads=4, kv_heads=1, head_dim=16),
    expert=GemmaConfig(width=64, depth=2, mlp=128, heads=4, kv_heads=1, head_dim=16),
    vocab_size=512,
    max_token_len=32,
    max_cameras=3,
    action_dim=32,
    action_horizon=10,
    denoise_steps=10,
)

PRESETS: dict[str, ModelConfig] = {"pi05": PI05, "tiny": TINY}


def preset(name: str) -> ModelConfig:
    """Look up a preset by name, with an error listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
