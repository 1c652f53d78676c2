"""The tiny VLA's cached operations against uncached references, and the pi05 preset."""

import numpy as np
import pytest
import torch

from oxygen_ros.core.model.cache import SlotView
from oxygen_ros.core.model.config import PI05, TINY, ModelConfig, VisionConfig, preset
from oxygen_ros.core.model.reference import reference_actions, reference_generate
from oxygen_ros.core.model.flow_time import flow_times, time_embedding
from oxygen_ros.core.model.vla import PrefixBatch, build_model

CAMS, SIZE, L = TINY.max_cameras, TINY.vision.image_size, TINY.max_token_len


def make_batch(lengths, camera_mask, *, seed=0, max_len=L, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    pixels = torch.rand(b, CAMS, 3, SIZE, SIZE, generator=g, dtype=dtype) * 2 - 1
    tokens = torch.randint(1, TINY.vocab_size, (b, max_len), generator=g)
    mask = torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]
    tokens = tokens * mask  # pad id 0 after the valid tokens
    return PrefixBatch(pixels, torch.tensor(camera_mask, dtype=torch.bool), tokens, mask)


@pytest.fixture(scope="module")
def model64():
    return build_model(TINY, dtype="float64", seed=1)


@pytest.fixture(scope="module")
def model32():
    return build_model(TINY, seed=1)


def cached_greedy(model, batch, limits, slot0=2):
    """Greedy decode through prefill + decode_step; rows stop at their own limit."""
    cache = model.new_cache(slots=8, max_len=160)
    res = model.prefill(batch, cache, [[slot0 + i] for i in range(batch.size)])
    lengths = res.lengths.tolist()
    tokens = [[int(t)] for t in res.logits.argmax(-1)]
    logits = [[res.logits[i]] for i in range(batch.size)]
    while any(len(t) < n for t, n in zip(tokens, limits)):
        live = [len(t) < n for t, n in zip(tokens, limits)]
        view = SlotView.of(slot0, lengths, live)
        out = model.decode_step(cache, view, torch.tensor([t[-1] for t in tokens]))
        for i in range(batch.size):
            if live[i]:
                tokens[i].append(int(out[i].argmax()))
                logits[i].append(out[i])
                lengths[i] += 1
    return tokens, [torch.stack(x) for x in logits], cache


