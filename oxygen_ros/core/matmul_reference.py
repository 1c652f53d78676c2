"""A piece's matrix products timed as plain ``torch.mm`` calls: the practical peak it is compared with.

:func:`record_matmuls` runs a function once (eager) and records the shape and
dtype of every matrix product it makes (linear layers, ``mm``, ``addmm``,
``bmm``, ``matmul``, and the two products of each fused attention call,
scores and values, as ``attention``). :class:`ProductTimer` then times each
distinct shape as a plain ``torch.mm`` / ``torch.bmm`` on fresh operands,
counted as many times as the piece makes it: what the piece's arithmetic
costs on this machine with nothing else around it. It takes one sample at a
time, so that the benchmark times it in turn with the piece itself: this
VM's speed drifts by several percent within minutes, and a reference timed
after the piece moved the ratio by 7 points between two runs of the same
compiled prefill. Each shape runs with its second operand in the faster of
two layouts, ``[K, N]`` and ``[N, K]`` transposed (a linear layer's weight):
which one the BLAS library runs faster depends on the CPU (on one 2-core
AVX-512 machine the transposed layout ran 1.5x faster in bfloat16), and the
peak is the faster of the two. The benchmark reports a piece's achieved
FLOP/s against these products' (``oxygen-bench --pieces-only``): 1.0 means
the piece runs its products at the speed of plain ones and spends nothing
elsewhere.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .timing import elapsed_s, median_ms

#: (op, batch, m, k, n, dtype) of one matrix product; batch is 1 for mm/addmm. op is "mm", "bmm"
#: or "attention" (one of the two products inside a fused attention call, timed as a plain bmm)
Product = tuple[str, int, int, int, int, torch.dtype]
#: the kinds a :meth:`ProductTimer.sample` splits its time into
KINDS = ("linear", "attention")

_aten = torch.ops.aten
#: the two layouts of a product's second operand: stored [K, N], or stored [N, K] and transposed
LAYOUTS = ("[K, N]", "[N, K]")


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.products: collections.Counter[Product] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet is _aten.linear:  # what a linear layer is under inference mode: x [..., K] @ W [N, K].T
            x, w = args[0], args[1]
            self._add("mm", 1, x.numel() // x.shape[-1], x.shape[-1], w.shape[0], x.dtype)
        elif packet in (_aten.mm, _aten.addmm):
            a, b = (args[0], args[1]) if packet is _aten.mm else (args[1], args[2])
            self._add("mm", 1, a.shape[0], a.shape[1], b.shape[1], a.dtype)
        elif packet in (_aten.bmm, _aten.matmul) and args[0].dim() >= 2 and args[1].dim() >= 2:
            a, b = args[0], args[1]
            batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]).numel()
            self._add("bmm" if batch > 1 else "mm", batch, a.shape[-2], a.shape[-1], b.shape[-1], a.dtype)
        elif packet is _aten.scaled_dot_product_attention:  # what it is under inference mode, whatever kernel runs
            # counted whole; a causal call (none in this model) would skip about half of it
            q, k, v = args[0], args[1], args[2]  # [..., L, E], [..., S, E], [..., S, Ev]
            heads = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]).numel()
            self._add("attention", heads, q.shape[-2], q.shape[-1], k.shape[-2], q.dtype)  # scores: q @ k.T
            self._add("attention", heads, q.shape[-2], k.shape[-2], v.shape[-1], q.dtype)  # probabilities @ v
        return func(*args, **(kwargs or {}))

    def _add(self, op: str, batch: int, m: int, k: int, n: int, dtype: torch.dtype) -> None:
        self.products[(op, int(batch), int(m), int(k), int(n), dtype)] += 1


def record_matmuls(fn: Callable[[], object]) -> collections.Counter[Product]:
    """The matrix products ``fn()`` makes (run once, eager), counted by shape and dtype."""
    recorder = _Recorder()
    with torch.inference_mode(), recorder:
        fn()
    return recorder.products


def flops(products: collections.Counter[Product]) -> int:
    """Multiply-adds x 2 of ``products``."""
    return sum(2 * batch * m * k * n * count for (_, batch, m, k, n, _), count in products.items())


def kind(op: str) -> str:
    """Which of :data:`KINDS` a product of ``op`` counts in."""
    return "attention" if op == "attention" else "linear"


def _product(op: str, a: torch.Tensor, b: torch.Tensor) -> Callable[[], object]:
    return (lambda: torch.mm(a, b)) if op == "mm" else (lambda: torch.bmm(a, b))


class ProductTimer:
    """``products`` as plain products, one timed sample at a time, so that they can be timed in
    turn with the piece they come from (the machine's speed drifts between minutes). Each shape
    runs in the faster of the two layouts of its second operand, chosen once here (the median
    of 3 calls of each, after a warm-up call); a :meth:`sample` times every shape once."""

    def __init__(self, products: collections.Counter[Product], device: str | torch.device = "cpu"):
        self.device = device
        #: (kind, count, call) of each shape, in the order of ``products``
        self.calls: list[tuple[str, int, Callable[[], object]]] = []
        #: the layout of each shape's second operand that was faster, in the order of ``products``
        self.layouts: list[str] = []
        with torch.inference_mode():
            for (op, batch, m, k, n, dtype), count in products.items():
                lead = () if op == "mm" else (batch,)
                a = torch.randn(*lead, m, k, dtype=dtype, device=device)
                rows = torch.randn(*lead, k, n, dtype=dtype, device=device)  # [K, N]
                cols = torch.randn(*lead, n, k, dtype=dtype, device=device).transpose(-1, -2)  # [N, K] as [K, N]
                layouts = [_product(op, a, b) for b in (rows, cols)]
                times = [median_ms(call, 3, warmup=1, device=device) for call in layouts]
                faster = times.index(min(times))
                self.calls.append((kind(op), count, layouts[faster]))
                self.layouts.append(LAYOUTS[faster])

    def sample(self) -> dict[str, float]:
        """Milliseconds of each of :data:`KINDS`: each shape timed once, times how often the piece
        makes it, summed."""
        ms = dict.fromkeys(KINDS, 0.0)
        with torch.inference_mode():
            for what, count, call in self.calls:
                ms[what] += count * elapsed_s(call, self.device) * 1e3
        return ms
