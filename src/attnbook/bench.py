"""What one call of attention costs: wall-clock time and peak memory (chapter 4).

Self-attention over ``T`` positions compares every query with every key, so it builds a ``T x T``
matrix of scores per head. These helpers measure what that costs:

* :func:`score_matrix_bytes` -- the size of the score matrices, computed, not measured;
* :func:`time_call` -- the fastest of a few timed calls (the least disturbed by other programs);
* :func:`peak_memory` -- the most memory allocated at any moment during one call, above what was
  allocated when it started. On a CPU it is read from the PyTorch profiler's record of every
  allocation and free; on a GPU from ``torch.cuda.max_memory_allocated``;
* :func:`attention_cost` -- both, for several functions and sequence lengths.

Timings depend on the machine and on whatever else it is doing; memory is close to
deterministic. Notebooks print timings in cells whose outputs are not compared.
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable

import torch

# The profiler logs a line to stderr each time it starts and stops; level 6 keeps it quiet.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def score_matrix_bytes(B: int, h: int, T: int, S: int | None = None,
                       dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one (B, h, T, S) score matrix of ``dtype`` (S = T for self-attention)."""
    S = T if S is None else S
    return B * h * T * S * torch.finfo(dtype).bits // 8


def attention_inputs(T: int, S: int | None = None, *, B: int = 1, h: int = 4, d_k: int = 64,
                     d_v: int | None = None, device="cpu", dtype: torch.dtype = torch.float32,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q (B, h, T, d_k), k (B, h, S, d_k), v (B, h, S, d_v) with standard normal entries,
    drawn from their own seeded generator (the global random state is left alone)."""
    S = T if S is None else S
    d_v = d_k if d_v is None else d_v
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T, d_k, generator=g, dtype=dtype)
    k = torch.randn(B, h, S, d_k, generator=g, dtype=dtype)
    v = torch.randn(B, h, S, d_v, generator=g, dtype=dtype)
    return q.to(device), k.to(device), v.to(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(args, kwargs) -> torch.device:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def time_call(fn: Callable, *args, repeats: int = 3, warmup: int = 1, min_time: float = 0.05,
              max_repeats: int = 100, **kwargs) -> float:
    """Seconds taken by ``fn(*args, **kwargs)``: the fastest of the timed calls that follow
    ``warmup`` untimed ones. It makes at least ``repeats`` calls, and more (up to
    ``max_repeats``) until ``min_time`` seconds have been spent, so that fast calls are repeated
    often. The minimum is the measurement least disturbed by other programs."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    device = _device_of(args, kwargs)
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args, **kwargs)
        _synchronize(device)
        best, spent, n = math.inf, 0.0, 0
        while n < repeats or (spent < min_time and n < max_repeats):
            start = time.perf_counter()
            fn(*args, **kwargs)
            _synchronize(device)
            elapsed = time.perf_counter() - start
            best, spent, n = min(best, elapsed), spent + elapsed, n + 1
    return best


def peak_memory(fn: Callable, *args, **kwargs) -> int:
    """Peak bytes allocated during one call of ``fn(*args, **kwargs)`` (gradients off), above
    what was allocated when the call started. The result of the call is counted: it is freed
    only after the call returns. Tensors on a CUDA device are measured on that device, anything
    else on the CPU."""
    device = _device_of(args, kwargs)
    if device.type == "cuda":
        _synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            out = fn(*args, **kwargs)
        _synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out
        return int(peak)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            fn(*args, **kwargs)
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as e:  # pragma: no cover - depends on the PyTorch version
        raise RuntimeError("this PyTorch version's profiler does not expose its memory events; "
                           "peak_memory needs torch >= 2.1") from e
    current = peak = 0
    for event in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        if event.device_type() == torch.autograd.DeviceType.CPU:
            current += event.nbytes()
            peak = max(peak, current)
    return int(peak)


def attention_cost(fns: dict[str, Callable], lengths, *, B: int = 1, h: int = 4, d_k: int = 64,
                   repeats: int = 3, device="cpu", dtype: torch.dtype = torch.float32,
                   num_threads: int | None = None) -> list[dict]:
    """Time and peak memory of each attention function in ``fns`` (name -> fn(q, k, v)) for
    self-attention over each length T in ``lengths``, with q, k, v of shape (B, h, T, d_k).

    num_threads: CPU threads while measuring (the previous setting is restored afterwards). One
    thread gives far steadier timings on a machine that is busy with other work: a
    multi-threaded kernel waits for its slowest thread.
    Returns one dict per (function, length): name, T, seconds, peak_bytes, and score_bytes (the
    size of the (B, h, T, T) score matrix, for comparison)."""
    rows = []
    saved = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        for T in lengths:
            q, k, v = attention_inputs(T, B=B, h=h, d_k=d_k, device=device, dtype=dtype)
            for name, fn in fns.items():
                rows.append({"name": name, "T": T,
                             "seconds": time_call(fn, q, k, v, repeats=repeats),
                             "peak_bytes": peak_memory(fn, q, k, v),
                             "score_bytes": score_matrix_bytes(B, h, T, dtype=dtype)})
            del q, k, v
    finally:
        torch.set_num_threads(saved)
    return rows