def test_cached_decoding_matches_full_recompute_with_ragged_rows(model64):
    batch = make_batch([7, 20, 12], [[1, 1, 1], [1, 0, 1], [0, 1, 0]])
    limits = [6, 2, 4]
    tokens, logits, _ = cached_greedy(model64, batch, limits)
    ref_tokens, ref_logits = reference_generate(model64, batch, limits)
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_cached_decoding_float32_matches_reference(model32):
    batch = make_batch([5, 30], [[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    tokens, logits, _ = cached_greedy(model32, batch, [5, 3])
    ref_tokens, ref_logits = reference_generate(model32, batch, [5, 3])
    assert tokens == ref_tokens
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_denoise_over_cache_equals_joint_forward_and_leaves_prefix_untouched(model64):
    batch = make_batch([9, 25], [[1, 1, 1], [1, 0, 0]], seed=3)
    cache = model64.new_cache(slots=4, max_len=160)
    res = model64.prefill(batch, cache, [[1], [2]])
    before_k, before_v = cache.k.clone(), cache.v.clone()
    noise = torch.randn(2, TINY.action_horizon, TINY.action_dim, generator=torch.Generator().manual_seed(4),
                        dtype=torch.float64)
    actions = model64.denoise(cache, SlotView.of(1, res.lengths.tolist()), noise, steps=10)
    assert torch.equal(cache.k, before_k) and torch.equal(cache.v, before_v)
    expected = reference_actions(model64, batch, noise, steps=10)
    torch.testing.assert_close(actions, expected, rtol=0, atol=1e-10)
    # the actions really depend on what the prefix saw
    other = make_batch([9, 25], [[1, 1, 1], [1, 0, 0]], seed=99)
    res2 = model64.prefill(other, cache, [[1], [2]])
    actions2 = model64.denoise(cache, SlotView.of(1, res2.lengths.tolist()), noise, steps=10)
    assert (actions2 - actions).abs().amax(dim=(1, 2)).min() > 1e-4


#: openpi's π0.5 sampler for 10 steps: t = 1.0, then t += dt (dt = -1/10) in float32
OPENPI_T10 = [1.0, 0.89999998, 0.79999995, 0.69999993, 0.59999990, 0.49999991, 0.39999992, 0.29999992,
              0.19999993, 0.09999993]


def test_the_denoise_time_grid_is_openpis_float32_accumulation():
    times, dt = flow_times(10)
    assert times.dtype == torch.float32 and dt.dtype == torch.float32
    assert times.tolist() == pytest.approx(OPENPI_T10, abs=5e-9)
    assert times[1].item() != 0.9 and times[9].item() != 0.1  # not 1 - k/S


def test_denoise_follows_openpis_t_values(model64, monkeypatch):
    """The cached denoise equals an uncached float64 recomputation fed openpi's t values
    (written out above, not computed by the code under test)."""
    import oxygen_ros.core.model.reference as reference

    batch = make_batch([11], [[1, 0, 1]], seed=5)
    cache = model64.new_cache(slots=2, max_len=160)
    res = model64.prefill(batch, cache, [[0]])
    noise = torch.randn(1, TINY.action_horizon, TINY.action_dim, generator=torch.Generator().manual_seed(6),
                        dtype=torch.float64)
    actions = model64.denoise(cache, SlotView.of(0, res.lengths.tolist()), noise, steps=10)
    pinned = torch.tensor(OPENPI_T10, dtype=torch.float32), torch.tensor(-0.1, dtype=torch.float32)
    monkeypatch.setattr(reference, "flow_times", lambda steps: pinned)
    torch.testing.assert_close(actions, reference_actions(model64, batch, noise, steps=10), rtol=0, atol=1e-6)
    linear = torch.tensor([1.0 - k / 10 for k in range(10)], dtype=torch.float64), -0.1
    monkeypatch.setattr(reference, "flow_times", lambda steps: linear)
    assert (actions - reference_actions(model64, batch, noise, steps=10)).abs().max() > 1e-7, \
        "the grid matters at this precision (else the test above proves nothing)"


def test_the_time_embedding_is_openpis_posemb_sincos_sin_half_first():
    """The expert sees t as openpi's π0/π0.5 ``posemb_sincos`` embeds it (min period 4e-3,
    max period 4.0, the sines first, then the cosines): real π0.5 weights were trained on
    that layout, a swapped or rescaled one gives them a different time. The expected values
    are worked out here with numpy from openpi's definition, not by the code under test."""
    t = np.array([0.0, 0.5, 1.0])
    dim, min_period, max_period = 8, 4e-3, 4.0
    fraction = np.linspace(0.0, 1.0, dim // 2)
    period = min_period * (max_period / min_period) ** fraction
    angle = np.einsum("i,j->ij", t, 1.0 / period * 2 * np.pi)
    expected = np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)
    got = time_embedding(torch.tensor([0.0, 0.5, 1.0]), dim)
    assert got.shape == (3, dim)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=0, atol=1e-6)
    assert got[0].tolist() == [0.0] * 4 + [1.0] * 4, "t = 0: every sine 0, every cosine 1"


def test_padding_changes_nothing(model64):
    short = make_batch([11], [[1, 0, 1]], seed=5, max_len=L)
    longer_tokens = torch.zeros(1, L + 17, dtype=torch.long)
    longer_tokens[:, :L] = short.tokens
    longer_mask = torch.zeros(1, L + 17, dtype=torch.bool)
    longer_mask[:, :L] = short.token_mask
    longer = PrefixBatch(short.pixels, short.image_mask, longer_tokens, longer_mask)
    noise = torch.randn(1, TINY.action_horizon, TINY.action_dim, dtype=torch.float64)
    outs = []
    for batch in (short, longer):
        tokens, _, cache = cached_greedy(model64, batch, [5], slot0=0)
        res_len = int(batch.token_mask.sum() + batch.image_mask.sum() * TINY.vision.tokens_per_image)
        actions = model64.denoise(cache, SlotView.of(0, [res_len]), noise)
        outs.append((tokens, actions))
    assert outs[0][0] == outs[1][0]
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=1e-12)


def test_extend_equals_token_by_token_decoding(model64):
    batch = make_batch([6, 14], [[1, 1, 1], [1, 1, 1]], seed=7)
    question = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    qmask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    cache = model64.new_cache(slots=4, max_len=160)
    res = model64.prefill(batch, cache, [[0], [1]])
    got = model64.extend(cache, SlotView.of(0, res.lengths.tolist()), question, qmask)

    cache2 = model64.new_cache(slots=4, max_len=160)
    res2 = model64.prefill(batch, cache2, [[0], [1]])
    want = []
    for row, n in enumerate([4, 2]):
        length = int(res2.lengths[row])
        for j in range(n):
            out = model64.decode_step(cache2, SlotView.of(row, [length]), question[row, j : j + 1])
            length += 1
        want.append(out[0])
    torch.testing.assert_close(got, torch.stack(want), rtol=0, atol=1e-10)
    n0, n1 = int(res.lengths[0]), int(res.lengths[1])
    torch.testing.assert_close(cache.k[:, 0, :, : n0 + 4], cache2.k[:, 0, :, : n0 + 4], rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.k[:, 1, :, : n1 + 2], cache2.k[:, 1, :, : n1 + 2], rtol=0, atol=1e-12)


def test_prefill_fans_one_prefix_out_to_several_slots(model64):
    batch = make_batch([8], [[1, 1, 1]], seed=8)
    cache = model64.new_cache(slots=4, max_len=160)
    res = model64.prefill(batch, cache, [[0, 3]])
    n = int(res.lengths[0])
    assert torch.equal(cache.k[:, 0, :, :n], cache.k[:, 3, :, :n])
    assert torch.equal(cache.v[:, 0, :, :n], cache.v[:, 3, :, :n])


def test_seed_makes_initialisation_deterministic():
    a, b, c = build_model(TINY, seed=3), build_model(TINY, seed=3), build_model(TINY, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_bfloat16_runs_end_to_end():
    model = build_model(TINY, dtype="bfloat16")
    batch = make_batch([10], [[1, 1, 1]], dtype=torch.float32)
    cache = model.new_cache(slots=2, max_len=160)
    assert cache.k.dtype == torch.bfloat16
    res = model.prefill(batch, cache, [[0]])
    actions = model.denoise(cache, SlotView.of(0, res.lengths.tolist()), torch.randn(1, TINY.action_horizon, 32))
    # the actions, their projections and the time MLP stay float32, as in openpi: only the transformers
    # run in bfloat16, and the flow's x_t is integrated in float32
    assert actions.dtype == torch.float32 and torch.isfinite(actions).all()
    assert model.dtype == torch.bfloat16 and model.action_dtype == torch.float32
    assert {p.dtype for n, p in model.named_parameters() if n.startswith(("action_", "time_mlp"))} == {torch.float32}


def test_pi05_preset_builds_on_meta_with_published_sizes():
    model = build_model(PI05, device="meta")
    assert all(p.is_meta for p in model.parameters())
    counts = {name: sum(p.numel() for p in getattr(model, name).parameters())
              for name in ("vision", "language_model", "expert")}
    layer = model.language_model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (8 * 256, 2048)
    assert layer.self_attn.k_proj.weight.shape == (256, 2048)
    assert layer.mlp.gate_proj.weight.shape == (16384, 2048)
    assert model.language_model.embed_tokens.weight.shape == (257152, 2048)
    assert model.expert.layers[0].mlp.up_proj.weight.shape == (4096, 1024)
    assert model.expert.layers[0].self_attn.q_proj.weight.shape == (8 * 256, 1024)
    assert model.expert.layers[0].input_layernorm.dense.weight.shape == (3 * 1024, 1024)
    assert len(model.language_model.layers) == len(model.expert.layers) == 18
    assert model.vision.projector.weight.shape == (2048, 1152)
    assert len(model.vision.tower.encoder.layers) == 27
    assert PI05.vision.tokens_per_image == 256
    # SigLIP So400m/14 ~ 0.41 B, Gemma 2B ~ 2.5 B (with embeddings), expert ~ 0.4 B
    assert 0.39e9 < counts["vision"] < 0.43e9
    assert 2.4e9 < counts["language_model"] < 2.6e9
    assert 0.3e9 < counts["expert"] < 0.5e9


def test_config_rejects_inconsistent_sizes():
    with pytest.raises(ValueError, match="patch_size"):
        VisionConfig(hidden=8, depth=1, heads=2, mlp=8, image_size=30, patch_size=8)
    with pytest.raises(ValueError, match="share depth"):
        ModelConfig(name="x", vision=TINY.vision, vlm=TINY.vlm, expert=TINY.expert.__class__(
            width=32, depth=3, mlp=64, heads=4, kv_heads=1, head_dim=16), vocab_size=10)
    with pytest.raises(ValueError, match="unknown preset 'big'"):
        preset("big")
    with pytest.raises(ValueError, match="dtype"):
        build_model(TINY, dtype="float16")


@pytest.mark.parametrize("camera_mask", [[[1, 1, 1], [1, 1, 1]], [[1, 0, 1], [0, 1, 1]], [[0, 0, 1], [1, 1, 1]]])
def test_prefill_over_valid_tokens_only_changes_nothing(model64, camera_mask):
    """The prefill skips absent cameras and runs over the batch's longest valid prefix only; the
    prefix written to the pool, the logits and the actions equal those of the full padded prefill."""
    batch = make_batch([5, 19], camera_mask, seed=9)
    trimmed = model64.new_cache(slots=2, max_len=160)
    res = model64.prefill(batch, trimmed, [[0], [1]])
    full = model64.new_cache(slots=2, max_len=160)
    x, lengths = model64.prefix_states(batch)  # untrimmed: every camera, the whole padded prefix
    assert x.shape[1] == TINY.prefix_len and int(lengths.max()) < TINY.prefix_len
    logits = model64.write_prefix(full, x, lengths, torch.tensor([0, 1]))
    assert torch.equal(res.lengths, lengths)
    torch.testing.assert_close(res.logits, logits, rtol=0, atol=1e-10)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(trimmed.k[:, row, :, :n], full.k[:, row, :, :n], rtol=0, atol=1e-10)
        torch.testing.assert_close(trimmed.v[:, row, :, :n], full.v[:, row, :, :n], rtol=0, atol=1e-10)
    noise = torch.randn(2, TINY.action_horizon, TINY.action_dim, dtype=torch.float64)
    view = SlotView.of(0, lengths.tolist())
    torch.testing.assert_close(model64.denoise(trimmed, view, noise), model64.denoise(full, view, noise),
                               rtol=0, atol=1e-10)


def test_absent_cameras_skip_the_vision_tower(model64):
    """... and the VLM sees the longest valid prefix of the batch (row 0: 2 images + 5 tokens), not 3 images + L."""
    seen, vlm = [], []
    hooks = [model64.vision.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0])),
             model64.language_model.norm.register_forward_pre_hook(lambda module, args: vlm.append(args[0].shape))]
    try:
        model64.prefill(make_batch([5, 7], [[1, 0, 1], [0, 0, 1]]), model64.new_cache(2, 160), [[0], [1]])
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == [3]  # 3 images present of 6
    assert vlm[0][:2] == (2, 2 * TINY.vision.tokens_per_image + 5)


