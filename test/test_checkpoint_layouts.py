"""Checkpoints in foreign layouts (openpi-PyTorch, LeRobot pi05): every tensor lands, sizes
come from the config or the shapes, misfits are all named at once, and what is refused says why.
"""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_builders import PG, SMALL, foreign_state, write_lerobot, write_openpi
from engine_harness import cached_outputs, stats_dict
from safetensors.torch import save_file

from oxygen_ros.core.checkpoints import CheckpointError, load_checkpoint, save_native, sizes
from oxygen_ros.core.model.config import TINY, GemmaConfig
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.core.tokenizer import default_tokenizer_path


@pytest.fixture
def small_variants(monkeypatch):
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_vlm", SMALL.vlm)
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_expert", SMALL.expert)


@pytest.fixture(scope="module")
def small_model():
    return build_model(SMALL, seed=11)


def bf16_reference(model):
    """The model with its weights rounded to bfloat16 (as written to the openpi test file), in float32."""
    ref = build_model(SMALL, seed=0)
    with torch.no_grad():
        for (_, p), (_, q) in zip(ref.state_dict(keep_vars=True).items(), model.state_dict().items()):
            p.copy_(q.to(torch.bfloat16).float())
    return ref


CASES = {
    "openpi": dict(writer="openpi", config=True),
    "openpi-no-config": dict(writer="openpi", config=False),
    "lerobot": dict(writer="lerobot", embed="both"),
    "lerobot-old-time-mlp": dict(writer="lerobot", embed="lm_head", time_mlp="action_time_mlp"),
    "lerobot-embed-only": dict(writer="lerobot", embed="embed_tokens", expert_head=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_foreign_layout_lands_every_tensor(tmp_path, small_variants, small_model, case):
    spec = CASES[case]
    if spec["writer"] == "openpi":
        write_openpi(tmp_path, foreign_state(small_model), config=spec["config"])
        ref, layout = bf16_reference(small_model), "openpi"
    else:
        state = foreign_state(small_model, prefix="model.", embed=spec["embed"],
                              time_mlp=spec.get("time_mlp", "time_mlp"), expert_head=spec.get("expert_head", True))
        write_lerobot(tmp_path, state)
        ref, layout = small_model, "lerobot"
    loaded = load_checkpoint(tmp_path)
    assert loaded.layout == layout
    c = loaded.config
    assert (c.vision, c.vlm, c.expert, c.vocab_size, c.action_dim) == (
        SMALL.vision, SMALL.vlm, SMALL.expert, SMALL.vocab_size, SMALL.action_dim)
    if spec.get("config", True):
        assert c.action_horizon == SMALL.action_horizon
    if layout == "lerobot":
        assert c.max_token_len == SMALL.max_token_len and c.max_cameras == 3
    want = ref.state_dict()
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    for a, b in zip(cached_outputs(ref, config=SMALL), cached_outputs(loaded.model, config=SMALL)):
        assert torch.equal(a, b)
    assert loaded.normalizer.action_dim == 7 and loaded.normalizer.state_dim == 8
    assert loaded.normalizer.convention == ("openpi" if layout == "openpi" else "lerobot")


def test_openpi_sizes_come_from_config_and_misfits_are_named(tmp_path, monkeypatch, small_model):
    # config.json says the VLM is wider than the tensors: every misfit is named, nothing runs
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_vlm", GemmaConfig(width=96, depth=2, mlp=128, heads=4,
                                                                       kv_heads=1, head_dim=16))
    monkeypatch.setitem(sizes.GEMMA_VARIANTS, "small_expert", SMALL.expert)
    write_openpi(tmp_path, foreign_state(small_model))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    text = str(err.value)
    assert f"mis-shaped: {PG}lm_head.weight: checkpoint (512, 64), model expects (512, 96)" in text
    assert f"{PG}model.language_model.layers.1.mlp.down_proj.weight" in text
    assert text.endswith("config.json states sizes the tensors do not have: vlm.width 96 (the tensors: 64). The "
                         "tensors fit their own sizes: give them to override config.json, --size vlm.width=64 on a "
                         'command, model_sizes: ["vlm.width=64"] on the inference node'), text


