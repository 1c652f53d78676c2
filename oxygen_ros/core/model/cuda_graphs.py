"""Replay a compiled function's GPU work as one CUDA graph per input shape.

The first call with a given set of input shapes runs the function twice on a
side stream (so the compiler and the allocator settle), then captures a third
run into a :class:`torch.cuda.CUDAGraph` with static input buffers. Later
calls with those shapes copy their inputs into the buffers and replay the
graph: one launch for the whole piece. Tensors the function reads or writes
that are not arguments (the weights, the KV pool) keep their addresses for the
life of the process, which is what a captured graph needs.

A graph's buffers serve one call at a time. Two threads may call the same
graph (``parallel`` prefills on both, each thread on a CUDA stream of its
own): a call holds the graph's lock from copying its inputs in to copying the
outputs out, and its stream first waits for the previous call's copy-out, on
whichever stream that ran. Without both, the second thread's inputs overwrote
the first's on the device while its replay still read them (seen on an H200:
``parallel`` gave other tokens than eager).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: tuple[Tensor, ...]
    output: object  # a tensor or a tuple of tensors, overwritten by each replay
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: recorded on the calling stream after each call's copy-out (waiting on it before the
    #: first record waits for nothing)
    done: "torch.cuda.Event" = field(default_factory=lambda: torch.cuda.Event())


class CudaGraphs:
    def __init__(self, fn: Callable[..., object]):
        self.fn = fn
        self._graphs: dict[tuple, _Captured] = {}
        self._capturing = threading.Lock()

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def __call__(self, *args: Tensor):
        key = tuple((a.shape, a.dtype) for a in args)
        entry = self._graphs.get(key)
        if entry is None:
            with self._capturing:
                entry = self._graphs.get(key)
                if entry is None:
                    entry = self._graphs[key] = self._capture(args)
        with entry.lock:
            stream = torch.cuda.current_stream()
            stream.wait_event(entry.done)  # the previous call, maybe on another stream, is done with the buffers
            for buffer, a in zip(entry.inputs, args):
                buffer.copy_(a, non_blocking=True)
            entry.graph.replay()
            out = _clone(entry.output)
            entry.done.record(stream)
        return out

    def _capture(self, args: tuple[Tensor, ...]) -> _Captured:
        inputs = tuple(a.clone() for a in args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self.fn(*inputs)
        return _Captured(graph, inputs, output)


def _clone(output):
    """The replay's outputs, copied out of the graph's buffers (the next replay overwrites them)."""
    return tuple(o.clone() for o in output) if isinstance(output, tuple) else output.clone()
