"""The four settings' schedules (seen through the engine's pause point) and the
``parallel`` setting's second thread."""

import threading

import pytest
from engine_harness import run_to_the_end, scene_observations

from oxygen_ros.core.engine import Engine, EngineConfig, FrameError, Question

S = 3  # denoise steps


def engine_for(model, tok, setting, **cfg):
    cfg = {"max_decode": 6, "steps_per_frame": 2, "denoise_steps": S, "language_every_n_frames": 0, **cfg}
    return Engine(model, tok, EngineConfig(setting=setting, **cfg))


def trace(engine, observations, questions):
    """The pieces one frame ran, in order, and its result."""
    pieces = []
    engine.pause_point = pieces.append
    try:
        return pieces, engine.step(observations, questions)
    finally:
        engine.pause_point = None


def decoded(result):
    return len([e for e in result.tokens if e.token_id >= 0]) - len(result.started)  # first tokens need no step


def test_baseline_runs_a_prefill_for_the_action_and_another_for_the_request(lively_tiny, tok):
    engine = engine_for(lively_tiny, tok, "baseline")
    pieces, res = trace(engine, scene_observations(1), [Question("", "q")])
    steps = decoded(res)
    assert pieces == ["prefill"] + ["denoise"] * S + ["prefill"] + ["decode"] * steps
    assert res.finished and res.finished[0].client_id == "q", "baseline decodes the request to its end"


def test_shared_kv_prefills_once_and_decodes_to_the_end(lively_tiny, tok):
    engine = engine_for(lively_tiny, tok, "shared_kv")
    pieces, res = trace(engine, scene_observations(1), [Question("", "q")])
    assert pieces == ["prefill"] + ["denoise"] * S + ["decode"] * decoded(res)
    assert res.finished and engine.active_requests == 0


def test_oxygen_prefills_once_and_decodes_k_steps(lively_tiny, tok):
    engine = engine_for(lively_tiny, tok, "oxygen", max_decode=6, steps_per_frame=2)
    pieces, res = trace(engine, scene_observations(1), [Question("", "q", max_tokens=6)])
    assert not res.finished
    assert pieces == ["prefill"] + ["denoise"] * S + ["decode"] * 2
    assert engine.active_requests == 1, "the request keeps its slot for the next frame"


def test_parallel_runs_the_language_task_on_a_second_thread(lively_tiny, tok):
    engine = engine_for(lively_tiny, tok, "parallel")
    threads = []
    engine.pause_point = lambda work: threads.append((work, threading.current_thread().name))
    res = engine.step(scene_observations(1), [Question("", "q")])
    engine.pause_point = None
    assert {name for work, name in threads if work == "denoise"} == {threading.current_thread().name}
    assert {name for work, name in threads if work == "decode"} == {"oxygen-language"}
    assert sorted(w for w, _ in threads).count("prefill") == 2
    assert len(res.actions) == 1 and res.finished


def test_a_failure_on_the_language_thread_reaches_the_caller_and_no_request_is_left(lively_tiny, tok):
    engine = engine_for(lively_tiny, tok, "parallel", max_decode=6)
    obs = scene_observations(3)
    failed = []

    def fail_once_in_decode(work):
        if work == "decode" and not failed:
            failed.append(threading.current_thread().name)
            raise RuntimeError("device lost")

    engine.pause_point = fail_once_in_decode
    with pytest.raises(FrameError, match="device lost") as err:
        engine.step([obs[0]], [Question("", "during", max_tokens=6)])
    engine.pause_point = None
    assert failed == ["oxygen-language"]
    healthy = engine_for(lively_tiny, tok, "parallel", max_decode=6).step([obs[0]], [])
    (chunk,) = err.value.result.actions  # the language thread's fault costs no action
    assert (chunk == healthy.actions[0]).all()
    events, finished = list(err.value.result.tokens), list(err.value.result.finished)
    run_to_the_end(engine, obs[1:], events, finished)
    assert [r.client_id for r in finished] == ["during"], "the interrupted request finishes"
    r = finished[0]
    assert r.finish_reason.value in ("eos", "length")
    assert [e.token_id for e in events if e.token_id >= 0] == r.tokens, "no token lost or repeated"
    assert engine.pool.held == 0


@pytest.mark.parametrize("piece", ["prefill", "denoise", "decode"])
@pytest.mark.parametrize("setting", ["baseline", "parallel", "shared_kv", "oxygen"])
def test_a_fault_in_any_piece_of_any_setting_is_a_frame_error_and_every_request_finishes(
        lively_tiny, tok, setting, piece):
    engine = engine_for(lively_tiny, tok, setting, max_decode=6, steps_per_frame=2)
    obs = scene_observations(4, seed=3)
    first = engine.step([obs[0]], [Question("", "early", max_tokens=6)])
    events, finished = list(first.tokens), list(first.finished)
    seen = []
    nth = 2 if piece == "decode" else 1  # the second decode step: some tokens of the frame are out

    def fault(work):
        seen.append(work)
        if work == piece and seen.count(piece) == nth:
            raise RuntimeError(f"fault in {piece}")

    engine.pause_point = fault
    with pytest.raises(FrameError, match=f"fault in {piece}") as err:
        engine.step([obs[1]], [Question("", "during", max_tokens=6)])
    engine.pause_point = None
    actions = err.value.result.actions
    if piece == "denoise" or (piece == "prefill" and setting != "parallel"):
        assert actions == [], "no chunk from a fault before the actions were done"
    elif piece == "decode":  # after the actions: the chunk is the one a healthy frame gives
        healthy = engine_for(lively_tiny, tok, setting, max_decode=6, steps_per_frame=2)
        healthy.step([obs[0]], [Question("", "early", max_tokens=6)])
        (chunk,) = actions
        assert (chunk == healthy.step([obs[1]], []).actions[0]).all()
    events += err.value.result.tokens
    finished += err.value.result.finished
    run_to_the_end(engine, obs[2:], events, finished)
    assert sorted(r.client_id for r in finished) == ["during", "early"]
    for r in finished:
        assert r.finish_reason.value in ("eos", "length"), r.client_id
        streamed = [e.token_id for e in events if e.client_id == r.client_id and e.token_id >= 0]
        assert streamed == r.tokens, f"{r.client_id}: tokens lost or repeated"
    assert engine.pool.held == 0
