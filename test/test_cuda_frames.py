"""On a CUDA device (skipped without one): each bucket compiled and replayed as a CUDA graph
gives the eager engine's frames, in every setting, as the decode batch changes.

CI has no GPU, so these run where one is (``bash test/cuda_check.sh``); the CPU
suite checks the same bucketing and packages on the CPU (``test_compiled.py``).
"""

import threading

import numpy as np
import pytest
import torch

from conftest import lively
from engine_harness import frames_with_questions

from oxygen_ros.core.engine import SETTINGS, Engine, EngineConfig
from oxygen_ros.core.model.cuda_graphs import CudaGraphs
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")


@pytest.fixture(scope="module")
def cuda_tiny():
    # float32 products in float32 (not TF32) in both runs: the comparison is of the graphs, not of TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return lively(build_model(TINY, seed=2, device="cuda"))


@pytest.mark.parametrize("setting", SETTINGS)
def test_cuda_graph_frames_match_eager_as_the_batch_changes(cuda_tiny, tok, setting, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cuda-compile-cache"))
    lengths = [5, 6, 0, 4, 6, 2, 0, 5, 3, 6]  # requests start and finish inside a bucket and across buckets
    common = dict(setting=setting, max_decode=6, steps_per_frame=2, denoise_steps=2, max_active=3,
                  max_observations_per_frame=1, language_every_n_frames=0, camera_names=("base",))
    size = TINY.vision.image_size
    eager = frames_with_questions(Engine(cuda_tiny, tok, EngineConfig(compile="off", **common)), lengths, size)
    engine = Engine(cuda_tiny, tok, EngineConfig(compile="on", **common))
    engine.warm_up()
    assert engine.compiled is not None, engine.compile_reason
    captured = engine.compiled.cuda_graphs
    assert captured == engine.compiled.bucket_count  # every bucket captured at warm-up
    compiled = frames_with_questions(engine, lengths, size)
    assert compiled[1] == eager[1]  # identical greedy tokens
    assert len(compiled[0]) == len(eager[0]) == len(lengths)
    for a, b in zip(compiled[0], eager[0]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    if setting == "oxygen":
        assert len(set(compiled[2])) >= 2  # the decode batch changed during the run
    assert engine.recompiles == 0 and engine.compiled.cuda_graphs == captured  # nothing new in the frames


def test_two_threads_replaying_one_graph_each_get_their_own_results():
    """``parallel`` prefills on both of its threads, each on a CUDA stream of its own, through the
    same captured graph: each call must get the result of its own inputs, not of the other's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.randn(1024, 1024, device="cuda") / 32

    def work(x):  # long enough on the device that the two threads' calls overlap
        for _ in range(30):
            x = torch.tanh(x @ w)
        return x

    graphs = CudaGraphs(work)
    inputs = [torch.randn(512, 1024, device="cuda") for _ in range(2)]
    want = [work(x) for x in inputs]
    graphs(inputs[0])  # captured here, before the threads
    torch.cuda.synchronize()
    results: list[list[torch.Tensor]] = [[], []]

    def calls(i: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(40):
                results[i].append(graphs(inputs[i]))
        stream.synchronize()

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert graphs.captured == 1
    for i in range(2):
        for got in results[i]:
            torch.testing.assert_close(got, want[i], atol=1e-5, rtol=0)