def test_a_config_json_that_misstates_the_action_dimension_is_named_with_its_override(tmp_path, small_variants,
                                                                                       small_model):
    """A converter fork writes the robot's action_dim (7) where the tensors are 32 wide: the error
    blamed action_in_proj's shape; it now names config.json's field and the size to give."""
    write_openpi(tmp_path, foreign_state(small_model))
    meta = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(meta | {"action_dim": 7}))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "mis-shaped: action_in_proj.weight: checkpoint (32, 32), model expects (32, 7)" in str(err.value)
    assert err.value.problems[-1].startswith("config.json states sizes the tensors do not have: action_dim 7 "
                                             "(the tensors: 32). The tensors fit their own sizes: give them to "
                                             "override config.json, --size action_dim=32 on a command"), err.value
    assert load_checkpoint(tmp_path, sizes={"action_dim": 32}).config.action_dim == 32


def test_missing_extra_and_misshaped_tensors_are_all_reported_at_once(tmp_path, small_variants, small_model):
    state = foreign_state(small_model)
    gone = [PG + "model.language_model.layers.1.self_attn.v_proj.weight", "time_mlp_out.bias",
            PG + "model.vision_tower.vision_model.encoder.layers.0.layer_norm2.bias"]
    for k in gone:
        del state[k]
    state["some_adapter.lora_A.weight"] = torch.zeros(2, 2)
    state[PG + "model.language_model.layers.2.mlp.up_proj.weight"] = torch.zeros(128, 64)  # a layer too many
    state["action_out_proj.weight"] = torch.zeros(31, 32)
    write_openpi(tmp_path, state)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    e = err.value
    assert "nothing was loaded" in str(e)
    text = "\n".join(e.problems)
    assert "missing: language_model.layers.1.self_attn.v_proj.weight" in text
    assert "missing: time_mlp_out.bias" in text
    assert "missing: vision.tower.encoder.layers.0.layer_norm2.bias" in text
    assert "unexpected: some_adapter.lora_A.weight" in text
    assert f"unexpected: {PG}model.language_model.layers.2.mlp.up_proj.weight" in text
    assert "mis-shaped: action_out_proj.weight: checkpoint (31, 32), model expects (32, 32)" in text
    assert len(e.problems) == 6


