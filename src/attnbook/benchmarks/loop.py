"""The training loop against its own step (the suite's ``loop`` benchmark): how much of the
machine the real loop (``attnbook.training.loop.train_step``) gives the model.

Both time optimiser steps of the same run on the same batches, in alternating blocks of a few
steps: a block of the loop and the same batches through the step alone, which goes first in
every other block), so that whatever changes during the run (caches, the allocator, the
machine's load) affects both alike:

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
    warm, steps, block, profiled = (2, 4, 2, 2) if quick else (10, 40, 5, 5) \
        if device.type == "cuda" else (3, 24, 3, 3)
    cfg = replace(preset(name), max_steps=10 ** 6, eval_every=10 ** 6, snapshot_steps=())
    assert cfg.accum_steps == 1, "the step alone is timed on one batch a step"
    with tempfile.TemporaryDirectory(prefix="attnbook-loop-") as folder:
        run = setup(cfg, Path(folder), device=device)
        run.model.train()
        for _ in range(warm):
            train_step(run)
        seconds, loop_tokens, batches = {"loop": 0.0, "alone": 0.0}, 0, []
        for r in range(steps // block):
            where = (run.epoch, run.next_batch)          # the block's batches, built and copied
            mine = [run.data.train.batch(next_groups(run, 1)[0]) for _ in range(block)]
            run.epoch, run.next_batch = where            # before any clock starts; the loop
            counts = [b.n_tgt_tokens for b in mine]      # takes them again itself
            on_device = [b.to(device) for b in mine]
            for what in ("loop", "alone") if r % 2 == 0 else ("alone", "loop"):
                tokens = run.tokens_seen
                _sync(device)
                start = time.perf_counter()
                if what == "loop":                       # as train() runs it
                    for _ in range(block):
                        train_step(run)
                else:                                    # the step alone
                    for b, n in zip(on_device, counts):
                        step_on(run, [b], n)
                _sync(device)
                seconds[what] += time.perf_counter() - start
                if what == "loop":
                    loop_tokens += run.tokens_seen - tokens
            batches += mine
        loop_s, step_s = seconds["loop"], seconds["alone"]
        assert sum(b.n_tgt_tokens for b in batches) == loop_tokens, "other batches than the loop's"
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
                         "block": f"{block} steps of the loop and the same batches through the "
                                  "step alone, in turn, the first of the two alternating",
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
