"""The bucketed, compiled pieces give the eager model's results.

The fast tests run the bucketed pieces eager (``compile=False``: the padding,
masks and slot handling without the compile time); one end-to-end test
compiles a small engine and runs frames across batch sizes in every setting.
"""

import dataclasses
import pathlib

import numpy as np
import pytest
import torch

from engine_harness import frames_with_questions, prefix_batch

from oxygen_ros.core.benchmark import synthetic_observations
from oxygen_ros.core.engine import Engine, EngineConfig, FrameError, Question, SETTINGS
from oxygen_ros.core.model.cache import KVCache, SlotView
from oxygen_ros.core.model.compile_setup import compile_cache_dir, resolve_compile
from oxygen_ros.core.model import compiled as compiled_module
from oxygen_ros.core.model import package_builds
from oxygen_ros.core.model.compiled import CompiledVLA
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.static import StaticPieces
from oxygen_ros.core.model.vla import PrefixBatch, build_model
from oxygen_ros.core.model.buckets import batch_buckets, bucket_for, fit_prefill, prompt_buckets
from oxygen_ros.core.observation import make_prefix_batch
from oxygen_ros.core.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.default()


@pytest.fixture
def no_compiler():
    """A machine whose C++ compiler cannot be found (torch's own setting of where to look)."""
    import torch._inductor.config as inductor

    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        yield


def test_buckets_cover_every_size_up_to_the_limit():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert prompt_buckets(200) == (32, 64, 128, 200)
    assert [bucket_for(n, (1, 2, 4, 8, 12), "batch") for n in (1, 3, 5, 9, 12)] == [1, 4, 8, 12, 12]
    with pytest.raises(ValueError, match="a decode batch of 13 exceeds the largest compiled bucket 12"):
        bucket_for(13, (1, 2, 4, 8, 12), "a decode batch")


@pytest.mark.parametrize("counted", [True, False], ids=["lengths-counted", "lengths-from-the-mask"])
def test_a_prefill_takes_the_prompt_bucket_of_its_longest_prompt_whichever_row_it_is(counted):
    """Two observations whose prompts are 31 and 40 tokens run at the 48-token bucket: the
    second row's prompt is whole (a bucket sized from the first row alone would cut it to 32)."""
    lengths = [31, 40]
    tokens = torch.arange(1, 2 * 64 + 1).reshape(2, 64)
    mask = torch.arange(64)[None] < torch.tensor(lengths)[:, None]
    batch = PrefixBatch(torch.zeros(2, 1, 3, 4, 4, dtype=torch.uint8), torch.ones(2, 1, dtype=torch.bool),
                        tokens * mask, mask, tuple(lengths) if counted else None)
    part = fit_prefill(batch, 0, 2, (1, 2), (1,), (32, 48, 64))
    assert part.tokens.shape == (2, 48) and part.token_mask.sum(dim=1).tolist() == lengths
    torch.testing.assert_close(part.tokens, (tokens * mask)[:, :48])
    first_only = fit_prefill(batch, 0, 1, (1, 2), (1,), (32, 48, 64))
    assert first_only.tokens.shape == (1, 32)  # a row of 31 alone: the smallest bucket


def _twin(model, slots=6, length=TINY.prefix_len + 12):
    eager, static = model.new_cache(slots, length), model.new_cache(slots, length)
    return eager, static, CompiledVLA(model, static, steps=3, max_observations=2, compile=False)


def test_bucketed_prefill_writes_the_same_prefixes_and_logits(lively_tiny, tok):
    eager, static, pieces = _twin(lively_tiny)
    obs = synthetic_observations(3, TINY.vision.image_size, cameras=2, seed=1)
    batch = make_prefix_batch(obs, tok, TINY)
    dests = [[0, 4], [1], [2]]  # three observations: more than the largest bucket (2); one stored twice
    a = lively_tiny.prefill(batch, eager, dests)
    b = pieces.prefill(batch, static, dests)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    for slot in (0, 1, 2, 4):
        n = int(a.lengths[[0, 1, 2, 0][[0, 1, 2, 4].index(slot)]])
        torch.testing.assert_close(static.k[:, slot, :, :n], eager.k[:, slot, :, :n], atol=1e-5, rtol=0)
    # a batch whose builder did not count its prompts: counted from the mask, the same result
    uncounted = pieces.prefill(dataclasses.replace(batch, prompt_lengths=None), static, dests)
    assert torch.equal(uncounted.lengths, b.lengths) and torch.equal(uncounted.logits, b.logits)


def _mixed_cameras(tok, present):
    """Observations whose camera slots are present as ``present`` says (one row per observation)."""
    batch = make_prefix_batch(synthetic_observations(len(present), TINY.vision.image_size, cameras=3, seed=4),
                              tok, TINY)
    return dataclasses.replace(batch, image_mask=torch.tensor(present, dtype=torch.bool))


@pytest.mark.parametrize("present", [[[1, 0, 1], [0, 1, 0]], [[0, 0, 1]], [[0, 0, 0], [1, 1, 0]], [[1, 0, 0]],
                                     [[1, 1, 0], [1, 0, 0]]])