def test_a_view_is_kept_on_the_host_and_gives_its_rows_as_tensors():
    view = SlotView.of(2, [4, 9, 1], [True, False, True])
    assert (view.rows, view.stop, view.max_len) == (3, 5, 9)
    assert view.lengths.tolist() == [4, 9, 1] and view.lengths.dtype == torch.long
    assert view.live.tolist() == [True, False, True] and view.live.dtype == torch.bool
    assert view.lengths is view.lengths  # made once
    assert SlotView.of(0, [3]).live is None
    with pytest.raises(ValueError, match="one live flag per row: 2 flags for 3 rows"):
        SlotView.of(0, [4, 9, 1], [True, False])
    with pytest.raises(ValueError, match="at least one row"):
        SlotView.of(0, [])


def test_the_cameras_bytes_give_the_prefill_of_the_same_images_as_pixels_in_minus_one_to_one(model32):
    """A batch may carry the cameras' uint8 colour planes (as make_prefix_batch builds it, and a
    compiled prefill takes it) or floats already in [-1, 1]: the model gives the same prefix."""
    from oxygen_ros.core.model.vision import planes_to_pixels

    as_floats = make_batch([5, 7], [[1, 0, 1], [1, 1, 1]], dtype=torch.float32)
    planes = torch.randint(0, 256, as_floats.pixels.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    as_bytes = PrefixBatch(planes, as_floats.image_mask, as_floats.tokens, as_floats.token_mask)
    as_floats = PrefixBatch(planes_to_pixels(planes), as_floats.image_mask, as_floats.tokens, as_floats.token_mask)
    assert as_floats.pixels.min() >= -1 and as_floats.pixels.max() <= 1
    caches = [model32.new_cache(2, 160) for _ in range(2)]
    ours, floats = (model32.prefill(b, c, [[0], [1]]) for b, c in zip((as_bytes, as_floats), caches))
    assert torch.equal(ours.logits, floats.logits) and torch.equal(ours.lengths, floats.lengths)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


def test_the_compiled_form_of_the_activation_is_torchs_gelu_tanh():
    """Traced for compilation the MLPs' GELU is written as x * sigmoid(2u) (faster compiled on a
    CPU); it must be the same function as torch's tanh GELU, in both dtypes. The vision tower's
    MLPs (transformers' modules) must use it too; the Gemma MLPs call it directly."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    from oxygen_ros.core.model.gemma import GeluTanh, gelu_tanh

    x = torch.linspace(-12, 12, 20001)
    for dtype, tolerance in ((torch.float32, 2e-6), (torch.bfloat16, 2 ** -7)):
        graphs = EagerAndRecordGraphs()
        traced = torch.compile(gelu_tanh, backend=graphs, fullgraph=True)(x.to(dtype))
        assert "sigmoid" in graphs.graphs[0].code and "gelu" not in graphs.graphs[0].code
        expected = torch.nn.functional.gelu(x.to(dtype), approximate="tanh")
        assert traced.dtype == dtype
        scale = expected.float().abs().clamp(min=1.0)
        assert float(((traced.float() - expected.float()).abs() / scale).max()) <= tolerance, dtype
        assert torch.equal(gelu_tanh(x.to(dtype)), expected)  # eager: torch's own kernel
    model = build_model(TINY)
    assert all(isinstance(layer.mlp.activation_fn, GeluTanh) for layer in model.vision.tower.encoder.layers)
