"""The attention benchmark of the suite (``python -m attnbook benchmarks``), and the timing helpers
every benchmark shares.

``bench_attention``: the book's from-scratch attention against ``F.scaled_dot_product_attention``
(the raw kernels), and the book's ``MultiHeadAttention`` against ``nn.MultiheadAttention`` (both
with their projections); forward and forward+backward; time and peak memory, T = 16..4096. On a
GPU also each of SDPA's backends forced in turn (math, flash, memory-efficient, cuDNN) in bf16,
beside the book's kernel in bf16: which fused kernel PyTorch would pick, and what each buys.
``attnbook.benchmarks`` runs it and writes its results; the module docstring there says how.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..attention import scaled_dot_product_attention
from ..bench import _synchronize, attention_inputs, peak_memory, time_call
from ..mha import MultiHeadAttention
from ..torch_twins import attention_from_torch


# ---------------------------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------------------------

def _seconds(fn, device: torch.device, n: int = 1) -> float:
    """Wall-clock seconds of n calls of fn() (gradients as the caller set them), per call."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    _synchronize(device)
    return (time.perf_counter() - start) / n


def interleaved(fns: dict, device: torch.device, rounds: int, n: int = 1) -> dict:
    """Time every fn of ``fns`` (name -> fn()) once per round, in an order reversed every other
    round (A B C, C B A, ...), so that a change of load affects all of them alike.
    Returns name -> list of seconds per call (n calls per sample)."""
    names, samples = list(fns), {name: [] for name in fns}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(_seconds(fns[name], device, n))
    return samples


def _stats(samples: list[float]) -> dict:
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "samples_s": [round(s, 6) for s in samples]}


def _error(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:300]


def _no_kernel(e: BaseException) -> bool:
    """Whether ``e`` says that a forced SDPA backend cannot run these inputs on this device."""
    return any(s in str(e).lower() for s in ("no available kernel", "no viable backend"))


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


# ---------------------------------------------------------------------------------------------
# 1. Attention kernels and modules
# ---------------------------------------------------------------------------------------------

def kernel_call(f, B: int, h: int, d_k: int, device: torch.device,
                dtype: torch.dtype = torch.float32):
    """make(T) for an attention kernel ``f(q, k, v) -> out``: it returns (forward fn,
    forward+backward fn, inputs) with random q, k, v (B, h, T, d_k) of ``dtype`` on ``device``."""
    def make(T):
        q, k, v = (t.to(dtype).requires_grad_()
                   for t in attention_inputs(T, B=B, h=h, d_k=d_k, device=device))

        def fwd_bwd(q, k, v):
            with torch.enable_grad():
                return torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
        return f, fwd_bwd, (q, k, v)
    return make


def _attention_calls(B: int, h: int, d_k: int, device: torch.device):
    """name -> (kind, make). make(T) returns (forward fn, forward+backward fn, inputs): each fn
    is called as fn(*inputs), so that time_call and peak_memory see the device of the inputs.
    Raw kernels take q, k, v (B, h, T, d_k); modules take x (B, T, d_model = h d_k) and include
    their projections."""
    d_model = h * d_k
    torch.manual_seed(0)
    book_mha = MultiHeadAttention(d_model, h).to(device).eval()
    torch_mha = nn.MultiheadAttention(d_model, h, batch_first=True).to(device).eval()
    attention_from_torch(book_mha, torch_mha)

    def kernel(f):
        return kernel_call(f, B, h, d_k, device)

    def module(m, f):
        def make(T):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(B, T, d_model, generator=g).to(device).requires_grad_()

            def fwd_bwd(x):
                with torch.enable_grad():
                    return torch.autograd.grad(f(x).sum(), [x, *m.parameters()])
            return f, fwd_bwd, (x,)
        return make

    return {
        "book kernel": ("kernel", kernel(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0])),
        "F.scaled_dot_product_attention": ("kernel", kernel(F.scaled_dot_product_attention)),
        "book MultiHeadAttention": ("module", module(book_mha, lambda x: book_mha(x)[0])),
        "nn.MultiheadAttention": ("module", module(
            torch_mha, lambda x: torch_mha(x, x, x, need_weights=False)[0])),
        "book MultiHeadAttention, weights": ("module", module(
            book_mha, lambda x: book_mha(x, need_weights=True)[0])),
        "nn.MultiheadAttention, weights": ("module", module(
            torch_mha, lambda x: torch_mha(x, x, x, need_weights=True,
                                           average_attn_weights=False)[0])),
    }