def test_bucketed_prefill_runs_over_the_robots_cameras_only_and_keeps_the_prefix(lively_tiny, tok, present):
    """A robot with 2 cameras on a model with 3 slots: the graphs take 2 slots, each row's present
    cameras first (row [1, 0, 1] becomes slots 0 and 2), and the prefix is the eager one."""
    eager, static, _ = _twin(lively_tiny)
    pieces = CompiledVLA(lively_tiny, static, steps=3, max_observations=2, max_cameras=2, compile=False)
    batch = _mixed_cameras(tok, present)
    encoded = []
    hook = lively_tiny.vision.register_forward_hook(lambda mod, args, out: encoded.append(args[0].shape[0]))
    try:
        dests = [[i] for i in range(batch.size)]
        a = lively_tiny.prefill(batch, eager, dests)
        encoded.clear()
        b = pieces.prefill(batch, static, dests)
    finally:
        hook.remove()
    assert encoded == [bucket_for(batch.size, pieces.observation_buckets, "batch") * 2]  # not 3 slots a row
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    for slot, n in enumerate(a.lengths.tolist()):
        torch.testing.assert_close(static.k[:, slot, :, :n], eager.k[:, slot, :, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(static.v[:, slot, :, :n], eager.v[:, slot, :, :n], atol=1e-5, rtol=0)


def test_prefill_graphs_take_only_the_robots_cameras(lively_tiny, tok):
    _, static, _ = _twin(lively_tiny)
    one = CompiledVLA(lively_tiny, static, steps=3, max_observations=2, max_cameras=1, compile=False)
    assert one.camera_buckets == (1,)
    assert CompiledVLA(lively_tiny, static, steps=3, max_observations=2, compile=False).camera_buckets == (3,)
    with pytest.raises(ValueError, match="cameras present of 2 exceeds the largest compiled bucket 1"):
        one.prefill(_mixed_cameras(tok, [[1, 1, 0]]), static, [[0]])
    with pytest.raises(ValueError, match="max_cameras must be 1..3"):
        CompiledVLA(lively_tiny, static, steps=3, max_observations=2, max_cameras=4, compile=False)


def test_the_engine_takes_at_most_max_cameras(lively_tiny, tok):
    assert Engine(lively_tiny, tok, EngineConfig(camera_names=("base", "wrist"))).max_cameras == 2
    assert Engine(lively_tiny, tok, EngineConfig()).max_cameras == TINY.max_cameras
    engine = Engine(lively_tiny, tok, EngineConfig(max_cameras=1, max_decode=4, steps_per_frame=2))
    two = synthetic_observations(1, TINY.vision.image_size, cameras=2)
    with pytest.raises(ValueError, match="2 cameras given, at most 1 are taken"):
        engine.step(two)
    assert engine.step(synthetic_observations(1, TINY.vision.image_size)).actions[0].shape[0] == TINY.action_horizon
    with pytest.raises(ValueError, match="max_cameras 4 exceeds the model's 3 camera slots"):
        Engine(lively_tiny, tok, EngineConfig(max_cameras=4))
    with pytest.raises(ValueError, match="2 camera_names but max_cameras is 1"):
        EngineConfig(max_cameras=1, camera_names=("a", "b"))


def test_bucketed_denoise_and_decode_match_eager_as_the_batch_changes(lively_tiny, tok, monkeypatch):
    eager, static, pieces = _twin(lively_tiny)
    assert pieces.denoise_loops  # a small expert on a CPU: the whole loop in one package
    batch = make_prefix_batch(synthetic_observations(4, TINY.vision.image_size, seed=2), tok, TINY)
    lengths = lively_tiny.prefill(batch, eager, [[0], [1], [2], [3]]).lengths.tolist()
    pieces.prefill(batch, static, [[0], [1], [2], [3]])
    noise = torch.randn(1, TINY.action_horizon, TINY.action_dim)
    view = SlotView.of(2, lengths[2:3])
    torch.testing.assert_close(pieces.denoise(static, view, noise, 3), lively_tiny.denoise(eager, view, noise, 3),
                               atol=1e-5, rtol=0)
    calls = []
    pieces.denoise(static, view, noise, before_step=lambda: calls.append(1))
    assert calls == [1]  # one pause point before the whole loop
    # as on CUDA, and for a large expert: one step's piece, called S times (the step an input)
    monkeypatch.setattr(compiled_module, "LOOP_EXPERT_LIMIT", 0)
    stepped = CompiledVLA(lively_tiny, static, steps=3, max_observations=2, compile=False)
    assert not stepped.denoise_loops
    torch.testing.assert_close(stepped.denoise(static, view, noise, 3), lively_tiny.denoise(eager, view, noise, 3),
                               atol=1e-5, rtol=0)
    rng = np.random.default_rng(0)
    for live in ([True], [True, False, True], [False, True, True, True], [True, True], [True, False, False, True]):
        view = SlotView.of(0, lengths[: len(live)], live)
        tokens = torch.tensor(rng.integers(3, 200, len(live)))
        on = torch.tensor(live)  # rows not live are padding: their logits are never read (and depend on
        # whatever the slot holds past its length, which the eager prefill no longer writes)
        torch.testing.assert_close(pieces.decode_step(static, view, tokens)[on],
                                   lively_tiny.decode_step(eager, view, tokens)[on], atol=1e-5, rtol=0)
        lengths = [n + 1 if on else n for n, on in zip(lengths, live)] + lengths[len(live):]
    for slot, n in enumerate(lengths):
        torch.testing.assert_close(static.k[:, slot, :, :n], eager.k[:, slot, :, :n], atol=1e-5, rtol=0)


def _greedy_steps(model, cache, lengths, live, tokens, remaining, allowed, eos, steps):
    """The reference for a decode round: ``steps`` eager decode steps, a row choosing the most likely
    allowed token and stopping after its end-of-sequence token or its ``remaining`` tokens."""
    lengths, tokens, chosen = list(lengths), list(tokens), [[] for _ in live]
    writing = [on and left > 0 for on, left in zip(live, remaining)]
    for t in range(steps):
        view = SlotView.of(0, lengths, writing)
        logits = model.decode_step(cache, view, torch.tensor(tokens))
        picked = logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1).tolist()
        for b, token in enumerate(picked):
            if writing[b]:
                chosen[b].append(token)
                lengths[b] += 1
                tokens[b] = token
                writing[b] = token != eos and remaining[b] > t + 1
    return chosen, lengths


@pytest.mark.skipif(not compiled_module.loops_can_write_in_place(),
                    reason="this torch cannot trace a while_loop that writes the pool (torch < 2.13)")
def test_a_decode_loop_chooses_the_tokens_of_step_by_step_greedy_decoding(lively_tiny, tok):
    """Up to K steps in one call, as many as asked: each row gets the tokens that eager steps give
    it, stops at its end-of-sequence token or its length limit (writing nothing into its slot
    after), and the ids outside ``allowed`` are never chosen."""
    eager = lively_tiny.new_cache(6, TINY.prefix_len + 12)
    static = lively_tiny.new_cache(6, TINY.prefix_len + 12)
    pieces = CompiledVLA(lively_tiny, static, steps=3, max_observations=2, decode_steps=4, compile=False)
    batch = make_prefix_batch(synthetic_observations(4, TINY.vision.image_size, seed=3), tok, TINY)
    lengths = lively_tiny.prefill(batch, eager, [[0], [1], [2], [3]]).lengths.tolist()
    pieces.prefill(batch, static, [[0], [1], [2], [3]])
    allowed = torch.arange(TINY.vocab_size) < 300
    live, remaining, tokens = [True, True, False, True], [4, 2, 0, 4], [7, 11, 0, 13]
    free, _ = _greedy_steps(lively_tiny, KVCache(eager.k.clone(), eager.v.clone()), lengths, live, tokens, remaining,
                            allowed, -1, 4)
    eos = free[0][1]  # row 0's second token ends it: the loop must stop that row there
    view = SlotView.of(0, lengths, live)

    # asked for 2 of its 4 steps: two columns, and only two positions written per row
    before = static.k.clone()
    two = pieces.decode(static, view, torch.tensor(tokens), torch.tensor(remaining), allowed, -1, 2).tolist()
    assert [row for row, on in zip(two, live) if on] == [row[:2] for row, on in zip(free, live) if on]
    assert torch.equal(static.k[:, 3, :, lengths[3] + 2:], before[:, 3, :, lengths[3] + 2:])
    static.k.copy_(before)

    want, ends = _greedy_steps(lively_tiny, eager, lengths, live, tokens, remaining, allowed, eos, 4)
    got = pieces.decode(static, view, torch.tensor(tokens), torch.tensor(remaining), allowed, eos, 9).tolist()
    assert len(want[0]) < 4 and len(want[1]) == 2  # row 0 ended at its EOS, row 1 at its limit
    assert all(len(row) == 4 for row in got)  # at most decode_steps a call
    for b in range(4):
        assert got[b][: len(want[b])] == want[b]
        assert all(t < 300 for t in got[b])
        n = ends[b]  # everything written is eager's, and nothing past a row's end
        torch.testing.assert_close(static.k[:, b, :, :n], eager.k[:, b, :, :n], atol=1e-5, rtol=0)
        assert torch.equal(static.k[:, b, :, n:], before[:, b, :, n:])
    with pytest.raises(ValueError, match="a decode runs at least one step, asked for 0"):
        pieces.decode(static, view, torch.tensor(tokens), torch.tensor(remaining), allowed, eos, 0)

    # as on CUDA (a captured graph replays fixed work): one step a call, however many are asked for,
    # over decode-step buckets
    static.k.copy_(before)
    one = CompiledVLA(lively_tiny, static, steps=3, max_observations=2, decode_steps=4, compile=False,
                      decode_loop=False)
    assert one.decode_steps == 1 and all(w.startswith("decode batch") and "steps" not in w
                                         for w, name, _ in one.buckets() if name.startswith("decode"))
    got = one.decode(static, view, torch.tensor(tokens), torch.tensor(remaining), allowed, eos, 9).tolist()
    assert [row for row, on in zip(got, live) if on] == [row[:1] for row, on in zip(want, live) if on]
    with pytest.raises(ValueError, match="decode_steps must be >= 1, got 0"):
        CompiledVLA(lively_tiny, static, steps=3, max_observations=2, decode_steps=0, compile=False)


def test_bucketed_pieces_refuse_what_they_were_not_built_for(lively_tiny):
    eager, static, pieces = _twin(lively_tiny)
    noise = torch.zeros(1, TINY.action_horizon, TINY.action_dim)
    with pytest.raises(ValueError, match="compiled for 3 denoise steps, asked for 5"):
        pieces.denoise(static, SlotView.of(0, [4]), noise, 5)
    with pytest.raises(ValueError, match="reads slots from 0, got a view from slot 2"):
        pieces.decode_step(static, SlotView.of(2, [4]), torch.tensor([1]))
    with pytest.raises(ValueError, match="runs on the cache it was built for"):
        pieces.decode_step(eager, SlotView.of(0, [4]), torch.tensor([1]))
    floats = prefix_batch(TINY, [4])  # pixels already in [-1, 1]: not what the graphs were built for
    with pytest.raises(ValueError, match="takes the cameras' uint8 colour planes.*got pixels of torch.float32"):
        pieces.prefill(floats, static, [[0]])


def test_recompiles_counts_the_graphs_loaded_after_the_warm_up(lively_tiny, monkeypatch, tmp_path):
    """``recompiles`` (the engine's figure of graphs built while serving, which a steady state
    never does) is every graph loaded before the warm-up, 0 after it while the frames stay in
    the warmed buckets, and counts a graph loaded again later. The packaged pieces are stubbed
    (the bucket's eager piece, nothing compiled): the count, not the compiler, is under test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cache = lively_tiny.new_cache(4, TINY.prefix_len + 12)
    pieces = CompiledVLA(lively_tiny, cache, steps=3, max_observations=1, decode_loop=False, denoise_loop=False)
    assert pieces.compiling, "the packaged path, whose loads are counted"
    eager = StaticPieces(lively_tiny, cache, 3)

    class Stub:
        built = False

        def __init__(self, model, cache, name, steps, inputs, cache_dir):
            self.piece = getattr(eager, name)

        def __call__(self, *inputs):
            return self.piece(*inputs)

    built = []
    monkeypatch.setattr(compiled_module, "PackagedPiece", Stub)
    monkeypatch.setattr(package_builds, "build_packages", lambda model, cache, builds, done: built.extend(builds))
    monkeypatch.setattr(package_builds, "probes", lambda device: False)
    # where a package would be kept (a name per piece: nothing is built here)
    monkeypatch.setattr(compiled_module, "package_path", lambda cache_dir, model, name, *rest: tmp_path / name)
    allowed = torch.ones(TINY.vocab_size, dtype=torch.bool)

    def decode():
        return pieces.decode(cache, SlotView.of(0, [TINY.prefix_len]), torch.tensor([5]), torch.tensor([4]),
                             allowed, -1, 1)

    decode()
    assert pieces.graphs == 1 and pieces.recompiles == 1, "not warmed up: every graph counts"
    notes = []
    pieces.warm_up(note=notes.append)
    assert pieces.warmed and pieces.graphs == pieces.bucket_count  # the decode bucket's was loaded already
    assert len(built) == pieces.bucket_count  # none was in the (empty) cache
    n = pieces.bucket_count
    assert notes == [f"compiling {n} of the {n} shape buckets, those not in the compile cache ({pieces.cache_dir}; "
                     "several at a time, a minute or two when it is empty) ..."]
    assert pieces.recompiles == 0
    decode()
    assert pieces.recompiles == 0, "a warmed bucket loads nothing"
    pieces.unload()  # the decode bucket's graph loads again
    decode()
    assert pieces.recompiles == 1


def test_compile_setting_says_why_it_runs_eager():
    assert resolve_compile("off", "cpu").reason == "compile is off"
    assert not resolve_compile("auto", "cpu").enabled  # CPU default: eager (see the README's figures)
    assert "not supported on meta" in resolve_compile("on", "meta").reason
    with pytest.raises(ValueError, match="compile must be one of auto, on, off, got 'yes'"):
        resolve_compile("yes", "cpu")
    with pytest.raises(ValueError, match="compile must be one of"):
        EngineConfig(compile="fast")


def test_compile_auto_compiles_on_cuda_where_the_compiler_works(monkeypatch):
    """The default ``compile:=auto`` compiles on a GPU (where the benchmark showed it pays off)
    and runs eager on a CPU, on a machine where both could run packages (the device's check
    stubbed: there is no GPU here)."""
    from oxygen_ros.core.model import compile_setup

    monkeypatch.setattr(compile_setup, "compile_unavailable", lambda device: None)
    assert resolve_compile("auto", torch.device("cuda")) == compile_setup.CompileDecision(True, "")
    assert resolve_compile("auto", torch.device("cpu")) == \
        compile_setup.CompileDecision(False, "compile=auto runs eager on cpu")
    assert resolve_compile("on", torch.device("cpu")).enabled


def test_a_compile_error_is_told_in_one_line_with_its_type():
    """torch's compile errors carry whole graphs (hundreds of lines): the reason an engine logs
    once keeps the error's type and its first lines. Seen with torch 2.11, which cannot trace
    the CPU decode loop's in-place writes."""
    from oxygen_ros.core.model.compile_setup import REASON_CHARS, failure_reason

    graph = "\n".join(f"    %node_{i} : Tensor = placeholder[target=node_{i}]" for i in range(300))
    exc = RuntimeError("This higher order operator doesn't work\n\nEncountered input mutation\n"
                       f"  Higher Order Operator: torch.while_loop\n{graph}")
    reason = failure_reason(exc)
    assert reason == ("compilation failed: RuntimeError: This higher order operator doesn't work Encountered input "
                      "mutation Higher Order Operator: torch.while_loop (more in the error's full text)")
    assert "\n" not in failure_reason(RuntimeError("x" * 5000)) and len(failure_reason(RuntimeError("x" * 5000))) < \
        REASON_CHARS + 60


def test_a_compile_that_failed_for_a_full_disk_says_so_first(tmp_path):
    """A cache on a full disk failed with a long g++ command line as the reason, and "No space
    left on device" nowhere in the line (a walkthrough, a 3 MB tmpfs)."""
    from oxygen_ros.core.model.compile_setup import failure_reason

    error = RuntimeError("CppCompileError: C++ compile error\nCommand: g++ /tmp/x/wrapper.cpp -O1\nOutput:\n"
                         "wrapper.cpp: fatal error: error writing to /tmp/ccX.s: No space left on device")
    reason = failure_reason(error, tmp_path)
    assert reason.startswith(f"compilation failed: the disk of the compile cache ({tmp_path}, "), reason
    assert "is full: free some space, or point OXYGEN_COMPILE_CACHE at another disk. RuntimeError: " in reason
    other = failure_reason(RuntimeError("CppCompileError: undefined reference"), tmp_path)
    assert other == "compilation failed: RuntimeError: CppCompileError: undefined reference"  # room on this disk



class Unpicklable(RuntimeError):
    """An error holding a module, as one of torch 2.11's compile errors did."""

    def __init__(self, message):
        super().__init__(message)
        self.module = torch


def test_a_build_that_fails_in_a_worker_reaches_the_engine_with_its_type_and_text(monkeypatch):
    """A worker process hands a failed build back pickled; one of torch's compile errors (holding a
    module) could not be, and the engine's reason read "cannot pickle 'module' object". The worker
    now sends the error's type and text, naming the build."""
    import pickle

    from oxygen_ros.core.model import package_builds

    def failing_build(*args):
        raise Unpicklable("Encountered input mutation during higher order op tracing")

    monkeypatch.setattr(package_builds, "build_package", failing_build)
    with pytest.raises(package_builds.BuildFailed) as info:
        package_builds.build_or_fail(None, None, "decode_loop", 2, (), pathlib.Path("/nonexistent/package"))
    back = pickle.loads(pickle.dumps(info.value))  # what the parent receives
    assert str(back) == "building decode_loop: Unpicklable: Encountered input mutation during higher order op tracing"
    with pytest.raises(TypeError, match="cannot pickle 'module' object"):
        pickle.dumps(Unpicklable("the error itself"))


def test_without_a_compiler_packages_cannot_be_built_and_say_why(no_compiler):
    from oxygen_ros.core.model.compile_setup import build_unavailable

    assert "C++ compiler" in build_unavailable("cpu")
    assert resolve_compile("on", "cpu").enabled, "what a warm cache holds loads without a compiler"


def test_without_a_compiler_and_a_cold_cache_the_engine_runs_eager_and_says_why(lively_tiny, tok, no_compiler,
                                                                               monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    engine = Engine(lively_tiny, tok, EngineConfig(compile="on", max_active=2, max_decode=4, steps_per_frame=2))
    res = engine.step(synthetic_observations(1, TINY.vision.image_size))  # its first frame warms it up
    assert engine.compiled is None and engine.compile_reason.startswith("no working C++ compiler")
    assert f"the compile cache ({tmp_path}) lacks" in engine.compile_reason
    assert res.actions[0].shape == (TINY.action_horizon, TINY.action_dim) and engine.recompiles == 0
    assert not list(tmp_path.rglob("*.pt2")), "nothing was built"


def test_compile_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("OXYGEN_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache_dir() == tmp_path / "oxygen_ros" / "compile"


def test_the_compile_cache_follows_oxygen_compile_cache_within_a_process_unless_torchs_is_chosen(monkeypatch,
                                                                                                 tmp_path):
    """A long-lived Python (a notebook, a test session) that points OXYGEN_COMPILE_CACHE elsewhere gets
    the new folder: the variable the first call set for torch is not taken for the user's choice."""
    from oxygen_ros.core.model import compile_setup
    from oxygen_ros.core.model.compile_setup import use_compile_cache

    # what this process's earlier calls set, put back after the test with the variable itself: a later
    # test must find the two as they were (else the variable they set reads as the user's choice)
    monkeypatch.setattr(compile_setup, "_set_here", compile_setup._set_here)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # unset (and put back as it was after the test)
    monkeypatch.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path / "a"))
    assert use_compile_cache() == tmp_path / "a"
    monkeypatch.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path / "b"))
    assert use_compile_cache() == tmp_path / "b" and (tmp_path / "b").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch's"))  # the user's choice wins
    assert use_compile_cache() == tmp_path / "torch's"