def test_shape_inference_without_config(tmp_path, small_model):
    write_openpi(tmp_path, foreign_state(small_model), config=False)
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    assert loaded.config.vlm == SMALL.vlm and loaded.config.expert == SMALL.expert
    assert loaded.config.vision == SMALL.vision
    assert loaded.config.action_horizon == 50  # π0.5's default: no tensor encodes the horizon
    # and the node says so: in its start-up line, and in a warning that tells how to set it
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import startup_summary, unstated_horizon

    p = {spec.name: spec.default for spec in PARAMETERS}
    assert "H=50 actions (pi0.5's default: the checkpoint does not state it)" in startup_summary(loaded, p)
    assert "prompt length 200 and 3 cameras (pi0.5's defaults: the checkpoint does not state them)" in \
        startup_summary(loaded, p)
    assert 'model_sizes: ["action_horizon=N"]' in unstated_horizon(loaded)
    native = save_native(loaded.model, tmp_path / "native")  # converted: its config.json states every size
    assert unstated_horizon(load_checkpoint(native)) is None
    stated = write_openpi(tmp_path / "stated", foreign_state(small_model), config=False)
    (stated / "config.json").write_text(json.dumps({"action_horizon": 10}))  # openpi's converter writes it
    assert unstated_horizon(load_checkpoint(stated)) is None
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.vision.tower.embeddings.patch_embedding.weight.dtype == torch.float32


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    for target in (tmp_path, tmp_path / "pytorch_model.bin"):
        with pytest.raises(CheckpointError, match="only safetensors .* accepted.*arbitrary code"):
            load_checkpoint(target)
    (tmp_path / "model.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="only safetensors"):
        load_checkpoint(tmp_path / "model.pt")


def test_missing_tokenizer_says_what_to_put_where(tmp_path, small_variants, small_model):
    write_openpi(tmp_path, foreign_state(small_model), tokenizer=False)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    text = str(err.value)
    assert str(tmp_path / "tokenizer.model") in text and "tokenizer_path" in text and "--tokenizer-path" in text
    loaded = load_checkpoint(tmp_path, tokenizer_path=default_tokenizer_path())
    assert loaded.tokenizer.vocab_size == 512


def test_missing_stats_names_the_option(tmp_path, small_variants, small_model):
    write_openpi(tmp_path, foreign_state(small_model), stats=False)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "norm_stats_path" in str(err.value) and "--norm-stats" in str(err.value)
    stats = tmp_path / "elsewhere.json"
    stats.write_text(json.dumps({"norm_stats": {"state": stats_dict(3), "actions": stats_dict(2)}}))
    assert load_checkpoint(tmp_path, norm_stats_path=stats).normalizer.action_dim == 2


def test_pi0_checkpoint_is_named(tmp_path, small_model):
    state = foreign_state(small_model)
    state["state_proj.weight"] = torch.zeros(32, 32)
    write_openpi(tmp_path, state)
    with pytest.raises(CheckpointError, match="π0 checkpoint"):
        load_checkpoint(tmp_path)


def hf_pi05_tensors(*, vision_model_level: bool):
    """The full π0.5 key set and shapes, from the Hugging Face modules openpi and LeRobot build
    (PaliGemmaForConditionalGeneration + GemmaForCausalLM, on meta: no memory), renamed as
    openpi's PyTorch model has them: adaRMS expert norms (dense.{weight,bias}), the expert's
    embed_tokens removed, lm_head kept instead of the tied embed_tokens (safetensors' save_model)."""
    from transformers import GemmaForCausalLM, PaliGemmaForConditionalGeneration
    from transformers.models.auto import CONFIG_MAPPING

    from oxygen_ros.core.checkpoints.safetensors_files import TensorInfo

    cfg = CONFIG_MAPPING["paligemma"]()
    t = cfg.text_config
    t.hidden_size, t.intermediate_size, t.num_attention_heads = 2048, 16384, 8
    t.head_dim, t.num_hidden_layers, t.num_key_value_heads, t.vocab_size = 256, 18, 1, 257152
    cfg.vision_config.intermediate_size, cfg.vision_config.projection_dim = 4304, 2048
    with torch.device("meta"):
        vlm = PaliGemmaForConditionalGeneration(cfg)
        expert = GemmaForCausalLM(CONFIG_MAPPING["gemma"](
            head_dim=256, hidden_size=1024, intermediate_size=4096, num_attention_heads=8, num_hidden_layers=18,
            num_key_value_heads=1, vocab_size=257152))
    shapes = {}
    for k, v in vlm.state_dict().items():
        if k == "model.language_model.embed_tokens.weight":
            continue  # tied to lm_head; save_model keeps the alphabetically first name
        if vision_model_level:
            k = k.replace("model.vision_tower.", "model.vision_tower.vision_model.")
        shapes["paligemma_with_expert.paligemma." + k] = tuple(v.shape)
    for k, v in expert.state_dict().items():
        if k == "model.embed_tokens.weight":
            continue
        if k.endswith("layernorm.weight") or k == "model.norm.weight":
            base = k.removesuffix(".weight")
            shapes[f"paligemma_with_expert.gemma_expert.{base}.dense.weight"] = (3 * 1024, 1024)
            shapes[f"paligemma_with_expert.gemma_expert.{base}.dense.bias"] = (3 * 1024,)
            continue
        shapes["paligemma_with_expert.gemma_expert." + k] = tuple(v.shape)
    for name, (o, i) in {"action_in_proj": (1024, 32), "action_out_proj": (32, 1024),
                         "time_mlp_in": (1024, 1024), "time_mlp_out": (1024, 1024)}.items():
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (o, i), (o,)
    return {k: TensorInfo(None, s, "BF16") for k, s in shapes.items()}


@pytest.mark.parametrize("vision_model_level", [True, False])
def test_real_pi05_key_set_maps_onto_the_pi05_preset(tmp_path, vision_model_level):
    from oxygen_ros.core.checkpoints import layouts, loading
    from oxygen_ros.core.model.config import PI05

    tensors = hf_pi05_tensors(vision_model_level=vision_model_level)
    layout = layouts.detect(tmp_path, tensors)
    assert layout.name == "openpi"
    plan = layout.key_map(tensors)
    config = sizes.infer_config(plan.shapes(tensors), name="pi05", kind="openpi")
    assert (config.vision, config.vlm, config.expert, config.vocab_size, config.action_dim) == (
        PI05.vision, PI05.vlm, PI05.expert, PI05.vocab_size, PI05.action_dim)
    model = build_model(PI05, device="meta")
    loading.check_plan(plan, tensors, model, tmp_path, "openpi")  # raises on any misfit
    assert set(plan.mapping) == set(model.state_dict())
    assert plan.mapping["language_model.embed_tokens.weight"] == PG + "lm_head.weight"
    assert list(plan.ignored) == ["paligemma_with_expert.gemma_expert.lm_head.weight"]
    lerobot = {"model." + k: v for k, v in tensors.items()}
    lplan = layouts.detect(tmp_path, lerobot).key_map(lerobot)
    assert set(lplan.mapping) == set(plan.mapping)


def test_truncated_or_foreign_files_are_checkpoint_errors(tmp_path):
    model = build_model(TINY, seed=1)
    save_native(model, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="does not fit"):
        load_checkpoint(tmp_path)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_checkpoint(tmp_path, device="cuda")


def test_sharded_safetensors_with_index(tmp_path, small_variants, small_model):
    state = foreign_state(small_model, prefix="model.", embed="embed_tokens", expert_head=False)
    write_lerobot(tmp_path, state)
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / fname))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    loaded = load_checkpoint(tmp_path)
    want = small_model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.model.state_dict().items())
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="2 .safetensors files and no model.safetensors.index.json to say how "
                       "they make one model: copy the shards' index next to them"):
        load_checkpoint(tmp_path)


