"""Checkpoint layouts: how one is recognised, its key map and its model config.

A layout turns the checkpoint's tensor names into ours (:class:`KeyPlan`);
``loading.py`` then checks every name and shape against the model before any
weight is read. The foreign layouts (see ``docs/checkpoints.md``):

* ``openpi``: openpi's PyTorch conversion (``examples/convert_jax_model_to_pytorch.py``,
  ``PI0Pytorch`` saved with ``safetensors.torch.save_model``)::

      paligemma_with_expert.paligemma.model.vision_tower.vision_model.{embeddings,encoder,post_layernorm}.*
      paligemma_with_expert.paligemma.model.multi_modal_projector.linear.{weight,bias}
      paligemma_with_expert.paligemma.model.language_model.{layers.<i>.*,norm.weight[,embed_tokens.weight]}
      paligemma_with_expert.paligemma.lm_head.weight          (tied to embed_tokens; save_model keeps
                                                               only this name of the pair)
      paligemma_with_expert.gemma_expert.model.{layers.<i>.*,norm.dense.*}
      paligemma_with_expert.gemma_expert.lm_head.weight       (never trained, unused: ignored)
      action_in_proj.*, action_out_proj.*, time_mlp_in.*, time_mlp_out.*

* ``lerobot``: LeRobot's ``pi05`` policy - the same names under a ``model.``
  prefix (keys without it are accepted, as LeRobot itself does), older exports
  with ``action_time_mlp_{in,out}`` for the time MLP.

Older transformers spellings are accepted as well (``paligemma.vision_tower``,
``paligemma.language_model.model.layers``, ``paligemma.language_model.lm_head``),
and the SigLIP ``vision_model.`` level may be absent (transformers 5).
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..model.config import ModelConfig
from .errors import CheckpointError
from .given_sizes import apply_sizes
from .native import is_native_dir, read_native_config
from .safetensors_files import TensorInfo
from .sizes import infer_config

Tensors = Mapping[str, TensorInfo]

EMBED = "language_model.embed_tokens.weight"
_LM_HEAD = "<lm_head>"

_PG = r"paligemma_with_expert\.paligemma\."
#: (pattern over the un-prefixed name, our name / _LM_HEAD / None to ignore, reason when ignored)
RULES: list[tuple[re.Pattern[str], str | None, str]] = [
    (re.compile(_PG + r"(?:language_model\.)?lm_head\.weight"), _LM_HEAD, ""),
    (re.compile(_PG + r"(?:model\.)?vision_tower\.(?:vision_model\.)?(.+)"), r"vision.tower.\1", ""),
    (re.compile(_PG + r"(?:model\.)?multi_modal_projector\.linear\.(weight|bias)"), r"vision.projector.\1", ""),
    (re.compile(_PG + r"(?:model\.language_model|language_model\.model|language_model)\.(.+)"),
     r"language_model.\1", ""),
    (re.compile(r"paligemma_with_expert\.gemma_expert\.lm_head\.weight"), None,
     "the action expert's LM head is never trained nor used"),
    (re.compile(r"paligemma_with_expert\.gemma_expert\.model\.(.+)"), r"expert.\1", ""),
    (re.compile(r"(action_in_proj|action_out_proj|time_mlp_in|time_mlp_out)\.(weight|bias)"), r"\1.\2", ""),
    (re.compile(r"action_time_mlp_(in|out)\.(weight|bias)"), r"time_mlp_\1.\2", ""),
    (re.compile(r"(?:normalize_inputs|normalize_targets|unnormalize_outputs)\..+"), None,
     "LeRobot normalisation buffers (statistics are read from the stats files)"),
]

#: Tensors that only a π0 (not π0.5) checkpoint has.
PI0_MARKERS = (
    re.compile(r"(model\.)?state_proj\.weight"),
    re.compile(r"(model\.)?paligemma_with_expert\.gemma_expert\.model\.norm\.weight"),
)


@dataclass
class KeyPlan:
    """``mapping``: our key -> checkpoint key; ``ignored``: checkpoint keys known
    and deliberately unused -> why; ``problems``: findings of the layout itself
    (duplicates), reported together with the shape check."""

    mapping: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def shapes(self, tensors: Tensors) -> dict[str, tuple[int, ...]]:
        return {ours: tensors[src].shape for ours, src in self.mapping.items()}


class Layout:
    name = ""

    def key_map(self, tensors: Tensors) -> KeyPlan:
        raise NotImplementedError

    def config(self, directory: pathlib.Path, tensors: Tensors, plan: KeyPlan, sizes=None) -> ModelConfig:
        """The model's config; ``sizes`` (nested, checked) are explicit sizes that win over the checkpoint's."""
        raise NotImplementedError


class NativeLayout(Layout):
    """Our own names (``save_native``); the config is in ``config.json``."""

    name = "native"

    def key_map(self, tensors):
        return KeyPlan(mapping={k: k for k in tensors})

    def config(self, directory, tensors, plan, sizes=None):
        return apply_sizes(read_native_config(directory)[0], sizes or {}, "the given sizes")


class ForeignLayout(Layout):
    """openpi-PyTorch or LeRobot: names translated by :data:`RULES` after an optional prefix."""

    def __init__(self, name: str, prefix: str):
        self.name, self.prefix = name, prefix

    def key_map(self, tensors):
        plan = KeyPlan()
        lm_head = None
        for name in sorted(tensors):
            base = name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else name
            for pattern, target, reason in RULES:
                m = pattern.fullmatch(base)
                if m is None:
                    continue
                if target is None:
                    plan.ignored[name] = reason
                elif target == _LM_HEAD:
                    lm_head = name
                else:
                    ours = m.expand(target)
                    if ours in plan.mapping:
                        plan.problems.append(f"duplicate: {plan.mapping[ours]} and {name} both hold {ours}")
                    else:
                        plan.mapping[ours] = name
                break
        if lm_head is not None:
            if EMBED in plan.mapping:
                plan.ignored[lm_head] = "PaliGemma ties the LM head to embed_tokens, which is present"
            else:
                plan.mapping[EMBED] = lm_head
        return plan

    def config(self, directory, tensors, plan, sizes=None):
        source = _read_json(directory / "config.json")
        if self.name == "lerobot" and source and source.get("type") not in (None, "pi05"):
            raise CheckpointError(f"{directory / 'config.json'}: a LeRobot {source.get('type')!r} policy, "
                                  "not pi05")
        return infer_config(plan.shapes(tensors), name=f"{self.name}:{directory.name}", source=source,
                            kind=self.name, sizes=sizes)


def detect(directory: pathlib.Path, tensors: Tensors) -> Layout:
    """The layout of a checkpoint, from its config.json marker and its tensor names."""
    if is_native_dir(directory):
        return NativeLayout()
    pi0 = sorted(n for n in tensors if any(p.fullmatch(n) for p in PI0_MARKERS))
    if pi0:
        raise CheckpointError(
            f"{directory} is a π0 checkpoint (it has {pi0[0]}); only π0.5 (adaRMS action expert, "
            "discrete state in the prompt) is supported")
    if any(n.startswith("model.paligemma_with_expert.") for n in tensors):
        return ForeignLayout("lerobot", "model.")
    if any(n.startswith("paligemma_with_expert.") for n in tensors):
        source = _read_json(directory / "config.json")
        if source.get("type") == "pi05":  # LeRobot export whose keys lost the prefix
            return ForeignLayout("lerobot", "model.")
        return ForeignLayout("openpi", "")
    sample = sorted(tensors)[:5]
    raise CheckpointError(
        f"{directory}: unrecognised checkpoint layout (not native, openpi-PyTorch or LeRobot pi05); "
        f"first tensor names: {sample}")


def _read_json(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a JSON {type(data).__name__}, not an object of config fields")
    return data