def _compiled_frames_checked_against_eager(model, tok, setting: str):
    """A compiled engine, warmed up, and its frames, checked against an eager engine's: identical
    greedy tokens, actions within 1e-5, nothing compiled after the warm-up. Returns the engine,
    the warm-up's progress (done, total, what) and the compiled frames."""
    lengths = [5, 6, 0, 4, 6, 2, 0, 5]  # requests start and finish inside a bucket and across buckets
    # k = 2: a compiled decode call runs two steps, a request finishing between them
    common = dict(setting=setting, max_decode=6, steps_per_frame=2, denoise_steps=2, max_active=3,
                  max_observations_per_frame=1, language_every_n_frames=0, camera_names=("base",))
    eager = frames_with_questions(Engine(model, tok, EngineConfig(compile="off", **common)), lengths,
                                  TINY.vision.image_size)
    engine = Engine(model, tok, EngineConfig(compile="on", **common))
    progress = []
    engine.warm_up(lambda done, total, what: progress.append((done, total, what)))
    assert engine.compiled is not None, engine.compile_reason
    compiled = frames_with_questions(engine, lengths, TINY.vision.image_size)
    assert compiled[1] == eager[1]  # identical greedy tokens
    for a, b in zip(compiled[0], eager[0]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert engine.recompiles == 0
    return engine, progress, compiled


@pytest.mark.parametrize("setting", SETTINGS)
def test_compiled_engine_frames_match_eager_across_batch_sizes(lively_tiny, tok, setting, monkeypatch,
                                                               tmp_path_factory):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compile-cache"))
    engine, progress, compiled = _compiled_frames_checked_against_eager(lively_tiny, tok, setting)
    # a frame's two decode steps are one call of the loop's package (one step a call where this
    # torch cannot export the loop: test_the_pieces_as_cuda_runs_them_give_eager_frames_on_the_cpu)
    decode = "decode batch 4 (up to 2 steps)" if engine.compiled.loops else "decode batch 4"
    assert progress[-1][:2] == (5, 5) and any(w.startswith(decode) for _, _, w in progress)
    assert engine.compiled.loops == compiled_module.loops_can_write_in_place()
    assert all(w.endswith(("(compiled)", "(from the cache)")) for _, _, w in progress)
    if setting == "oxygen":
        assert len(set(compiled[2])) >= 2  # the decode batch changed during the run


@pytest.mark.parametrize("setting", ["parallel", "oxygen"])
def test_the_pieces_as_cuda_runs_them_give_eager_frames_on_the_cpu(lively_tiny, tok, setting, monkeypatch,
                                                                   tmp_path_factory):
    """What a CUDA device runs, less the graph capture: decode one step a call and the denoise as
    one step's package called S times. Compiled here, its frames are eager's. The decode is laid
    out so because this torch is taken for one that cannot export the decode loop's writes to the
    pool (2.11): what a CPU engine on such a torch runs."""
    import functools

    from oxygen_ros.core import model_runner
    from oxygen_ros.core.model import compiled

    cache = tmp_path_factory.getbasetemp() / "compile-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.setattr(compiled, "loops_can_write_in_place", lambda: False)
    monkeypatch.setattr(model_runner, "CompiledVLA", functools.partial(CompiledVLA, denoise_loop=False))
    engine, progress, _ = _compiled_frames_checked_against_eager(lively_tiny, tok, setting)
    assert engine.compiled.graphs == 5, progress  # one package per bucket: the denoise's is one step
    packages = cache / "aoti"
    assert len(list(packages.glob("decode-*.pt2"))) == 3  # batches 1, 2, 4: one step each
    assert len(list(packages.glob("denoise_step-*.pt2"))) == 1


def test_the_decode_loop_is_used_where_this_torch_can_export_it(lively_tiny):
    """The decode's layout is chosen by a small export tried in its place: it succeeds where the
    decode loop's own export does (the pinned torch 2.13) and fails where that fails (torch 2.11:
    "input mutation"), and the pieces use the loop exactly then."""
    from oxygen_ros.core.model.compile_setup import loops_can_write_in_place, small_loop_exports
    from oxygen_ros.core.model.packaged import export_piece

    cache = lively_tiny.new_cache(2, TINY.prefix_len + 8)
    pieces = CompiledVLA(lively_tiny, cache, steps=2, max_observations=1, decode_steps=2, compile=False,
                         decode_loop=True)
    (what, name, inputs), *_ = pieces.buckets()
    assert name == "decode_loop", what
    try:
        export_piece(lively_tiny, cache, name, 2, inputs)
        exported = True
    except Exception:
        exported = False
    assert small_loop_exports() == exported == loops_can_write_in_place()
    assert CompiledVLA(lively_tiny, cache, steps=2, max_observations=1, compile=False).loops == exported


def test_a_second_engine_loads_every_package_from_the_cache_and_gives_the_same_frames(lively_tiny, tok,
                                                                                      monkeypatch, tmp_path_factory):
    """What makes a second start fast: nothing is compiled again, and the loaded packages run on the
    new engine's own pool and the model's own weights. (The cache is the one the test above fills,
    with the same sizes, so that CI compiles them once.)"""
    cache_dir = tmp_path_factory.getbasetemp() / "compile-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    common = dict(setting="oxygen", max_decode=6, steps_per_frame=2, denoise_steps=2, max_active=3,
                  max_observations_per_frame=1, language_every_n_frames=0, camera_names=("base",),
                  compile="on")
    first = Engine(lively_tiny, tok, EngineConfig(**common))
    first.warm_up()
    assert first.compiled is not None, first.compile_reason
    assert first.compiled.graphs == 5  # decode 1, 2 and 4, denoise 1, prefill 1
    packages = sorted(p.name for p in (cache_dir / "aoti").glob("*.pt2"))
    assert len(packages) >= 5

    second = Engine(lively_tiny, tok, EngineConfig(**common))
    progress, notes = [], []
    second.warm_up(lambda done, total, what: progress.append(what), notes.append)
    assert second.compiled.built == 0 and second.compiled.graphs == 5, progress
    assert notes == [f"loading the 5 compiled shape buckets from the compile cache ({cache_dir})"]
    assert all(w.endswith("(from the cache)") for w in progress), progress
    assert sorted(p.name for p in (cache_dir / "aoti").glob("*.pt2")) == packages

    lengths = [3, 0, 2, 3]
    size = TINY.vision.image_size
    a, b = frames_with_questions(first, lengths, size), frames_with_questions(second, lengths, size)
    assert a[1] == b[1]
    for x, y in zip(a[0], b[0]):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)
    eager = frames_with_questions(Engine(lively_tiny, tok, EngineConfig(**dict(common, compile="off"))), lengths, size)
    for x, y in zip(b[0], eager[0]):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)

    # another model's sizes never reuse these packages
    other = dataclasses.replace(lively_tiny.config, max_token_len=lively_tiny.config.max_token_len + 8)
    from oxygen_ros.core.model.packaged import package_key

    cache = first.pool.cache
    inputs = (torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.bool))
    key = package_key(lively_tiny, "decode", 2, cache, inputs)
    lively_tiny.config, saved = other, lively_tiny.config
    try:
        assert package_key(lively_tiny, "decode", 2, cache, inputs) != key
    finally:
        lively_tiny.config = saved


