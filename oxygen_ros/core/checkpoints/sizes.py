"""Model sizes of a foreign checkpoint: from its config where it has one, else from tensor shapes.

Inference works on *our* key names (after the layout's key map), so it is the
same for every layout:

* vision: ``hidden`` and ``patch_size`` from the patch embedding
  ``[hidden, 3, p, p]``; ``image_size = sqrt(rows of the position embedding) * p``;
  ``depth`` = number of encoder layers present; ``mlp`` = rows of ``fc1``;
  ``heads = hidden / 72`` (SigLIP So400m's head size; ``/ 64`` for hidden
  sizes that are not multiples of 72, as SigLIP base/large) - the square q/k/v
  projections do not encode the head count, so this is a convention.
* each Gemma stack: ``width`` = columns of ``q_proj``; ``depth`` = number of
  layers present; ``mlp`` = rows of ``gate_proj``; ``head_dim = 256`` (every
  Gemma variant π0.5 uses) when the rows of ``k_proj`` are a multiple of 256,
  otherwise multi-query attention is assumed (``head_dim`` = rows of
  ``k_proj``, one key/value head); ``heads`` = rows of ``q_proj / head_dim``,
  ``kv_heads`` = rows of ``k_proj / head_dim``.
* ``vocab_size`` = rows of the token embedding (or of the tied LM head);
  ``action_dim`` = columns of ``action_in_proj``.
* not in any tensor: ``action_horizon`` (default 50), ``max_token_len``
  (200), ``denoise_steps`` (10), ``max_cameras`` (3) - π0.5's defaults.

A config overrides what it names: openpi's converter writes ``config.json``
with ``paligemma_variant``, ``action_expert_variant``, ``action_dim``,
``action_horizon``; LeRobot's ``config.json`` (``"type": "pi05"``) has the
variants, ``chunk_size``, ``max_action_dim``, ``tokenizer_max_length``,
``num_inference_steps``, ``image_resolution``, ``input_features`` and
``empty_cameras``. Variants name Gemma sizes (:data:`GEMMA_VARIANTS`, as
openpi's ``gemma.get_config``); a tensor that then does not fit is reported
as mis-shaped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..model.config import GemmaConfig, ModelConfig, VisionConfig
from .errors import CheckpointError

#: openpi ``models/gemma.py`` / LeRobot ``get_gemma_config`` sizes.
GEMMA_VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(width=2048, depth=18, mlp=16_384, heads=8, kv_heads=1, head_dim=256),
    "gemma_300m": GemmaConfig(width=1024, depth=18, mlp=4096, heads=8, kv_heads=1, head_dim=256),
}
GEMMA_HEAD_DIM = 256
SIGLIP_HEAD_DIMS = (72, 64)
DEFAULTS = {"action_horizon": 50, "max_token_len": 200, "denoise_steps": 10, "max_cameras": 3}

Shapes = Mapping[str, tuple[int, ...]]


def variant(name: str, where: str) -> GemmaConfig:
    base = name.removesuffix("_lora")  # LoRA variants have the base sizes
    if base not in GEMMA_VARIANTS:
        raise CheckpointError(f"{where}: unknown Gemma variant {name!r}; known: {sorted(GEMMA_VARIANTS)}")
    return GEMMA_VARIANTS[base]


def infer_config(shapes: Shapes, *, name: str, source: Mapping[str, Any] | None = None,
                 kind: str | None = None) -> ModelConfig:
    """The ModelConfig of a checkpoint whose tensors (under our names) have ``shapes``.

    ``source`` is the checkpoint's own config.json (``kind`` "openpi" or
    "lerobot"), whose fields take precedence as described in the module doc.
    """
    need = _Needs(shapes)
    vision = _vision(need)
    src = dict(source or {})
    where = f"{kind} config.json" if kind else "config.json"
    vlm_variant = src.get("paligemma_variant")
    exp_variant = src.get("action_expert_variant")
    vlm = variant(vlm_variant, where) if vlm_variant else _gemma(need, "language_model")
    expert = variant(exp_variant, where) if exp_variant else _gemma(need, "expert")
    vocab = need.dim("language_model.embed_tokens.weight", 0)
    action_dim = need.dim("action_in_proj.weight", 1)
    need.raise_if_missing()
    values = dict(DEFAULTS)
    if kind == "openpi":
        action_dim = int(src.get("action_dim", action_dim))
        values["action_horizon"] = int(src.get("action_horizon", values["action_horizon"]))
    elif kind == "lerobot":
        action_dim = int(src.get("max_action_dim", action_dim))
        values["action_horizon"] = int(src.get("chunk_size", values["action_horizon"]))
        values["max_token_len"] = int(src.get("tokenizer_max_length", values["max_token_len"]))
        values["denoise_steps"] = int(src.get("num_inference_steps", values["denoise_steps"]))
        cams = _lerobot_cameras(src)
        if cams:
            values["max_cameras"] = cams
        res = src.get("image_resolution")
        if res is not None and tuple(res) != (vision.image_size, vision.image_size):
            raise CheckpointError(
                f"{where}: image_resolution {list(res)} does not match the vision tower's position embedding "
                f"({vision.tokens_per_image} patches of {vision.patch_size} px = {vision.image_size} px square)")
    try:
        return ModelConfig(name=name, vision=vision, vlm=vlm, expert=expert, vocab_size=vocab,
                           action_dim=action_dim, extra={"layout": kind, "source_config": src}, **values)
    except ValueError as exc:
        raise CheckpointError(f"inconsistent sizes for {name}: {exc}") from exc


def _lerobot_cameras(src: Mapping[str, Any]) -> int:
    features = src.get("input_features") or {}
    visual = [k for k, v in features.items() if isinstance(v, Mapping) and v.get("type") == "VISUAL"]
    return len(visual) + int(src.get("empty_cameras", 0) or 0)


class _Needs:
    """Shape look-ups that remember what was missing, to report it all at once."""

    def __init__(self, shapes: Shapes):
        self.shapes = shapes
        self.missing: list[str] = []

    def shape(self, key: str) -> tuple[int, ...] | None:
        if key in self.shapes:
            return self.shapes[key]
        self.missing.append(key)
        return None

    def dim(self, key: str, axis: int) -> int:
        shape = self.shape(key)
        return shape[axis] if shape is not None and len(shape) > axis else 1

    def any_layer(self, stack: str, suffix: str, axis: int) -> int:
        """The size from the first layer that has the tensor (a missing layer tensor is reported later)."""
        pattern = re.compile(rf"{re.escape(stack)}\.layers\.(\d+)\.{re.escape(suffix)}$")
        hits = sorted((int(m.group(1)), k) for k in self.shapes if (m := pattern.match(k)))
        if not hits:
            self.missing.append(f"{stack}.layers.<i>.{suffix}")
            return 1
        return self.shapes[hits[0][1]][axis]

    def depth(self, stack: str) -> int:
        pattern = re.compile(rf"{re.escape(stack)}\.layers\.(\d+)\.")
        ids = {int(m.group(1)) for k in self.shapes if (m := pattern.match(k))}
        if not ids:
            self.missing.append(f"{stack}.layers.*")
            return 1
        return max(ids) + 1  # a gap (missing layer) is reported as missing tensors

    def raise_if_missing(self) -> None:
        if self.missing:
            raise CheckpointError(
                "cannot infer the model's sizes: tensors needed for it are missing (names after the key map)",
                sorted(set(self.missing)))


def _vision(need: _Needs) -> VisionConfig:
    patch = need.shape("vision.tower.embeddings.patch_embedding.weight") or (1, 3, 1, 1)
    positions = need.dim("vision.tower.embeddings.position_embedding.weight", 0)
    hidden, p = patch[0], patch[-1]
    side = math.isqrt(positions)
    if side * side != positions:
        raise CheckpointError(f"vision position embedding has {positions} rows, not a square number of patches")
    heads = next((hidden // d for d in SIGLIP_HEAD_DIMS if hidden % d == 0), None)
    if heads is None:
        raise CheckpointError(f"cannot infer the SigLIP head count for hidden size {hidden} "
                              f"(not a multiple of {SIGLIP_HEAD_DIMS}); use a native checkpoint")
    return VisionConfig(hidden=hidden, depth=need.depth("vision.tower.encoder"),
                        heads=heads, mlp=need.any_layer("vision.tower.encoder", "mlp.fc1.weight", 0),
                        image_size=side * p, patch_size=p)


def _gemma(need: _Needs, stack: str) -> GemmaConfig:
    q_rows = need.any_layer(stack, "self_attn.q_proj.weight", 0)
    width = need.any_layer(stack, "self_attn.q_proj.weight", 1)
    k_rows = need.any_layer(stack, "self_attn.k_proj.weight", 0)
    head_dim = GEMMA_HEAD_DIM if k_rows % GEMMA_HEAD_DIM == 0 else k_rows
    return GemmaConfig(width=width, depth=need.depth(stack), mlp=need.any_layer(stack, "mlp.gate_proj.weight", 0),
                       heads=max(1, q_rows // head_dim), kv_heads=max(1, k_rows // head_dim), head_dim=head_dim)