def test_a_folder_that_is_not_a_checkpoint_says_what_it_likely_is(tmp_path, small_variants, small_model):
    """The likeliest wrong folders gave only 'no model.safetensors found' and a listing: an openpi
    JAX checkpoint (to convert first), LeRobot's checkpoints/last (the policy is in
    pretrained_model/), a folder of checkpoints."""
    jax = tmp_path / "pi05_droid"
    (jax / "params").mkdir(parents=True)
    (jax / "assets").mkdir()
    with pytest.raises(CheckpointError, match=r"files there: \['assets', 'params'\]\. It looks like an openpi JAX "
                       r"checkpoint \(params/\): convert it .*convert_jax_model_to_pytorch\.py"):
        load_checkpoint(jax)
    last = tmp_path / "outputs" / "checkpoints" / "last"
    write_lerobot(last / "pretrained_model", foreign_state(small_model, prefix="model.", embed="both"))
    (last / "training_state").mkdir()
    with pytest.raises(CheckpointError, match="checkpoints below it: pretrained_model: point model_path at one"):
        load_checkpoint(last)
    with pytest.raises(CheckpointError, match="checkpoints below it: last/pretrained_model: point model_path at one"):
        load_checkpoint(last.parent)
    with pytest.raises(CheckpointError) as empty:
        load_checkpoint(last / "training_state")
    assert str(empty.value).endswith("files there: []")


def _lerobot_config(directory, **changes):
    meta = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(meta | changes))


def test_a_lerobot_checkpoint_of_relative_actions_is_refused_naming_the_field(tmp_path, small_variants, small_model):
    """Its actions are deltas from the state (LeRobot's processor adds the state back): published
    as they are, a robot would take them for positions."""
    write_lerobot(tmp_path, foreign_state(small_model, prefix="model.", embed="both"))
    _lerobot_config(tmp_path, use_relative_actions=True)
    with pytest.raises(CheckpointError, match="use_relative_actions is true"):
        load_checkpoint(tmp_path)


def test_lerobot_empty_cameras_listed_among_the_features_count_once(tmp_path, small_variants, small_model):
    """LeRobot saves ``observation.images.empty_camera_<i>`` among its input features: with
    ``empty_cameras: 1`` and two real cameras the model has 3 camera slots, not 4."""
    write_lerobot(tmp_path, foreign_state(small_model, prefix="model.", embed="both"))
    visual = {"type": "VISUAL", "shape": [3, 28, 28]}
    features = {"observation.images.cam0": visual, "observation.images.cam1": visual,
                "observation.images.empty_camera_0": visual, "observation.state": {"type": "STATE", "shape": [8]}}
    _lerobot_config(tmp_path, empty_cameras=1, input_features=features)
    assert load_checkpoint(tmp_path).config.max_cameras == 3