def test_a_package_gives_the_same_through_its_library_as_through_torchs_loader(lively_tiny, tok, monkeypatch,
                                                                               tmp_path_factory):
    """On the CPU a package runs through its library's C interface (the interpreter lock released);
    it gives what torch's own loader gives, and a bad call or a model without the package's weights
    is refused naming the package. (The packages of the tests above: nothing is compiled here.)"""
    from oxygen_ros.core.model.aoti_library import AOTILibrary
    from oxygen_ros.core.model.packaged import PackagedPiece, _loaded, _Piece

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compile-cache"))
    engine = Engine(lively_tiny, tok, EngineConfig(setting="oxygen", max_decode=6, steps_per_frame=2,
                                                   denoise_steps=2, max_active=3, max_observations_per_frame=1,
                                                   language_every_n_frames=0, camera_names=("base",), compile="on"))
    engine.warm_up()
    name = "decode_loop" if engine.compiled.loops else "decode"  # one step where torch cannot export the loop
    piece = next(p for key, p in engine.compiled.loaded.items() if key[0] == name and key[1] == (2,))
    assert isinstance(piece, PackagedPiece) and isinstance(piece.library, AOTILibrary)
    state = dict(_Piece(lively_tiny, name, 2).named_parameters())
    cache = engine.pool.cache
    cache.k.normal_(generator=torch.Generator().manual_seed(0))
    cache.v.normal_(generator=torch.Generator().manual_seed(1))
    # two rows, the second not live (the loop: two steps of its two)
    inputs = (torch.tensor([5, 9]), torch.tensor([3, 7]), torch.tensor([True, False]))
    if name == "decode_loop":
        inputs += (torch.tensor([2, 2]), torch.ones(TINY.vocab_size, dtype=torch.bool), torch.tensor([-1]),
                   torch.arange(2), torch.tensor([2]))
    k0, v0 = cache.k.clone(), cache.v.clone()
    with torch.inference_mode():
        ours = piece.library(cache.k, cache.v, *inputs)
        ours_k, ours_v = cache.k.clone(), cache.v.clone()
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        theirs = _loaded(piece.path, state)(cache.k, cache.v, *inputs)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    assert torch.equal(ours_k, cache.k) and torch.equal(ours_v, cache.v)  # the same writes into the pool
    assert not torch.equal(k0, cache.k)  # ... and there were some

    with pytest.raises(ValueError, match=rf"{piece.path.stem}.*takes {2 + len(inputs)} tensors, got 4"):
        piece.library(cache.k, cache.v, *inputs[:2])
    some = piece.library.constant_names()[0]  # one the decode loop needs (it never reads the vision tower's)
    with pytest.raises(RuntimeError, match=rf"{piece.path.stem}.*needs constants the model does not have.*{some}"):
        AOTILibrary(piece.path, {n: t for n, t in state.items() if n != some})


