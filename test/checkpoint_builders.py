"""Checkpoints in the foreign layouts (openpi's PyTorch conversion, LeRobot's pi05),
written out here independently of the loader, for the checkpoint tests."""

from __future__ import annotations

import json

import torch
from engine_harness import stats_dict
from safetensors.torch import save_file

from oxygen_ros.core.model.config import GemmaConfig, ModelConfig, VisionConfig
from oxygen_ros.core.tokenizer import default_tokenizer_path

# Small sizes with the real shape relations: SigLIP head size 72, MQA Gemma stacks.
SMALL = ModelConfig(
    name="small",
    vision=VisionConfig(hidden=144, depth=2, heads=2, mlp=96, image_size=28, patch_size=14),
    vlm=GemmaConfig(width=64, depth=2, mlp=128, heads=4, kv_heads=1, head_dim=16),
    expert=GemmaConfig(width=32, depth=2, mlp=48, heads=4, kv_heads=1, head_dim=16),
    vocab_size=512, max_token_len=24, max_cameras=3, action_dim=32, action_horizon=6,
)
PG = "paligemma_with_expert.paligemma."


def openpi_name(ours: str) -> str:
    """Our key -> the name openpi's PyTorch conversion stores (written out here, independently of the loader)."""
    if ours.startswith("vision.tower."):
        return PG + "model.vision_tower.vision_model." + ours[len("vision.tower."):]
    if ours.startswith("vision.projector."):
        return PG + "model.multi_modal_projector.linear." + ours[len("vision.projector."):]
    if ours.startswith("language_model."):
        return PG + "model." + ours
    if ours.startswith("expert."):
        return "paligemma_with_expert.gemma_expert.model." + ours[len("expert."):]
    return ours  # action_in_proj, action_out_proj, time_mlp_in, time_mlp_out


def foreign_state(model, *, prefix="", embed="lm_head", time_mlp="time_mlp", expert_head=True):
    """The model's weights under openpi/LeRobot names; ``embed`` says how the token embedding is stored:
    "lm_head" (openpi's save_model keeps only the tied lm_head), "embed_tokens", or "both"."""
    out = {}
    for k, v in model.state_dict().items():
        name = openpi_name(k)
        if k == "language_model.embed_tokens.weight":
            if embed in ("lm_head", "both"):
                out[prefix + PG + "lm_head.weight"] = v.clone()
            if embed == "lm_head":
                continue
        if name.startswith("time_mlp_"):
            name = name.replace("time_mlp_", time_mlp + "_")
        out[prefix + name] = v.clone()
    if expert_head:  # openpi keeps GemmaForCausalLM's (untrained) expert lm_head
        out[prefix + "paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.randn(
            model.config.vocab_size, model.config.expert.width)
    return out


def write_openpi(directory, state, *, config=True, stats=True, tokenizer=True):
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(directory / "model.safetensors"))
    if config:  # what convert_jax_model_to_pytorch.py writes
        (directory / "config.json").write_text(json.dumps({
            "action_dim": 32, "action_horizon": SMALL.action_horizon, "paligemma_variant": "small_vlm",
            "action_expert_variant": "small_expert", "precision": "bfloat16"}))
    if stats:  # the converter copies assets/<asset_id>/norm_stats.json
        (directory / "assets" / "robot").mkdir(parents=True)
        (directory / "assets" / "robot" / "norm_stats.json").write_text(json.dumps(
            {"norm_stats": {"state": stats_dict(8), "actions": stats_dict(7, seed=1)}}))
    if tokenizer:
        (directory / "tokenizer.model").write_bytes(default_tokenizer_path().read_bytes())
    return directory


def write_lerobot(directory, state, *, stats=True, chunk_size=SMALL.action_horizon, n_action_steps=None,
                  num_inference_steps=10):
    """LeRobot's pi05 layout; ``n_action_steps`` (the actions LeRobot executes of each chunk)
    is ``chunk_size`` unless given."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "type": "pi05", "paligemma_variant": "small_vlm", "action_expert_variant": "small_expert",
        "dtype": "float32", "chunk_size": chunk_size,
        "n_action_steps": chunk_size if n_action_steps is None else n_action_steps,
        "max_state_dim": 32, "max_action_dim": 32, "tokenizer_max_length": SMALL.max_token_len,
        "num_inference_steps": num_inference_steps, "image_resolution": [28, 28], "empty_cameras": 0,
        "input_features": {f"observation.images.cam{i}": {"type": "VISUAL", "shape": [3, 28, 28]} for i in range(3)}
        | {"observation.state": {"type": "STATE", "shape": [8]}},
        "output_features": {"action": {"type": "ACTION", "shape": [7]}},
    }))
    if stats:
        st, ac = stats_dict(8), stats_dict(7, seed=1)
        flat = {f"observation.state.{k}": torch.tensor(v) for k, v in st.items()}
        flat |= {f"action.{k}": torch.tensor(v) for k, v in ac.items()}
        flat["observation.images.cam0.mean"] = torch.zeros(3, 1, 1)
        fname = "policy_preprocessor_step_2_normalizer_processor.safetensors"
        save_file(flat, str(directory / fname))
        (directory / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "normalizer_processor", "state_file": fname, "config": {
                "eps": 1e-8, "features": {"observation.state": {"type": "STATE", "shape": [8]},
                                          "action": {"type": "ACTION", "shape": [7]}},
                "norm_map": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}}}]}))
    (directory / "tokenizer.model").write_bytes(default_tokenizer_path().read_bytes())
    return directory
