"""Explicit model sizes in a checkpoint's config.json (``oxygen_sizes``), with shape inference for the rest."""

from __future__ import annotations

import json
import re

import pytest
import torch
from checkpoint_builders import SMALL, foreign_state, write_lerobot, write_openpi

from oxygen_ros.core.checkpoints import CheckpointError, load_checkpoint, save_native, sizes
from oxygen_ros.core.model.config import GemmaConfig, ModelConfig, VisionConfig
from oxygen_ros.core.model.vla import build_model

# Sizes no shape rule guesses: SigLIP width 32 with head size 16, Gemma head size 8 with 2 key/value heads.
ODD = ModelConfig(
    name="odd",
    vision=VisionConfig(hidden=32, depth=3, heads=2, mlp=40, image_size=21, patch_size=7),
    vlm=GemmaConfig(width=48, depth=2, mlp=72, heads=4, kv_heads=2, head_dim=8),
    expert=GemmaConfig(width=24, depth=2, mlp=40, heads=4, kv_heads=2, head_dim=8),
    vocab_size=512, max_token_len=20, max_cameras=2, action_dim=16, action_horizon=5, denoise_steps=4,
)
EXPLICIT = {"vision": {"heads": 2}, "vlm": {"head_dim": 8}, "expert": {"head_dim": 8},
            "max_token_len": 20, "max_cameras": 2, "denoise_steps": 4}


@pytest.fixture(scope="module")
def odd_model():
    return build_model(ODD, seed=5)


def set_config(directory, **fields):
    (directory / "config.json").write_text(json.dumps(fields))


def assert_lands(loaded, model, *, rounded):
    c = loaded.config
    assert (c.vision, c.vlm, c.expert, c.vocab_size, c.max_token_len, c.max_cameras, c.action_dim,
            c.action_horizon, c.denoise_steps) == (
        ODD.vision, ODD.vlm, ODD.expert, ODD.vocab_size, ODD.max_token_len, ODD.max_cameras, ODD.action_dim,
        ODD.action_horizon, ODD.denoise_steps)
    want = model.state_dict()
    for k, v in loaded.model.state_dict().items():
        expect = want[k].to(torch.bfloat16).float() if rounded else want[k]
        assert torch.equal(v, expect), k


def test_openpi_with_explicit_sizes_loads_any_head_size(tmp_path, odd_model):
    write_openpi(tmp_path, foreign_state(odd_model), config=False)
    set_config(tmp_path, action_dim=16, action_horizon=5, oxygen_sizes=EXPLICIT)
    assert_lands(load_checkpoint(tmp_path), odd_model, rounded=True)


def test_lerobot_explicit_sizes_win_over_variants_and_its_own_fields(tmp_path, odd_model):
    write_lerobot(tmp_path, foreign_state(odd_model, prefix="model.", embed="both"))
    meta = json.loads((tmp_path / "config.json").read_text())
    meta.update(paligemma_variant="gemma_2b", action_expert_variant="gemma_300m", chunk_size=50,
                tokenizer_max_length=200, max_action_dim=32, image_resolution=[21, 21])
    meta["oxygen_sizes"] = EXPLICIT | {"vlm": ODD.vlm.__dict__, "expert": ODD.expert.__dict__,
                                       "action_horizon": 5, "action_dim": 16}
    set_config(tmp_path, **meta)
    assert_lands(load_checkpoint(tmp_path), odd_model, rounded=False)


def test_native_keeps_unusual_sizes(tmp_path, odd_model):
    save_native(odd_model, tmp_path)
    assert_lands(load_checkpoint(tmp_path), odd_model, rounded=False)


def test_a_size_shapes_cannot_give_names_its_field(tmp_path, odd_model):
    write_openpi(tmp_path, foreign_state(odd_model), config=False)
    set_config(tmp_path, oxygen_sizes={"vlm": {"head_dim": 8}, "expert": {"head_dim": 8}})
    with pytest.raises(CheckpointError, match=r"hidden size 32 .*set oxygen_sizes\.vision\.heads"):
        load_checkpoint(tmp_path)


def test_shapes_fill_what_the_block_leaves_out(tmp_path, odd_model):
    # without the Gemma head size, the key rows (16) are taken as one key/value head of size 16
    write_openpi(tmp_path, foreign_state(odd_model), config=False)
    set_config(tmp_path, oxygen_sizes={"vision": {"heads": 2}})
    c = load_checkpoint(tmp_path).config
    assert c.vision == ODD.vision and (c.vlm.head_dim, c.vlm.kv_heads, c.vlm.heads) == (16, 1, 2)
    assert (c.max_token_len, c.max_cameras, c.action_horizon) == (200, 3, 50)  # π0.5's defaults