@pytest.mark.parametrize("child_crashes", [False, True])
def test_a_library_that_would_crash_the_process_is_refused_and_the_engine_runs_eager(lively_tiny, tok, monkeypatch,
                                                                                   tmp_path_factory, child_crashes):
    """Where a package's library crashes a process that creates its container (CUDA packages on an
    H200 machine: ``load_probe.py``), a child tries it first: the engine then runs eager and says
    why, instead of dying. Here the CPU's libraries are probed too; the child either creates the
    real container or is killed the way that machine's was. Whether its packages come from the
    tests above (the cache) or are built here, a healthy child leaves the engine compiled."""
    from oxygen_ros.core.model import load_probe

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compile-cache"))
    monkeypatch.setattr(load_probe, "PROBED_DEVICES", ("cpu",))
    monkeypatch.setattr(load_probe, "_verdicts", {})
    if child_crashes:
        monkeypatch.setattr(load_probe, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    engine = Engine(lively_tiny, tok, EngineConfig(setting="oxygen", max_decode=6, steps_per_frame=2,
                                                   denoise_steps=2, max_active=3, max_observations_per_frame=1,
                                                   language_every_n_frames=0, camera_names=("base",), compile="on"))
    engine.warm_up()
    res = engine.step(synthetic_observations(1, TINY.vision.image_size))
    assert res.actions[0].shape == (TINY.action_horizon, TINY.action_dim)
    if child_crashes:
        assert engine.compiled is None
        assert "killed a test process (SIGSEGV), so loading it here would kill this one" in engine.compile_reason
    else:
        assert engine.compiled is not None and not engine.compile_reason, engine.compile_reason
        assert engine.compiled.graphs > 0


def test_a_library_that_would_crash_the_process_stops_the_warm_up_before_the_other_buckets_are_built(
        lively_tiny, tok, monkeypatch, tmp_path):
    """On a probed device the first bucket is built and tried alone: on a machine where no library
    can load, the node starts eager after one build, not after all of them."""
    from oxygen_ros.core.model import load_probe

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(load_probe, "PROBED_DEVICES", ("cpu",))
    monkeypatch.setattr(load_probe, "_verdicts", {})
    monkeypatch.setattr(load_probe, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    engine = Engine(lively_tiny, tok, EngineConfig(setting="oxygen", max_decode=6, steps_per_frame=2,
                                                   denoise_steps=2, max_active=3, max_observations_per_frame=1,
                                                   language_every_n_frames=0, camera_names=("base",), compile="on"))
    progress = []
    engine.warm_up(lambda done, total, what: progress.append((done, total, what)))
    assert engine.compiled is None and "killed a test process (SIGSEGV)" in engine.compile_reason
    assert len(progress) == 1 and progress[0][:2] == (1, 5) and progress[0][2].endswith("(compiled)")
    assert len(list((tmp_path / "cache" / "aoti").glob("*.pt2"))) == 1


def test_packages_built_in_worker_processes_run_on_this_models_weights(lively_tiny, tok, monkeypatch, tmp_path,
                                                                       capfd):
    """A cold start builds its packages several at a time, each in a worker process on a model of the
    same sizes with random weights: loaded here, they run on this model's own weights and give what
    the eager model gives; a warm-up then finds them in the cache. The builds print none of torch's
    own deprecation warnings."""
    from oxygen_ros.core.model.package_builds import Build, build_packages, worker_count
    from oxygen_ros.core.model.packaged import package_path

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert worker_count(lively_tiny, 1) == 1 and worker_count(lively_tiny, 50) >= 1
    eager, static = lively_tiny.new_cache(2, TINY.prefix_len + 8), lively_tiny.new_cache(2, TINY.prefix_len + 8)
    pieces = CompiledVLA(lively_tiny, static, steps=2, max_observations=1)
    builds = []
    for b in (1, 2):
        inputs = (torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.bool))
        builds.append(Build(f"decode batch {b}", "decode", 2, inputs,
                            package_path(tmp_path, lively_tiny, "decode", 2, static, inputs)))
    done = []
    build_packages(lively_tiny, static, builds, lambda b: done.append(b.what), workers=2)
    assert sorted(done) == ["decode batch 1", "decode batch 2"] and all(b.path.exists() for b in builds)
    printed = capfd.readouterr()
    assert "FutureWarning" not in printed.err + printed.out, printed.err[-2000:]

    batch = make_prefix_batch(synthetic_observations(2, TINY.vision.image_size, seed=4), tok, TINY)
    lengths = lively_tiny.prefill(batch, eager, [[0], [1]]).lengths.tolist()
    lively_tiny.prefill(batch, static, [[0], [1]])
    view, tokens = SlotView.of(0, lengths), torch.tensor([17, 23])
    torch.testing.assert_close(pieces.decode_step(static, view, tokens), lively_tiny.decode_step(eager, view, tokens),
                               atol=1e-5, rtol=0)
    assert pieces.graphs == 1 and pieces.built == 0  # loaded from the cache, not built again


def test_an_interrupt_while_packages_build_stops_the_builds_and_leaves_no_half_file(lively_tiny, monkeypatch,
                                                                                     tmp_path):
    """Ctrl-C during a cold start's builds: the pool, shut down on leaving, waited for every build
    queued, and the command went on for a minute and a half without a word (a walkthrough). The
    builds running are stopped (their half-written files removed) and those queued never start."""
    from oxygen_ros.core.model.package_builds import Build, build_packages
    from oxygen_ros.core.model.packaged import package_path

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    static = lively_tiny.new_cache(4, TINY.prefix_len + 8)
    builds = []
    for b in (1, 2, 3, 4):
        inputs = (torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.bool))
        builds.append(Build(f"decode batch {b}", "decode", 2, inputs,
                            package_path(tmp_path, lively_tiny, "decode", 2, static, inputs)))

    def interrupted(build):
        raise KeyboardInterrupt  # as Ctrl-C in the command, once the first package is written

    with pytest.raises(KeyboardInterrupt):
        build_packages(lively_tiny, static, builds, interrupted, workers=2)
    written = [b for b in builds if b.path.exists()]
    assert 1 <= len(written) < len(builds), [b.what for b in written]  # the queued ones never started
    assert not list(builds[0].path.parent.glob("*.tmp.pt2")), "a half-written package was left in the cache"