def test_the_start_up_says_in_which_units_actions_go_out(random_tiny_dir):
    """A trained checkpoint without statistics sends the model's own numbers, all 32
    dimensions: the node warns (joint_names would otherwise take the first values silently);
    with statistics it says which dimensions it unnormalises; random weights say nothing."""
    from oxygen_ros.core.checkpoints import default_model, load_model
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import units_note

    p = {spec.name: spec.default for spec in PARAMETERS}
    warn, line = units_note(p, load_checkpoint(random_tiny_dir))
    assert warn and "has no normalisation statistics" in line and "all 32 dimensions" in line, line
    assert "norm_stats_path" in line
    shipped = default_model()
    warn, line = units_note(p, shipped)
    n = shipped.normalizer
    assert not warn and line.startswith(f"normalisation statistics ({shipped.source}/norm_stats.json): state "
                                        f"{n.state_dim}, actions {n.action_dim} dimensions"), line
    assert units_note(p, load_model(None, preset="tiny")) is None


def test_statistics_without_a_state_entry_are_warned_at_start(tmp_path, small_variants, small_model):
    """openpi statistics with actions only load (the actions unnormalise), and the start-up warns
    that an observation with a state will be refused, and why."""
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import units_note

    d = write_openpi(tmp_path / "ckpt", foreign_state(small_model), stats=False)
    (d / "norm_stats.json").write_text(json.dumps({"norm_stats": {"actions": stats_dict(7, seed=1)}}))
    p = {spec.name: spec.default for spec in PARAMETERS}
    warn, line = units_note(p, load_checkpoint(d))
    assert warn and line.startswith(f"normalisation statistics ({d / 'norm_stats.json'}): no state entry, actions 7 "
                                    "dimensions"), line
    assert "An observation that carries a state is refused: π0.5 takes its state normalised" in line, line
    assert "norm_stats_path" in line


def test_joint_names_fewer_than_the_action_dimensions_are_said_at_start():
    """7 joint_names against statistics 32 wide (openpi's padded base statistics) ran without a
    word: the trajectory took the first 7 and the ActionChunk carried 25 columns of padding. The
    model's whole width warns; a narrower action (a gripper driven apart) is an info line."""
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import trajectory_note

    from oxygen_ros.ros.robots import resolved_topic

    def root(topic):  # the names as a node in the root namespace resolves them
        return resolved_topic("/", topic)

    p = {spec.name: spec.default for spec in PARAMETERS} | {"joint_names": [f"j{i}" for i in range(7)]}
    warn, line = trajectory_note(p, 32, root)
    assert warn and line.startswith("joint_names names 7 joints and the actions have 32 dimensions: "
                                    "/oxygen/joint_trajectory carries the first 7 of each action"), line
    assert "norm_stats_path" in line
    assert trajectory_note(p, 8, root) == (False, "joint_names names 7 joints and the actions have 8 dimensions: "
                                            "/oxygen/joint_trajectory carries the first 7 of each action, "
                                            "/oxygen/actions all 8")
    assert trajectory_note(p, 7) is None and trajectory_note(p | {"joint_names": []}, 32) is None


def test_a_checkpoint_s_start_up_asks_for_its_training_rate(tmp_path, small_variants, small_model,
                                                            random_tiny_dir):
    """No layout records the rate a checkpoint's actions were learnt at, and its chunks went out at
    the default 50 Hz without a word (a LIBERO policy, learnt at 10 Hz, five times too fast)."""
    from oxygen_ros.core.checkpoints import default_model, load_model
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import rate_note

    p = {spec.name: spec.default for spec in PARAMETERS} | {"control_rate_hz": 10.0}
    d = write_openpi(tmp_path / "ckpt", foreign_state(small_model))
    assert rate_note(p, load_checkpoint(d)) == (
        f"a chunk's {SMALL.action_horizon} actions go out one per tick at control_rate_hz 10 Hz (0.60 s): set it to "
        f"the rate {d}'s training data was recorded at (DROID 15 Hz, LIBERO 10 Hz, ALOHA 50 Hz), else the arm "
        "moves faster or slower than it was taught")
    assert "control_rate_hz" in rate_note(p, load_checkpoint(random_tiny_dir))  # a native checkpoint too
    assert rate_note(p, default_model()) is None and rate_note(p, load_model(None, preset="tiny")) is None


