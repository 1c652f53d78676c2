"""Loading π0.5 checkpoints (native, openpi-PyTorch, LeRobot ``pi05``) and saving native ones.

Public API::

    load_checkpoint(path, *, device="cpu", dtype="float32", tokenizer_path=None, norm_stats_path=None)
        -> LoadedCheckpoint(model, config, tokenizer, normalizer, layout, source)
    save_native(model, out_dir, *, tokenizer_path=None, norm_stats=None, extra=None)
    load_model(model_path=None, *, preset=None, fallback_preset="tiny", device, dtype, seed,
               tokenizer_path, norm_stats_path)   the one precedence every entry point uses
    default_model()
    CheckpointError

Files: ``errors.py`` (the error), ``safetensors_files.py`` (lazy tensor
access, pickle refusal), ``native.py`` (our format), ``layouts.py`` (layout
detection and key maps), ``sizes.py`` (model sizes from configs and shapes),
``stats.py`` (finding the statistics), ``loading.py`` (the loader). See
``docs/checkpoints.md``.
"""

from .errors import CheckpointError
from .loading import (DEFAULT_MODEL_DIR, LoadedCheckpoint, default_model, load_checkpoint, load_model)
from .native import FORMAT_NAME, FORMAT_VERSION, config_from_dict, config_to_dict, save_native

__all__ = [
    "CheckpointError", "LoadedCheckpoint", "load_checkpoint", "load_model", "save_native", "default_model",
    "DEFAULT_MODEL_DIR", "FORMAT_NAME", "FORMAT_VERSION", "config_to_dict", "config_from_dict",
]