# SDPA's backends, each forced in turn with ``sdpa_kernel``: the fused kernels need float16 or
# bfloat16 on a GPU, so these run in bf16 there (float32 on a CPU, where only math and flash exist)
SDPA_BACKENDS = {"SDPA math": SDPBackend.MATH, "SDPA flash": SDPBackend.FLASH_ATTENTION,
                 "SDPA memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "SDPA cuDNN": SDPBackend.CUDNN_ATTENTION}


def _backend_calls(B: int, h: int, d_k: int, device: torch.device) -> dict:
    """name -> ("kernel", make), as in :func:`_attention_calls`, for each SDPA backend and for
    the book's kernel, all in the backends' dtype (bf16 on a GPU, float32 on a CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    suffix = ", bf16" if dtype == torch.bfloat16 else ""

    def kernel(f):
        return kernel_call(f, B, h, d_k, device, dtype)

    def forced(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return f

    calls = {name + suffix: ("kernel", kernel(forced(b))) for name, b in SDPA_BACKENDS.items()}
    if suffix:
        calls["book kernel" + suffix] = ("kernel", kernel(
            lambda q, k, v: scaled_dot_product_attention(q, k, v)[0]))
    return calls


def bench_attention(device: torch.device, quick: bool = False,
                    backends: bool | None = None) -> dict:
    """Time and peak memory of each attention implementation, forward and forward+backward, for
    each sequence length; lengths whose predicted cost passes the limits are skipped and said so.
    ``backends`` (default: on a GPU) adds SDPA's backends, forced one at a time; a backend that
    cannot run on this device or dtype is listed under "capped" with PyTorch's reason."""
    B, h, d_k = (1, 2, 16) if quick else (1, 8, 64)
    lengths = [16, 64] if quick else [16, 64, 256, 1024, 4096]
    if device.type == "cuda":
        max_bytes = int(0.5 * torch.cuda.get_device_properties(device).total_memory)
    else:
        max_bytes = 4 * 2 ** 30
    max_seconds = 4.0
    settings = {"B": B, "h": h, "d_k": d_k, "d_model": h * d_k, "lengths": lengths,
                "dtype": "float32", "self_attention": True, "mask": None,
                "timing": "fastest of a warm-up call and 3 more (2 when a call takes > 0.5 s; "
                          "small ones repeated for at least 0.05 s, attnbook.bench.time_call); "
                          "lengths in the outer loop, implementations in the inner one; "
                          "peak_memory: one more call, bytes above the start",
                "limits": {"max_seconds_per_call": max_seconds, "max_peak_bytes": max_bytes,
                           "rule": "the next length is skipped when the last measured time or "
                                   "memory, scaled by (T_next / T_last)^2, passes a limit"},
                "modules_mode": "eval(); forward without gradients lets nn.MultiheadAttention "
                                "take its fused inference fast path, as it does for any user"}
    rows, capped, last, unavailable = [], [], {}, {}
    calls = _attention_calls(B, h, d_k, device)
    if device.type == "cuda" if backends is None else backends:
        calls.update(_backend_calls(B, h, d_k, device))
        settings["backends"] = ("SDPA forced to one backend at a time (torch.nn.attention."
                                "sdpa_kernel); on a GPU in bf16 with the book's kernel in bf16 "
                                "beside them; the other rows stay float32")
    # length by length, every implementation right after the others: a change of load between
    # two lengths affects all of them alike
    for mode in ("forward", "forward+backward"):
        for T in lengths:
            for name, (kind, make) in calls.items():
                if name in unavailable:         # listed once under "capped", with the reason
                    continue
                why = _predicted_over_limit(last.get((name, mode)), T, max_seconds, max_bytes)
                if why:
                    capped.append({"name": name, "mode": mode, "T": T,
                                   "why": f"{why} on {device.type}"})
                    continue
                try:
                    fwd, fwd_bwd, inputs = make(T)
                    fn = fwd if mode == "forward" else fwd_bwd
                    first = time_call(fn, *inputs, repeats=1, warmup=0, min_time=0)  # warm-up
                    again = time_call(fn, *inputs, repeats=3 if first < 0.5 else 2, warmup=0,
                                      min_time=0.05)
                    row = {"name": name, "kind": kind, "mode": mode, "T": T,
                           "seconds": min(first, again), "peak_bytes": peak_memory(fn, *inputs)}
                except RuntimeError as e:
                    if not (_is_oom(e) or _no_kernel(e)):
                        raise
                    if _no_kernel(e):           # the same at every length and mode: say it once
                        unavailable[name] = True
                        capped.append({"name": name, "mode": "all", "T": "all",
                                       "why": f"unavailable on {device.type}: {_error(e)}"})
                        continue
                    capped.append({"name": name, "mode": mode, "T": T, "why": _error(e)})
                    last[(name, mode)] = {"T": T, "seconds": math.inf, "peak_bytes": math.inf}
                    continue
                finally:
                    fn = fwd = fwd_bwd = inputs = None
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
                last[(name, mode)] = row
                print(f"  attention {name:34s} {mode:17s} T={T:5d} {row['seconds'] * 1e3:9.2f} ms "
                      f"{row['peak_bytes'] / 2**20:9.1f} MiB", flush=True)
    return {"settings": settings, "results": rows, "capped": capped,
            "summary": _attention_summary(rows)}


def _predicted_over_limit(last: dict | None, T: int, max_seconds: float,
                          max_bytes: float) -> str | None:
    """Why length T is skipped, or None: the last measured time or memory, scaled by
    (T / T_last)^2 (attention's cost grows with the square of the length), passes a limit."""
    if last is None:
        return None
    grow = (T / last["T"]) ** 2
    if last["seconds"] * grow > max_seconds:
        return f"predicted {last['seconds'] * grow:.1f} s per call > {max_seconds} s limit"
    if last["peak_bytes"] * grow > max_bytes:
        return (f"predicted peak {last['peak_bytes'] * grow / 2**30:.1f} GiB > "
                f"{max_bytes / 2**30:.1f} GiB limit")
    return None


def _attention_summary(rows: list[dict]) -> list[dict]:
    """book / PyTorch time and memory ratios, per pair, mode and length both measured."""
    pairs = [("book kernel", "F.scaled_dot_product_attention"),
             ("book MultiHeadAttention", "nn.MultiheadAttention"),
             ("book MultiHeadAttention, weights", "nn.MultiheadAttention, weights"),
             ("book kernel, bf16", "SDPA flash, bf16")]
    index = {(r["name"], r["mode"], r["T"]): r for r in rows}
    out = []
    for ours, theirs in pairs:
        for (name, mode, T), r in index.items():
            if name == ours and (theirs, mode, T) in index:
                t = index[(theirs, mode, T)]
                out.append({"book": ours, "torch": theirs, "mode": mode, "T": T,
                            "time_ratio": r["seconds"] / t["seconds"],
                            "memory_ratio": r["peak_bytes"] / max(t["peak_bytes"], 1)})
    return out
