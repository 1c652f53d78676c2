"""Loading π0.5 checkpoints (native, openpi-PyTorch, LeRobot ``pi05``) and saving native ones.

Public API::

    load_checkpoint(path, *, device="cpu", dtype="float32", tokenizer_path=None, norm_stats_path=None,
                    sizes=None)
        -> LoadedCheckpoint(model, config, tokenizer, normalizer, layout, source)
    save_native(model, out_dir, *, tokenizer_path=None, norm_stats=None, extra=None)
    load_model(model_path=None, *, preset=None, fallback_preset="tiny", device, dtype, seed,
               tokenizer_path, norm_stats_path, sizes)   the one precedence every entry point uses
    parse_sizes("vision.heads=2,max_token_len=48" or ["vision.heads=2", ...]) -> sizes for load_model
    default_model()
    CheckpointError, SizesError (a subclass: bad explicit sizes, a size to set)

Files: ``errors.py`` (the error), ``safetensors_files.py`` (lazy tensor
access, pickle refusal), ``native.py`` (our format), ``layouts.py`` (layout
detection and key maps), ``sizes.py`` (model sizes from configs and shapes),
``given_sizes.py`` (explicit sizes: checked, merged, parsed from ``KEY=VALUE``),
``config_misfit.py`` (a config.json whose sizes the tensors do not have),
``stats.py`` (finding the statistics), ``loading.py`` (the loader). See
``docs/checkpoints.md``.
"""

import importlib

from .errors import CheckpointError
from .given_sizes import SizesError, format_sizes, parse_sizes

#: Names of the loader and the native format, imported on first use: the loader imports
#: transformers (its SigLIP), 4 s on 2 cores, which a camera node naming the inference
#: node's parameters (``given_sizes``) must not pay.
_LAZY = {**dict.fromkeys(("DEFAULT_MODEL_DIR", "LoadedCheckpoint", "default_model", "load_checkpoint", "load_model"),
                         "loading"),
         **dict.fromkeys(("FORMAT_NAME", "FORMAT_VERSION", "config_from_dict", "config_to_dict", "save_native"),
                         "native")}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointError", "SizesError", "parse_sizes", "format_sizes", "LoadedCheckpoint", "load_checkpoint",
    "load_model", "save_native", "default_model",
    "DEFAULT_MODEL_DIR", "FORMAT_NAME", "FORMAT_VERSION", "config_to_dict", "config_from_dict",
]