@pytest.mark.parametrize("block, message", [
    ({"vision": {"head": 2}}, "unknown field.*vision.head"),
    ({"horizon": 5}, "unknown field.*horizon"),
    ({"vlm": 3}, "oxygen_sizes.vlm must be an object"),
    ({"vision": {"heads": 3}}, "inconsistent vision sizes.*not divisible by heads 3"),
    ({"vision": {"heads": 2}, "max_cameras": 0}, "max_cameras must be a positive integer"),
])
def test_bad_explicit_sizes_are_named(tmp_path, odd_model, block, message):
    write_openpi(tmp_path, foreign_state(odd_model), config=False)
    set_config(tmp_path, oxygen_sizes=block)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path)


def test_a_lerobot_horizon_is_its_chunk_size_and_its_steps_its_num_inference_steps(tmp_path, monkeypatch):
    """LeRobot's pi05 predicts ``chunk_size`` actions and executes ``n_action_steps`` of them: the
    chunk the node publishes is the whole predicted one; its denoising takes the checkpoint's
    ``num_inference_steps``, not π0.5's default 10."""
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_vlm", SMALL.vlm)
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_expert", SMALL.expert)
    model = build_model(SMALL, seed=3)
    write_lerobot(tmp_path, foreign_state(model, prefix="model.", embed="both"), chunk_size=6, n_action_steps=2,
                  num_inference_steps=4)
    c = load_checkpoint(tmp_path).config
    assert c.action_horizon == 6
    assert c.denoise_steps == 4
    assert not {"action_horizon", "denoise_steps"} & set(c.extra["defaulted"])


@pytest.mark.parametrize("stack", ["language_model", "expert"])
def test_a_gemma_stack_without_its_last_layer_is_named_not_loaded_shallower(tmp_path, stack):
    """The VLM and the expert share their depth: without a config that states it, a last layer
    one of them lacks is reported as missing tensors, not read as a one-layer-shallower model."""
    model = build_model(SMALL, seed=2)
    state = foreign_state(model)
    last = f".{stack}.layers.1." if stack == "language_model" else "gemma_expert.model.layers.1."
    state = {k: v for k, v in state.items() if last not in k}
    write_openpi(tmp_path, state, config=False)
    with pytest.raises(CheckpointError, match=rf"missing: {stack}\.layers\.1\.self_attn\.q_proj\.weight") as err:
        load_checkpoint(tmp_path)
    assert "vlm 64x2, expert 32x2" in str(err.value)


@pytest.mark.parametrize("fields, message", [
    ({"action_horizon": "ten"}, "openpi config.json: action_horizon must be a whole number, got 'ten'"),
    ({"action_horizon": 10.7}, "action_horizon must be a whole number, got 10.7"),
    ({"action_dim": None}, "action_dim must be a whole number, got None"),
    ({"paligemma_variant": 2}, "a Gemma variant must be a name such as 'gemma_2b', got 2"),
])
def test_an_openpi_config_field_of_the_wrong_type_is_named(tmp_path, fields, message):
    write_openpi(tmp_path, foreign_state(build_model(SMALL, seed=2)), config=False)
    set_config(tmp_path, **fields)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("fields, message", [
    ({"image_resolution": 28}, "image_resolution must be [height, width] in pixels, got 28"),
    ({"chunk_size": None}, "chunk_size must be a whole number, got None"),
    ({"empty_cameras": "two"}, "empty_cameras must be a whole number, got 'two'"),
    ({"input_features": ["observation.images.cam0"]}, "input_features must be an object"),
])
def test_a_lerobot_config_field_of_the_wrong_type_is_named(tmp_path, monkeypatch, fields, message):
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_vlm", SMALL.vlm)
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_expert", SMALL.expert)
    write_lerobot(tmp_path, foreign_state(build_model(SMALL, seed=2), prefix="model.", embed="both"))
    meta = json.loads((tmp_path / "config.json").read_text()) | fields
    set_config(tmp_path, **meta)
    with pytest.raises(CheckpointError, match=re.escape(f"lerobot config.json: {message}")):
        load_checkpoint(tmp_path)


def test_a_config_json_that_is_not_an_object_is_refused(tmp_path):
    write_openpi(tmp_path, foreign_state(build_model(SMALL, seed=2)), config=False)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json holds a JSON list, not an object of config fields"):
        load_checkpoint(tmp_path)
    native = save_native(build_model(SMALL, seed=2), tmp_path / "native")
    meta = json.loads((native / "config.json").read_text())
    del meta["config"]
    (native / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match='has no "config" object'):
        load_checkpoint(native)


def test_a_depth_given_for_one_gemma_stack_is_the_other_s_too(tmp_path):
    """Both stacks without their last layer look like a shallower model; a depth stated for one of
    them (``--size vlm.depth=2``) has the missing layers of both named."""
    model = build_model(SMALL, seed=2)
    state = {k: v for k, v in foreign_state(model).items() if ".layers.1." not in k or "vision" in k}
    write_openpi(tmp_path, state, config=False)
    assert load_checkpoint(tmp_path).config.vlm.depth == 1
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, sizes={"vlm": {"depth": 2}})
    assert {"language_model.layers.1.mlp.up_proj.weight", "expert.layers.1.mlp.up_proj.weight"} <= {
        p.split()[1].rstrip(",") for p in err.value.problems if p.startswith("missing:")}