def test_a_gpu_packages_kernel_binaries_are_extracted_beside_its_library(tmp_path):
    """A CUDA package keeps its kernels' machine code in files of its own (``*.cubin``), which its
    library reads at its first run from the folder named to its container: they are extracted
    once, with the library, into ``<package>.kernels``. A CPU package has none, and no folder."""
    import zipfile

    from oxygen_ros.core.model.aoti_library import _kernels, extract_library

    gpu, cpu = tmp_path / "decode-gpu.pt2", tmp_path / "decode-cpu.pt2"
    model = "decode-gpu.tmp/data/aotinductor/model/"
    with zipfile.ZipFile(gpu, "w") as z:
        z.writestr(model + "wrapper.so", b"library")
        z.writestr(model + "triton_a.cubin", b"kernel a")
        z.writestr(model + "triton_b.cubin", b"kernel b")
        z.writestr(model + "wrapper.cpp", b"source")
    with zipfile.ZipFile(cpu, "w") as z:
        z.writestr("decode-cpu.tmp/data/aotinductor/model/wrapper.so", b"library")
    assert extract_library(gpu) == tmp_path / "decode-gpu.so" and (tmp_path / "decode-gpu.so").read_bytes() == b"library"
    assert _kernels(gpu) == tmp_path / "decode-gpu.kernels"
    assert {p.name: p.read_bytes() for p in _kernels(gpu).iterdir()} == {"triton_a.cubin": b"kernel a",
                                                                         "triton_b.cubin": b"kernel b"}
    assert extract_library(cpu) == tmp_path / "decode-cpu.so" and _kernels(cpu) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode-cpu.pt2", "decode-cpu.so", "decode-gpu.kernels",
                                                          "decode-gpu.pt2", "decode-gpu.so"]  # no temporary left


