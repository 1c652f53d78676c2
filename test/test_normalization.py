"""State/action normalisation (openpi and LeRobot conventions) and the stats files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from oxygen_ros.core.normalization import (
    Normalizer,
    NormStatsError,
    Stats,
    load_norm_stats,
)

STATE = {"mean": [0.5, -1.0, 2.0], "std": [1.0, 0.5, 4.0], "q01": [-1.0, -2.0, 0.0], "q99": [3.0, 0.0, 10.0]}
ACTIONS = {"mean": [0.0, 1.0], "std": [2.0, 0.1], "q01": [-0.5, 0.9], "q99": [0.5, 1.1]}


def test_quantile_formula_matches_openpi():
    n = Normalizer(STATE, ACTIONS)
    x = np.array([1.0, -1.0, 5.0])
    want = (x - np.array(STATE["q01"])) / (np.array(STATE["q99"]) - np.array(STATE["q01"]) + 1e-6) * 2 - 1
    np.testing.assert_allclose(n.normalize_state(x), want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(n.normalize_state(np.array(STATE["q01"])), -1.0, atol=1e-12)
    np.testing.assert_allclose(n.normalize_state(np.array(STATE["q99"])), 1.0, atol=1e-6)
    # a state shorter than the stats uses their first entries (openpi slices the stats)
    np.testing.assert_allclose(n.normalize_state(x[:2]), want[:2], rtol=0, atol=1e-15)


def test_actions_are_unpadded_and_unnormalised():
    n = Normalizer(STATE, ACTIONS)
    model_out = np.zeros((4, 32))
    model_out[:, 0], model_out[:, 1] = -1.0, 1.0
    model_out[:, 2:] = 123.0  # padding: dropped
    out = n.unnormalize_actions(model_out)
    assert out.shape == (4, 2) and n.action_dim == 2
    np.testing.assert_allclose(out[:, 0], -0.5, atol=1e-12)
    np.testing.assert_allclose(out[:, 1], 1.1 + 1e-6, atol=1e-12)


def test_zscore_and_lerobot_conventions():
    z = Normalizer(STATE, ACTIONS, mode="zscore")
    np.testing.assert_allclose(z.normalize_state(np.array([1.5, -1.0, 6.0])), [1 / (1 + 1e-6), 0, 1 / (1 + 2.5e-7)])
    np.testing.assert_allclose(z.unnormalize_actions(np.ones((1, 32)))[0], [2 + 1e-6, 1.1 + 1e-6])
    lq = Normalizer(STATE, ACTIONS, convention="lerobot")
    np.testing.assert_allclose(lq.normalize_state(np.array([1.0, -1.0, 5.0])), [0.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(lq.unnormalize_actions(np.ones((1, 32)))[0], [0.5, 1.1])
    lz = Normalizer(STATE, ACTIONS, mode="zscore", convention="lerobot")
    np.testing.assert_allclose(lz.unnormalize_actions(np.ones((1, 32)))[0], [2.0, 1.1])
    # LeRobot replaces a zero quantile range by eps instead of adding eps everywhere
    flat = {**STATE, "q01": [1.0, 1.0, 1.0], "q99": [1.0, 2.0, 3.0]}
    np.testing.assert_allclose(Normalizer(flat, ACTIONS, convention="lerobot").normalize_state(
        np.array([1.0, 2.0, 3.0])), [-1.0, 1.0, 1.0])


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    q01=st.lists(st.floats(-100, 100), min_size=1, max_size=12),
    span=st.lists(st.floats(1e-2, 100), min_size=12, max_size=12),
    frac=st.lists(unit, min_size=12, max_size=12),
    mode=st.sampled_from(["quantile", "zscore"]),
    convention=st.sampled_from(["openpi", "lerobot"]),
)
def test_normalise_then_unnormalise_is_identity_in_range(q01, span, frac, mode, convention):
    d = len(q01)
    lo = np.array(q01)
    hi = lo + np.array(span[:d])
    stats = {"mean": (lo + hi) / 2, "std": (hi - lo) / 4, "q01": lo, "q99": hi}
    n = Normalizer(stats, stats, mode=mode, convention=convention)
    x = lo + np.array(frac[:d]) * (hi - lo)
    padded = n.normalize_actions(x[None])  # [1, 32], zero padding after d
    assert padded.shape == (1, 32) and not padded[0, d:].any()
    if mode == "quantile":
        z = n.normalize_state(x)
        assert np.all(z >= -1 - 1e-9) and np.all(z <= 1 + 1e-9)
        np.testing.assert_allclose(padded[0, :d], z, rtol=0, atol=1e-12)
    back = n.unnormalize_actions(padded)[0]
    # LeRobot's z-score inverse omits the eps its forward adds: identity up to eps-relative error
    tol = 1e-9 * (np.abs(x).max() + 1)
    if convention == "lerobot" and mode == "zscore":
        tol += 1.01 * 1e-8 * np.max(np.abs(x - stats["mean"]) / stats["std"])
    np.testing.assert_allclose(back, x, rtol=0, atol=tol)


def test_bad_inputs_are_named():
    n = Normalizer(STATE, ACTIONS)
    with pytest.raises(NormStatsError, match="state has 4 values"):
        n.normalize_state(np.zeros(4))
    with pytest.raises(NormStatsError, match="NaN"):
        n.normalize_state(np.array([np.nan, 0, 0]))
    with pytest.raises(NormStatsError, match="fewer than the robot's 2"):
        n.unnormalize_actions(np.zeros((3, 1)))
    with pytest.raises(NormStatsError, match="q01/q99"):
        Normalizer({"mean": [0], "std": [1]}, ACTIONS)
    with pytest.raises(NormStatsError, match="different lengths"):
        Stats.from_mapping({"mean": [0, 1], "std": [1]})
    with pytest.raises(ValueError, match="mode"):
        Normalizer(STATE, ACTIONS, mode="minmax")
    assert n.pad_state(np.ones(3)).shape == (32,)


def test_openpi_norm_stats_json(tmp_path):
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps({"norm_stats": {"state": STATE, "actions": ACTIONS}}))
    for where in (path, tmp_path):
        n = load_norm_stats(where)
        assert (n.state_dim, n.action_dim, n.mode, n.convention) == (3, 2, "quantile", "openpi")
    nested = tmp_path / "ck"
    (nested / "assets" / "physical-intelligence" / "libero").mkdir(parents=True)
    (nested / "assets" / "physical-intelligence" / "libero" / "norm_stats.json").write_text(path.read_text())
    assert load_norm_stats(nested).action_dim == 2
    (nested / "assets" / "droid").mkdir()
    (nested / "assets" / "droid" / "norm_stats.json").write_text(path.read_text())
    with pytest.raises(NormStatsError, match="several robots"):
        load_norm_stats(nested)
    # our own file round-trips with its mode
    saved = Normalizer(STATE, ACTIONS, mode="zscore").save(tmp_path / "ours.json")
    again = load_norm_stats(saved)
    assert again.mode == "zscore"
    np.testing.assert_array_equal(again.unnormalize_actions(np.ones((1, 32))),
                                  Normalizer(STATE, ACTIONS, mode="zscore").unnormalize_actions(np.ones((1, 32))))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"state": STATE}))
    with pytest.raises(NormStatsError, match="norm_stats"):
        load_norm_stats(bad)


BROKEN = [
    ({"state": STATE, "actions": [1, 2]}, "norm_stats.actions: expected a mapping"),
    ({"actions": {"mean": ["a", "b"], "std": [1, 1]}}, "norm_stats.actions.mean: expected a list of numbers"),
    ({"actions": {"mean": [0, 0], "std": {"x": 1}}}, "norm_stats.actions.std: expected a list of numbers"),
    ({"actions": {"mean": [], "std": []}}, "norm_stats.actions.mean is empty"),
    ({"actions": ACTIONS, "oxygen_ros_eps": "x"}, None),  # an unknown key: ignored
]


@pytest.mark.parametrize("stats, says", BROKEN)
def test_a_malformed_statistics_file_is_refused_naming_the_fault(tmp_path, stats, says):
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps({"norm_stats": stats}))
    if says is None:
        assert load_norm_stats(path).action_dim == 2
        return
    with pytest.raises(NormStatsError, match=says):
        load_norm_stats(path)


@pytest.mark.parametrize("ours, says", [({"eps": "small"}, "eps must be a number >= 0"),
                                        ({"eps": -1.0}, "eps must be a number >= 0"),
                                        ({"mode": "minmax"}, "mode must be one of")])
def test_a_bad_oxygen_ros_entry_is_refused_naming_it(tmp_path, ours, says):
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps({"norm_stats": {"state": STATE, "actions": ACTIONS}, "oxygen_ros": ours}))
    with pytest.raises(NormStatsError, match=says):
        load_norm_stats(path)


def test_lerobot_processor_stats(tmp_path):
    flat = {f"observation.state.{k}": np.array(v, dtype=np.float32) for k, v in STATE.items()}
    flat |= {f"action.{k}": np.array(v, dtype=np.float32) for k, v in ACTIONS.items()}
    fname = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    save_file(flat, str(tmp_path / fname))
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "normalizer_processor", "state_file": fname,
         "config": {"eps": 1e-8, "norm_map": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILES"}}}]}))
    for where in (tmp_path, tmp_path / fname):
        n = load_norm_stats(where)
        assert (n.mode, n.action_mode, n.convention, n.action_dim) == ("zscore", "quantile", "lerobot", 2)
        np.testing.assert_allclose(n.normalize_state(np.array([1.5, -1.0, 6.0])), [1, 0, 1], rtol=1e-6)
