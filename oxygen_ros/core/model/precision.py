"""Model precision: the dtypes a model runs in, and which parameters stay float32 under bfloat16."""

from __future__ import annotations

import torch
from torch import nn

from .gemma import AdaRMSNorm

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


#: Parameters kept in float32 when the model runs in bfloat16, as openpi's
#: ``to_bfloat16_for_selected_params`` does: the vision patch and position
#: embeddings and every Gemma norm (RMSNorm weights; the adaRMS dense layers of
#: the expert). SigLIP's own LayerNorms follow the model dtype, as in openpi.
#: The action projections and the time MLP stay float32 too: openpi converts only
#: the VLM and the expert, and integrates the flow's ``x_t`` in float32.
FLOAT32_IN_BF16 = (
    "vision.tower.embeddings.",
    "input_layernorm.",
    "post_attention_layernorm.",
    "language_model.norm.",
    "expert.norm.",
    "action_in_proj.",
    "action_out_proj.",
    "time_mlp_in.",
    "time_mlp_out.",
)


def set_precision(model: nn.Module, dtype: str | torch.dtype) -> nn.Module:
    """Cast ``model`` in place to ``dtype``; under bfloat16 keep :data:`FLOAT32_IN_BF16` in float32.

    Works on any device, ``meta`` included (so a checkpoint loader can fix the
    dtype of every parameter before materialising it). The adaRMS dense layers
    kept in float32 get a pre-hook that casts their bf16 condition to float32.
    """
    torch_dtype = TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
    if torch_dtype not in TORCH_DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    model.to(dtype=torch_dtype)
    if torch_dtype == torch.bfloat16:
        for name, param in model.named_parameters():
            if any(sel in name for sel in FLOAT32_IN_BF16):
                param.data = param.data.to(torch.float32)
    for module in model.modules():
        if isinstance(module, AdaRMSNorm) and not getattr(module.dense, "_casts_input", False):
            module.dense.register_forward_pre_hook(_cast_input_to_weight_dtype)
            module.dense._casts_input = True
    return model


def _cast_input_to_weight_dtype(module: nn.Module, args: tuple) -> tuple:
    return (args[0].to(module.weight.dtype), *args[1:])
