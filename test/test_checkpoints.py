"""Checkpoints: native saving and loading (bit-identical, bf16), the shipped default and the
load_model precedence. Foreign layouts (openpi, LeRobot) are in test_checkpoint_layouts.py."""

from __future__ import annotations

import json

import pytest
import torch
from engine_harness import cached_outputs, stats_dict

from oxygen_ros.core.checkpoints import (
    CheckpointError,
    default_model,
    load_checkpoint,
    save_native,
)
from oxygen_ros.core.model.cache import SlotView
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.core.normalization import Normalizer
from oxygen_ros.core.tokenizer import default_tokenizer_path


# ---------------------------------------------------------------------------- native
def test_native_round_trip_is_bit_identical(tmp_path):
    model = build_model(TINY, seed=5)
    norm = Normalizer(stats_dict(5), stats_dict(7, seed=1))
    out = save_native(model, tmp_path / "ck", tokenizer_path=default_tokenizer_path(), norm_stats=norm,
                      extra={"card.md": "# tiny\n", "training.json": {"steps": 3}})
    assert sorted(p.name for p in out.iterdir()) == [
        "card.md", "config.json", "model.safetensors", "norm_stats.json", "tokenizer.model", "training.json"]
    meta = json.loads((out / "config.json").read_text())
    assert meta["format"] == "oxygen_ros.vla" and meta["format_version"] == 1
    loaded = load_checkpoint(out)
    assert loaded.layout == "native" and loaded.config == TINY
    want, got = model.state_dict(), loaded.model.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert want[k].dtype == got[k].dtype and torch.equal(want[k], got[k]), k
    for a, b in zip(cached_outputs(model), cached_outputs(loaded.model)):
        assert torch.equal(a, b)
    assert loaded.normalizer.action_dim == 7 and loaded.normalizer.state_dim == 5
    assert loaded.tokenizer.vocab_size == TINY.vocab_size


def test_every_saved_file_has_the_mode_the_umask_gives(tmp_path):
    """safetensors writes its file for its owner only: a robot's service running as another
    user could read the config but not the weights."""
    import os

    old = os.umask(0o022)
    try:
        out = save_native(build_model(TINY, seed=5), tmp_path / "ck", tokenizer_path=default_tokenizer_path())
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o644, modes


def test_native_bfloat16_round_trip_keeps_float32_islands(tmp_path):
    model = build_model(TINY, seed=2, dtype="bfloat16")
    save_native(model, tmp_path)
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    for (name, p), q in zip(model.state_dict().items(), loaded.model.state_dict().values()):
        assert p.dtype == q.dtype and torch.equal(p, q), name


def test_bfloat16_loading_and_inference(tmp_path):
    model = build_model(TINY, seed=4)
    save_native(model, tmp_path)
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    m = loaded.model
    dtypes = {n: p.dtype for n, p in m.named_parameters()}
    assert dtypes["vision.tower.embeddings.patch_embedding.weight"] == torch.float32
    assert dtypes["vision.tower.embeddings.position_embedding.weight"] == torch.float32
    assert dtypes["language_model.layers.0.input_layernorm.weight"] == torch.float32
    assert dtypes["expert.layers.1.post_attention_layernorm.dense.weight"] == torch.float32
    assert dtypes["expert.norm.dense.bias"] == torch.float32
    assert dtypes["language_model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    assert dtypes["vision.tower.encoder.layers.0.mlp.fc1.weight"] == torch.bfloat16
    assert m.new_cache(1, 8).k.dtype == torch.bfloat16
    logits16, actions16 = cached_outputs(m)
    logits32, actions32 = cached_outputs(model)
    assert torch.isfinite(logits16).all() and torch.isfinite(actions16).all()
    # bf16 has ~3 significant digits: close to float32, not equal
    assert (logits16 - logits32).abs().max() < 0.05 * logits32.abs().max()
    assert (actions16 - actions32).abs().max() < 0.1 * actions32.abs().max() + 0.05
    text = m.decode_step(m.new_cache(1, 8), SlotView.of(0, [0]), torch.tensor([3]))
    assert torch.isfinite(text).all()


def test_default_model_is_random_tiny_without_shipped_default():
    loaded = default_model()
    assert loaded.layout in ("random", "native")
    if loaded.layout == "random":
        assert loaded.config == TINY and loaded.normalizer is None
        ref = build_model(TINY, seed=0).state_dict()
        assert all(torch.equal(ref[k], v) for k, v in loaded.model.state_dict().items())


def test_load_model_precedence(tmp_path, monkeypatch):
    """A model path, else an explicit preset, else the shipped default, else the fallback preset."""
    from oxygen_ros.core.checkpoints import loading, load_model

    save_native(build_model(TINY, seed=5), tmp_path / "ckpt", tokenizer_path=default_tokenizer_path())
    from_path = load_model(tmp_path / "ckpt", fallback_preset="pi05")
    assert from_path.layout == "native" and from_path.source == str(tmp_path / "ckpt")
    preset = load_model(preset="tiny", seed=3)
    assert preset.layout == "random" and "seed 3" in preset.source
    ref = build_model(TINY, seed=3).state_dict()
    assert all(torch.equal(ref[k], v) for k, v in preset.model.state_dict().items())
    with pytest.raises(ValueError, match="not both"):
        load_model(tmp_path / "ckpt", preset="tiny")
    monkeypatch.setattr(loading, "DEFAULT_MODEL_DIR", tmp_path / "ckpt")  # a shipped default
    assert load_model(fallback_preset="pi05").source == str(tmp_path / "ckpt")
    monkeypatch.setattr(loading, "DEFAULT_MODEL_DIR", tmp_path / "nothing")  # none shipped
    fallback = load_model(fallback_preset="tiny", seed=1)
    assert fallback.layout == "random" and fallback.source == "preset tiny (random weights, seed 1)"


def test_a_checkpoint_with_non_finite_weights_is_refused_naming_each_tensor(tmp_path):
    """NaN or inf weights (a diverged training run, a bad conversion) loaded, warmed up and then
    had every chunk refused at run time, far from the cause."""
    model = build_model(TINY, seed=3)
    state = model.state_dict()
    names = [k for k, v in state.items() if v.is_floating_point() and v.numel() > 4]
    with torch.no_grad():
        state[names[0]].view(-1)[:2] = float("nan")
        state[names[-1]].view(-1)[0] = float("-inf")
    save_native(model, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    message = str(err.value)
    assert f"checkpoint {tmp_path}: 2 tensor(s) hold values that are not finite (NaN or inf)" in message
    assert f"{names[0]} (2 of {state[names[0]].numel()} values as float32)" in message
    assert f"{names[-1]} (1 of {state[names[-1]].numel()} values as float32)" in message