def test_a_pi05_vision_tower_without_its_last_layer_is_named(tmp_path):
    """No config field states SigLIP's depth: π0.5's So400m tower (hidden 1152) is 27 layers deep,
    so one that stops at 26 is a checkpoint with a layer missing, not a shallower tower."""
    from oxygen_ros.core.checkpoints import layouts, loading
    from oxygen_ros.core.model.config import PI05

    tensors = {k: v for k, v in hf_pi05_tensors(vision_model_level=True).items() if ".layers.26." not in k}
    plan = layouts.detect(tmp_path, tensors).key_map(tensors)
    config = sizes.infer_config(plan.shapes(tensors), name="pi05", kind="openpi")
    assert config.vision == PI05.vision
    with pytest.raises(CheckpointError, match=r"missing: vision\.tower\.encoder\.layers\.26\.mlp\.fc1\.weight"):
        loading.check_plan(plan, tensors, build_model(config, device="meta"), tmp_path, "openpi")


@pytest.mark.parametrize("content, message", [
    (b"not a sentencepiece model at all", "unusable tokenizer: not a SentencePiece model"),
    (b"", "unusable tokenizer: not a SentencePiece model"),
])
def test_a_tokenizer_that_is_not_sentencepiece_is_a_checkpoint_error(tmp_path, small_variants, small_model,
                                                                      content, message):
    write_openpi(tmp_path, foreign_state(small_model))
    (tmp_path / "tokenizer.model").write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(tmp_path)
    assert err.value.parameter is None  # the checkpoint's own file: model_path is what to fix
    given = tmp_path / "given.model"
    given.write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(tmp_path, tokenizer_path=given)
    assert err.value.parameter == "tokenizer_path"
    with pytest.raises(CheckpointError, match="tokenizer_path .* is a folder: give the SentencePiece model file"):
        load_checkpoint(tmp_path, tokenizer_path=tmp_path)


def test_a_preset_s_given_tokenizer_and_statistics_are_checked_as_a_checkpoint_s(tmp_path):
    from oxygen_ros.core.checkpoints import load_model

    with pytest.raises(CheckpointError, match="tokenizer model not found") as err:
        load_model(preset="tiny", tokenizer_path=tmp_path / "nope.model")
    assert err.value.parameter == "tokenizer_path"
    with pytest.raises(CheckpointError, match="norm_stats_path .*nope.json does not exist") as err:
        load_model(preset="tiny", norm_stats_path=tmp_path / "nope.json")
    assert err.value.parameter == "norm_stats_path"


@pytest.mark.parametrize("content, message", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 12\n", "Git LFS pointer, not the weights"),
    (b"<!DOCTYPE html><html><body>Sign in</body></html>", "an HTML page"),
])
def test_a_weights_file_that_is_a_pointer_or_a_web_page_says_so(tmp_path, content, message):
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path)


def test_the_start_up_names_the_tokenizer_file_and_whose_choice_it_was(tmp_path, small_variants, small_model,
                                                                       random_tiny_dir):
    """A wrong tokenizer decodes nonsense without an error: the start-up says which file is in use."""
    from oxygen_ros.core.checkpoints import default_model
    from oxygen_ros.ros.inference_parameters import PARAMETERS
    from oxygen_ros.ros.inference_setup import model_notes, tokenizer_note

    p = {spec.name: spec.default for spec in PARAMETERS}
    shipped, embedded = default_tokenizer_path(), default_model()
    assert (False, f"tokenizer {embedded.tokenizer.path} (the embedded default model's; "
                   f"{embedded.tokenizer.vocab_size} pieces)") in model_notes(p, embedded, 2)
    d = write_openpi(tmp_path / "ckpt", foreign_state(small_model))
    ckpt = load_checkpoint(d)
    assert ckpt.tokenizer.path.is_relative_to(d)  # the one in its folder
    assert tokenizer_note(p, ckpt) == f"tokenizer {ckpt.tokenizer.path} (the checkpoint's; {ckpt.tokenizer.vocab_size} pieces)"
    given = p | {"tokenizer_path": str(shipped)}
    loaded = load_checkpoint(random_tiny_dir, tokenizer_path=shipped)
    assert tokenizer_note(given, loaded) == \
        f"tokenizer {shipped} (parameter tokenizer_path; {loaded.tokenizer.vocab_size} pieces)"
