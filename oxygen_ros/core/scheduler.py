"""One frame under each setting of the OxyGen paper (names as in its public harness).

* ``baseline``  - isolated tasks, one after the other: for each observation a
  prefill and the denoising of its action chunk; then, for each new language
  request, its own prefill and all of its decoding (batch 1).
* ``parallel``  - the same two isolated tasks, run concurrently (a thread for
  actions, one for language; torch releases the GIL inside its kernels).
* ``shared_kv`` - one prefill per observation feeds both experts; the frame's
  new requests then decode to completion (no batching across frames).
* ``oxygen``    - shared prefill plus cross-frame continuous batching: every
  active request (new and earlier) advances ``k`` tokens per frame in one
  batched forward per step; requests live across frames in their slots.

Every setting uses the engine's primitives over the same pool; they differ
only in when those run and over which slots. No setting copies K/V.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine
    from .observation import Observation
    from .requests import Request

SETTINGS = ("baseline", "parallel", "shared_kv", "oxygen")

NewRequests = list[tuple["Request", "int | None"]]


def run_frame(setting: str, engine: "Engine", observations: list["Observation"], new: NewRequests, k: int) -> None:
    {"baseline": baseline, "parallel": parallel, "shared_kv": shared_kv, "oxygen": oxygen}[setting](
        engine, observations, new, k)


# ---------------------------------------------------------------------- isolated tasks
def _actions_isolated(engine: "Engine", observations: list["Observation"]) -> None:
    from .engine import SCRATCH

    actions = []
    for i, obs in enumerate(observations):
        slot = engine.pool.allocate(SCRATCH)
        try:
            engine.prefill([obs], [[slot]])
            actions += engine.act(slot, 1, [i])
        finally:
            engine.pool.release(slot)
    engine._result.actions = actions


def _language_isolated(engine: "Engine", new: NewRequests, slots: list[int]) -> None:
    for (request, _), slot in zip(new, slots):
        logits = engine.prefill([request.observation], [[slot]])
        engine.begin(request, slot, logits[0])
        engine.decode(None)


def _claim_slots(engine: "Engine", new: NewRequests) -> list[int]:
    from .engine import SCRATCH

    return [engine.pool.allocate(SCRATCH) for _ in new]


def _all_pending(engine: "Engine", new: NewRequests) -> NewRequests:
    """Isolated settings start every request in the frame it arrives (and any left
    queued by an earlier failure), one at a time, so none waits for a slot."""
    index = dict((r.id, i) for r, i in new)
    return [(r, index.get(r.id)) for r in engine.admit([r for r, _ in new], unlimited=True)]


def baseline(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    _actions_isolated(engine, observations)
    for item in _all_pending(engine, new):
        _language_isolated(engine, [item], _claim_slots(engine, [item]))


def parallel(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    new = _all_pending(engine, new)
    slots = _claim_slots(engine, new)  # allocation stays on this thread
    language = threading.Thread(target=_on_own_stream, args=(engine, _language_isolated, engine, new, slots),
                                name="oxygen-language")
    language.start()
    try:
        _on_own_stream(engine, _actions_isolated, engine, observations)
    finally:
        language.join()


def _on_own_stream(engine: "Engine", fn, *args) -> None:
    """Run ``fn`` on a CUDA stream of its own when the model is on a GPU (so the two
    tasks overlap on the device, as MPS/streams do in the paper), else as is."""
    device = engine.model.device
    if device.type != "cuda":
        fn(*args)
        return
    import torch

    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(*args)
    stream.synchronize()


# ---------------------------------------------------------------------- shared prefill
def _shared_prefill(engine: "Engine", observations, starting: list["Request"], index: dict[int, int | None]):
    """Prefill this frame's observations once into a run of slots (plus rows for
    starting requests that read an older observation), denoise the run, and
    hand each observation's slot to its first starting request.

    Returns (request, slot, logits row) for every starting request.
    """
    from .engine import SCRATCH

    pool = engine.pool
    n = len(observations)
    run = pool.allocate_run(n, SCRATCH) if n else 0
    dests = [[run + i] for i in range(n)]
    rows: list[tuple["Request", int, int]] = []  # request, slot, prefill row
    extra_obs = []
    claimed = set()
    for r in starting:
        i = index.get(r.id)
        if i is not None and i not in claimed:
            claimed.add(i)
            rows.append((r, run + i, i))
        elif i is not None:
            slot = pool.allocate(SCRATCH)
            dests[i].append(slot)
            rows.append((r, slot, i))
        else:
            slot = pool.allocate(SCRATCH)
            rows.append((r, slot, n + len(extra_obs)))
            extra_obs.append(r.observation)
            dests.append([slot])
    if n or extra_obs:
        logits = engine.prefill(list(observations) + extra_obs, dests)
    if n:
        engine._result.actions = engine.act(run, n, list(range(n)))
    for i in range(n):
        if i not in claimed:
            pool.release(run + i)
    return [(r, slot, logits[row]) for r, slot, row in rows]


def shared_kv(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    index = {r.id: i for r, i in new}
    starting = engine.admit([r for r, _ in new])
    for r, slot, logits in _shared_prefill(engine, observations, starting, index):
        engine.begin(r, slot, logits)
    engine.decode(None)


def oxygen(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    index = {r.id: i for r, i in new}
    starting = engine.admit([r for r, _ in new])
    for r, slot, logits in _shared_prefill(engine, observations, starting, index):
        engine.begin(r, slot, logits)
    engine.decode(k)