def _mixed_frames(engine, observations):
    """What the node's frames bring that the batch-size test leaves out: two observations a frame
    with one camera of two missing, prompts in both buckets and at their edges, questions with
    text (one cut to max_question_tokens) on new and older observations, a cancel while
    decoding, and a frame failed in its decode. Per frame: tokens, actions, error."""
    long_q = "what color is the block on the left side of the table and why is it there"
    script = [([0], [(long_q, "a", 6)], [], None), ([1], [("hi", "b", 2), ("what now", "c", 5)], [], None),
              ([2, 3], [("left?", "d", 1)], [], None), ([], [(long_q, "e", 6)], [], None),
              ([4], [], ["c", "e"], None), ([5, 0], [("and?", "f", 4)], [], "decode"),
              ([1, 2], [("x", "g", 3)], [], None)] + [([], [], [], None)] * 6
    frames = []
    for obs, questions, cancels, fail in script:
        cancelled = [(e.client_id, e.finish_reason) for e in engine.requests.cancel_clients(cancels)]

        def pause(work, fail=fail):
            if work == fail:
                raise RuntimeError("injected fault")

        engine.pause_point = pause if fail else None
        try:
            res, error = engine.step([observations[i] for i in obs],
                                     [Question(t, client_id=c, max_tokens=n) for t, c, n in questions]), None
        except FrameError as exc:
            res, error = exc.result, str(exc.__cause__)
        engine.pause_point = None
        frames.append((cancelled, [(e.client_id, e.token_id, e.finish_reason) for e in res.tokens],
                       [a.copy() for a in res.actions], error))
    return frames


