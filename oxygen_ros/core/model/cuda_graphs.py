"""Replay a compiled function's GPU work as one CUDA graph per input shape.

The first call with a given set of input shapes runs the function twice on a
side stream (so the compiler and the allocator settle), then captures a third
run into a :class:`torch.cuda.CUDAGraph` with static input buffers. Later
calls with those shapes copy their inputs into the buffers and replay the
graph: one launch for the whole piece. Tensors the function reads or writes
that are not arguments (the weights, the KV pool) keep their addresses for the
life of the process, which is what a captured graph needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: tuple[Tensor, ...]
    output: object  # a tensor or a tuple of tensors, overwritten by each replay


class CudaGraphs:
    def __init__(self, fn: Callable[..., object]):
        self.fn = fn
        self._graphs: dict[tuple, _Captured] = {}

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def __call__(self, *args: Tensor):
        key = tuple((a.shape, a.dtype) for a in args)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(args)
        for buffer, a in zip(entry.inputs, args):
            buffer.copy_(a, non_blocking=True)
        entry.graph.replay()
        return _clone(entry.output)

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
