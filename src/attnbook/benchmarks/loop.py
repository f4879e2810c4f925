"""The training loop against its own step (the suite's ``loop`` benchmark): how much of the
machine the real loop (``attnbook.training.loop.train_step``) gives the model.

Both time the same optimiser steps of the same run on the same batches, in this order:

* **the loop**: ``train_step`` as ``train`` calls it, which takes the next batches of the
  length-bucketed stream, builds them on the CPU, counts their tokens, copies them to the device
  and steps;
* **the step alone**: ``step_on`` on those batches already on the device, so that only the
  model's forward and backward passes, the clipping and the optimiser remain.

The ratio of their target tokens a second says what the loop costs around the step (the issue's
goal: at least 85 % on a GPU). Both get the model-FLOPs utilisation where the device's peak is
known (``models.peak_flops``), and the rate of one large matrix product measured in the same
call as a practical ceiling. A ``torch.profiler`` table of a few loop steps names where the time
goes (the appendix "Performance" shows its top rows).
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from .models import matmul_rate, peak_flops, transformer_flops
from ..training.loop import next_groups, setup, step_on, train_step
from ..training.recipe import preset


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _flops_per_token(run, batches) -> float:
    """Training FLOPs (matmuls, 3 x forward) per real target token over ``batches``."""
    a = run.cfg.arch
    total = sum(transformer_flops(a, *b.src.shape, b.tgt_in.shape[1])["training"] for b in batches)
    return total / sum(b.n_tgt_tokens for b in batches)


def profile_top(run, steps: int, rows: int = 12) -> list[dict]:
    """The ``rows`` operations with the most self time over ``steps`` loop steps: name, calls,
    self CPU ms per step and (on a GPU) self device ms per step."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step(run)
        _sync(run.device)
    cuda = run.device.type == "cuda"
    events = sorted(prof.key_averages(),
                    key=lambda e: -(e.self_device_time_total if cuda else e.self_cpu_time_total))
    return [{"name": e.key, "calls_per_step": e.count / steps,
             "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
             "self_device_ms_per_step": e.self_device_time_total / 1e3 / steps if cuda else None}
            for e in events[:rows]]


def bench_loop(device: torch.device, quick: bool = False) -> dict:
    """Tokens/s of the loop and of its step alone on the same batches (module docstring).
    The preset is the device's own (``gpu-base`` on a GPU, ``cpu-tiny`` on a CPU; ``smoke``
    with ``quick``); it needs the Multi30k files."""
    name = "smoke" if quick else "gpu-base" if device.type == "cuda" else "cpu-tiny"
    warm, steps, profiled = (2, 4, 2) if quick else (10, 40, 5) if device.type == "cuda" else (3, 12, 3)
    cfg = replace(preset(name), max_steps=10 ** 6, eval_every=10 ** 6, snapshot_steps=())
    assert cfg.accum_steps == 1, "the step alone is timed on one batch a step"
    with tempfile.TemporaryDirectory(prefix="attnbook-loop-") as folder:
        run = setup(cfg, Path(folder), device=device)
        run.model.train()
        for _ in range(warm):
            train_step(run)
        _sync(device)
        first, start, tokens = (run.epoch, run.next_batch), time.perf_counter(), run.tokens_seen
        for _ in range(steps):
            train_step(run)
        _sync(device)
        loop_s, loop_tokens = time.perf_counter() - start, run.tokens_seen - tokens
        # the same batches again (across an epoch's end as the loop went), built and copied
        # before the clock starts
        run.epoch, run.next_batch = first
        batches = [run.data.train.batch(next_groups(run, 1)[0]) for _ in range(steps)]
        counts = [b.n_tgt_tokens for b in batches]
        on_device = [b.to(device) for b in batches]
        _sync(device)
        start = time.perf_counter()
        for b, n in zip(on_device, counts):
            step_on(run, [b], n)
        _sync(device)
        step_s = time.perf_counter() - start
        assert sum(counts) == loop_tokens, "the step alone trained other batches than the loop"
        flops = _flops_per_token(run, batches)
        top = profile_top(run, profiled)
        precision = run.precision.name
    peak, peak_source = peak_flops(device, "fp32" if precision == "fp32" else "bf16")  # fp16: bf16's
    ceiling = matmul_rate(device, 256 if quick else 8192 if device.type == "cuda" else 2048,
                          torch.bfloat16 if precision == "bf16" and device.type == "cuda" else torch.float32)
    rows = []
    for what, seconds in (("loop", loop_s), ("step alone", step_s)):
        tokens_per_s = loop_tokens / seconds
        rows.append({"name": what, "seconds": seconds, "steps": steps, "ms_per_step": seconds / steps * 1e3,
                     "tokens_per_s": tokens_per_s, "flops_per_s": tokens_per_s * flops,
                     "mfu": tokens_per_s * flops / peak if peak else None,
                     "of_matmul_ceiling": tokens_per_s * flops / ceiling["flops_per_s"]})
    return {"settings": {"preset": name, "precision": precision, "compiled": run.compiled,
                         "max_tokens": cfg.max_tokens, "warm_up_steps": warm, "timed_steps": steps,
                         "profiled_steps": profiled, "batches": "the loop's own: the length-bucketed "
                         "stream of Multi30k's training set, after the warm-up steps",
                         "flops": "transformer_flops of each batch's shape (matmuls only, training = "
                                  "3 x forward), per real target token"},
            "results": rows, "loop_over_step": rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"],
            "flops_per_target_token": flops, "peak_flops": peak, "peak_source": peak_source,
            "matmul_ceiling": ceiling, "profile": top}


def plot_loop(res: dict, fig) -> None:
    """Two bars, the loop and its step alone, in target tokens a second."""
    from ..plotting import OKABE_ITO
    ax = fig.subplots()
    rows = res["results"]
    ax.bar([r["name"] for r in rows], [r["tokens_per_s"] for r in rows], color=OKABE_ITO[:2])
    for i, r in enumerate(rows):
        mfu = f", MFU {r['mfu']:.0%}" if r["mfu"] is not None else ""
        ax.annotate(f"{r['ms_per_step']:.0f} ms/step{mfu}", (i, r["tokens_per_s"]), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=9)
    ax.margins(y=0.15)
    ax.set(ylabel="target tokens per second",
           title=f"The training loop against its step alone: {res['settings']['preset']}, "
                 f"{res['settings']['precision']} ({res['device']['kind']}); "
                 f"loop {res['loop_over_step']:.0%} of the step")