def test_compiled_frames_match_eager_with_the_inputs_a_node_brings(tok, monkeypatch, tmp_path_factory):
    from conftest import lively
    from oxygen_ros.core.benchmark import with_prompt_tokens
    from oxygen_ros.core.observation import Observation

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "compile-cache"))
    model = lively(build_model(dataclasses.replace(TINY, max_token_len=48), seed=2))  # prompt buckets 32 and 48
    observations = []
    for i, (o, n) in enumerate(zip(synthetic_observations(6, TINY.vision.image_size, cameras=2, seed=7),
                                   (48, 33, 32, 47, 31, 40))):
        images = dict(zip(("base", "wrist"), o.images.values()))
        images = {"wrist": images["wrist"]} if i % 3 == 1 else images  # the first camera missing
        observations.append(with_prompt_tokens(Observation(images, o.instruction, o.state), tok, n))
    common = dict(setting="oxygen", max_decode=6, steps_per_frame=3, denoise_steps=2, max_active=3,
                  max_observations_per_frame=2, max_question_tokens=8, language_every_n_frames=1,
                  camera_names=("base", "wrist"))
    eager_engine = Engine(model, tok, EngineConfig(compile="off", **common))
    eager = _mixed_frames(eager_engine, observations)
    engine = Engine(model, tok, EngineConfig(compile="on", **common))
    engine.warm_up()
    assert engine.compiled is not None, engine.compile_reason
    compiled = _mixed_frames(engine, observations)
    assert [f[3] for f in compiled] == [f[3] for f in eager] and eager[5][3] == "injected fault"
    assert [f[:2] for f in compiled] == [f[:2] for f in eager]  # cancels and tokens, ends included
    for got, want in zip(compiled, eager):
        assert len(got[2]) == len(want[2])
        for a, b in zip(got[2], want[2]):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert engine.recompiles == 0 and engine.pool.held == eager_engine.pool.held
