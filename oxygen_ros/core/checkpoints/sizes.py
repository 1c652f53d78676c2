"""Model sizes of a foreign checkpoint: from its config where it has one, else from tensor shapes.

Inference works on *our* key names (after the layout's key map), so it is the
same for every layout:

* vision: ``hidden`` and ``patch_size`` from the patch embedding
  ``[hidden, 3, p, p]``; ``image_size = sqrt(rows of the position embedding) * p``;
  ``depth`` = number of encoder layers present (27, SigLIP So400m's, for its
  hidden size 1152: a missing last layer is then named); ``mlp`` = rows of ``fc1``;
  ``heads = hidden / 72`` (SigLIP So400m's head size; ``/ 64`` for hidden
  sizes that are not multiples of 72, as SigLIP base/large) - the square q/k/v
  projections do not encode the head count, so this is a convention.
* each Gemma stack: ``width`` = columns of ``q_proj``; ``depth`` = number of
  layers present in either stack (they share it: a layer one of them lacks is
  named); ``mlp`` = rows of ``gate_proj``; ``head_dim = 256`` (every
  Gemma variant π0.5 uses) when the rows of ``k_proj`` are a multiple of 256,
  otherwise multi-query attention is assumed (``head_dim`` = rows of
  ``k_proj``, one key/value head); ``heads`` = rows of ``q_proj / head_dim``,
  ``kv_heads`` = rows of ``k_proj / head_dim``.
* ``vocab_size`` = rows of the token embedding (or of the tied LM head);
  ``action_dim`` = columns of ``action_in_proj``.
* not in any tensor: ``action_horizon`` (default 50), ``max_token_len``
  (200), ``denoise_steps`` (10), ``max_cameras`` (3) - π0.5's defaults.

A config.json may name any size outright in an ``"oxygen_sizes"`` object
with our field names (:data:`SIZE_BLOCK`; every field optional)::

    "oxygen_sizes": {"vision": {"hidden", "depth", "heads", "mlp", "image_size", "patch_size"},
                     "vlm": {"width", "depth", "mlp", "heads", "kv_heads", "head_dim"}, "expert": {...},
                     "vocab_size", "max_token_len", "max_cameras", "action_dim", "action_horizon",
                     "denoise_steps"}

The same object can be given to ``load_model(..., sizes=...)`` (the command
option ``--size KEY=VALUE``, the node parameter ``model_sizes``; see
:mod:`.given_sizes`): given sizes win field by field over the config.json's,
which win over everything else; shapes fill only what they leave out, and a
size they cannot give (a SigLIP head count) is an error naming its field.
Besides it, the layout's own config fields override shapes: openpi's converter writes ``config.json``
with ``paligemma_variant``, ``action_expert_variant``, ``action_dim``,
``action_horizon``; LeRobot's ``config.json`` (``"type": "pi05"``) has the
variants, ``chunk_size``, ``max_action_dim``, ``tokenizer_max_length``,
``num_inference_steps``, ``image_resolution``, ``input_features`` and
``empty_cameras``. Variants name Gemma sizes (:data:`GEMMA_VARIANTS`, as
openpi's ``gemma.get_config``); a tensor that then does not fit is reported
as mis-shaped.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from ..model.config import GemmaConfig, ModelConfig, VisionConfig
from .errors import CheckpointError
from .given_sizes import SIZE_BLOCK, TOP_FIELDS, SizesError, check_sizes, how_to_set, merge_sizes

#: openpi ``models/gemma.py`` / LeRobot ``get_gemma_config`` sizes.
GEMMA_VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(width=2048, depth=18, mlp=16_384, heads=8, kv_heads=1, head_dim=256),
    "gemma_300m": GemmaConfig(width=1024, depth=18, mlp=4096, heads=8, kv_heads=1, head_dim=256),
}
GEMMA_HEAD_DIM = 256
SIGLIP_HEAD_DIMS = (72, 64)
SO400M_HIDDEN, SO400M_DEPTH = 1152, 27  # π0.5's vision tower, whose depth no config field states
DEFAULTS = {"action_horizon": 50, "max_token_len": 200, "denoise_steps": 10, "max_cameras": 3}
#: our field -> LeRobot's config.json field
LEROBOT_FIELDS = {"action_dim": "max_action_dim", "action_horizon": "chunk_size",
                  "max_token_len": "tokenizer_max_length", "denoise_steps": "num_inference_steps"}

Shapes = Mapping[str, tuple[int, ...]]


def variant(name: str, where: str) -> GemmaConfig:
    if not isinstance(name, str):
        raise CheckpointError(f"{where}: a Gemma variant must be a name such as 'gemma_2b', got {name!r}")
    base = name.removesuffix("_lora")  # LoRA variants have the base sizes
    if base not in GEMMA_VARIANTS:
        raise CheckpointError(f"{where}: unknown Gemma variant {name!r}; known: {sorted(GEMMA_VARIANTS)}")
    return GEMMA_VARIANTS[base]


def infer_config(shapes: Shapes, *, name: str, source: Mapping[str, Any] | None = None,
                 kind: str | None = None, sizes: Mapping[str, Any] | None = None) -> ModelConfig:
    """The ModelConfig of a checkpoint whose tensors (under our names) have ``shapes``.

    ``sizes`` (nested, as :data:`SIZE_BLOCK`) names sizes outright; then
    ``source``, the checkpoint's own config.json (``kind`` "openpi" or
    "lerobot"): its :data:`SIZE_BLOCK` object, then the layout's own fields;
    the tensor shapes fill what is still missing.
    """
    src = dict(source or {})
    where = f"{kind} config.json" if kind else "config.json"
    given = merge_sizes(check_sizes(src.get(SIZE_BLOCK, {}), SIZE_BLOCK, where), check_sizes(sizes or {}))
    need = _Needs(shapes)
    vision = _vision(need, given.get("vision", {}))
    depth = _shared_depth(need, given, src, where)
    vlm = _gemma(need, "language_model", given.get("vlm", {}), src.get("paligemma_variant"), where, depth)
    expert = _gemma(need, "expert", given.get("expert", {}), src.get("action_expert_variant"), where, depth)
    values = dict(DEFAULTS, vocab_size=need.dim("language_model.embed_tokens.weight", 0),
                  action_dim=need.dim("action_in_proj.weight", 1))
    need.raise_if_missing()
    stated = _layout_values(src, kind, where, vision) | {k: v for k, v in given.items() if k in TOP_FIELDS}
    values.update(stated)
    defaulted = sorted(set(DEFAULTS) - set(stated))  # π0.5's values: nothing the checkpoint has says them
    try:
        return ModelConfig(name=name, vision=vision, vlm=vlm, expert=expert,
                           extra={"layout": kind, "source_config": src, "defaulted": defaulted}, **values)
    except ValueError as exc:
        raise SizesError(f"inconsistent sizes for {name}: {exc}") from exc


def _shared_depth(need: _Needs, given: Mapping[str, Any], src: Mapping[str, Any], where: str) -> int:
    """The depth of both Gemma stacks (they share it): a given one, else a variant's, else the layers
    present in either stack, so that a layer one of them lacks is named as missing."""
    stated = [given.get(part, {}).get("depth") for part in ("vlm", "expert")]
    stated += [variant(src[key], where).depth for key in ("paligemma_variant", "action_expert_variant") if src.get(key)]
    stated = [d for d in stated if d is not None]
    return stated[0] if stated else max(need.depth("language_model"), need.depth("expert"))


def _layout_values(src: Mapping[str, Any], kind: str | None, where: str, vision: VisionConfig) -> dict[str, int]:
    """The sizes openpi's or LeRobot's own config.json fields state."""
    values: dict[str, int] = {}
    if kind == "openpi":
        values.update({k: _whole(src, k, where) for k in ("action_dim", "action_horizon") if k in src})
    elif kind == "lerobot":
        if src.get("use_relative_actions"):
            raise CheckpointError(
                f"{where}: use_relative_actions is true: the policy predicts actions relative to the state, "
                "which LeRobot's processor turns back into absolute ones; this node publishes the model's "
                "actions as they are, so a robot would take the deltas for positions")
        for ours, theirs in LEROBOT_FIELDS.items():
            if theirs in src:
                values[ours] = _whole(src, theirs, where)
        cams = _lerobot_cameras(src, where)
        if cams:
            values["max_cameras"] = cams
        res = src.get("image_resolution")
        if res is not None and not (isinstance(res, list) and len(res) == 2
                                    and all(isinstance(r, int) and not isinstance(r, bool) for r in res)):
            raise CheckpointError(f"{where}: image_resolution must be [height, width] in pixels, got {res!r}")
        if res is not None and tuple(res) != (vision.image_size, vision.image_size):
            raise CheckpointError(
                f"{where}: image_resolution {list(res)} does not match the vision tower's position embedding "
                f"({vision.tokens_per_image} patches of {vision.patch_size} px = {vision.image_size} px square)")
    return values


def _lerobot_cameras(src: Mapping[str, Any], where: str) -> int:
    """The camera slots: the VISUAL input features, and the ``empty_cameras`` not among them
    (LeRobot adds ``observation.images.empty_camera_<i>`` to the features it saves)."""
    features = src.get("input_features") or {}
    if not isinstance(features, Mapping):
        raise CheckpointError(f"{where}: input_features must be an object of feature name -> "
                              f"{{\"type\": ..., \"shape\": ...}}, got {type(features).__name__}")
    visual = [k for k, v in features.items() if isinstance(v, Mapping) and v.get("type") == "VISUAL"]
    listed = sum("empty_camera" in k for k in visual)
    empty = _whole(src, "empty_cameras", where) if src.get("empty_cameras") is not None else 0
    return len(visual) + max(0, empty - listed)


def _whole(src: Mapping[str, Any], key: str, where: str) -> int:
    """The config field ``key`` as a whole number (a float such as 50.0 too), else an error naming it."""
    value = src[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise CheckpointError(f"{where}: {key} must be a whole number, got {value!r}")
    return int(value)


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


def _vision(need: _Needs, given: Mapping[str, Any]) -> VisionConfig:
    patch = need.shape("vision.tower.embeddings.patch_embedding.weight") or (1, 3, 1, 1)
    positions = need.dim("vision.tower.embeddings.position_embedding.weight", 0)
    side = math.isqrt(positions)
    if side * side != positions and "image_size" not in given:
        raise SizesError(f"vision position embedding has {positions} rows, not a square number of patches; "
                         f"set {how_to_set('vision.image_size')}")
    depth = need.depth("vision.tower.encoder")
    sizes = {"hidden": patch[0], "patch_size": patch[-1],
             "depth": max(depth, SO400M_DEPTH) if patch[0] == SO400M_HIDDEN else depth,
             "mlp": need.any_layer("vision.tower.encoder", "mlp.fc1.weight", 0)}
    sizes.update(given)
    sizes.setdefault("image_size", side * sizes["patch_size"])
    if "heads" not in sizes:
        hidden = sizes["hidden"]
        sizes["heads"] = next((hidden // d for d in SIGLIP_HEAD_DIMS if hidden % d == 0), None)
        if sizes["heads"] is None and need.missing:
            sizes["heads"] = 1  # the missing tensors are reported instead
        elif sizes["heads"] is None:
            raise SizesError(
                f"cannot infer the SigLIP head count for hidden size {hidden} (not a multiple of "
                f"{SIGLIP_HEAD_DIMS}, and the q/k/v shapes do not encode it): set {how_to_set('vision.heads')}")
    return _part(VisionConfig, sizes, "vision")


def _gemma(need: _Needs, stack: str, given: Mapping[str, Any], variant_name: str | None, where: str,
           depth: int) -> GemmaConfig:
    part = "vlm" if stack == "language_model" else "expert"
    if variant_name:
        sizes = dataclasses.asdict(variant(variant_name, where))
    else:
        q_rows = need.any_layer(stack, "self_attn.q_proj.weight", 0)
        k_rows = need.any_layer(stack, "self_attn.k_proj.weight", 0)
        head_dim = int(given.get("head_dim", GEMMA_HEAD_DIM if k_rows % GEMMA_HEAD_DIM == 0 else k_rows))
        sizes = {"width": need.any_layer(stack, "self_attn.q_proj.weight", 1), "depth": depth,
                 "mlp": need.any_layer(stack, "mlp.gate_proj.weight", 0), "head_dim": head_dim,
                 "heads": max(1, q_rows // head_dim), "kv_heads": max(1, k_rows // head_dim)}
    sizes.update(given)
    return _part(GemmaConfig, sizes, part)


def _part(cls, sizes: Mapping[str, Any], part: str):
    try:
        return cls(**sizes)
    except ValueError as exc:
        raise SizesError(f"inconsistent {part} sizes {dict(sizes)}: {exc}") from exc
