"""The benchmark suite of the appendix "Performance", as a library: what ``python -m attnbook benchmarks``
(``make bench``, the command in ``benchmarks``) and the GPU call (``attnbook.experiments.gpu_run``) run, and what
the appendix reads and draws.

Five measurements, each against PyTorch's own modules (or the loop's own step) and, where it is
known, the hardware limit:

* ``attention``: the book's from-scratch attention against ``F.scaled_dot_product_attention``
  (the raw kernels), and the book's ``MultiHeadAttention`` against ``nn.MultiheadAttention``
  (both with their projections); forward and forward+backward; time and peak memory, T = 16..4096;
* ``training``: tokens/s of a full training step (forward, label-smoothed loss, backward, Adam)
  of the book's Transformer and of ``nn.Transformer`` with the same configuration and the same
  weights, side by side; eager and ``torch.compile``; fp32, and bf16 autocast on a GPU; the
  model-FLOPs utilisation (MFU) where the device's peak is known;
* ``decoding``: greedy and beam search with and without the key/value cache, 64-token outputs;
* ``recurrence``: time per training step of the GRU encoder-decoders and the Transformer as the
  sequence length grows: the parallelism argument of the paper;
* ``loop``: the real training loop against its step alone on the loop's own batches, with a
  profile of the loop (``attnbook.benchmarks.loop``; it needs the Multi30k files).

Each runs on the CPU and, when PyTorch sees one, on a CUDA GPU, and writes
``OUT/<cpu|cuda>/<name>.json`` (:mod:`attnbook.store`'s format: settings and every
measurement; hardware, versions, load and wall time in its provenance record) and ``OUT/<cpu|cuda>/<name>.png``. ``--quick`` runs tiny sizes in seconds (what the
test suite runs). Whatever is compared is measured side by side: the training, decoding and
recurrence variants run one after the other in every round (median and minimum reported), the
attention implementations one after the other at each length (fastest of a few calls), so that
whatever else the machine is doing slows them alike. ``--replot`` redraws the PNG files from the
JSON files without measuring.

FLOPs (``transformer_flops``): only the matrix multiplications are counted, at 2 FLOPs per
multiply-add; the backward pass costs twice the forward, so a training step is 3x the forward.
Per target token with S = T this is the usual ``6 N`` (N: the weights of every matrix multiply,
the output layer included) plus ``36 L d_model T`` for the three attentions of each layer pair
(scores and weighted sum, full T x S matrices). The appendix derives it.

This module holds the goals, the plots and the writing of results; the benchmarks themselves are
in ``bench_attention`` (attention, and the shared timing helpers) and ``bench_models`` (FLOPs,
training, decoding, recurrence), whose public names it re-exports.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from .attention import bench_attention, interleaved  # noqa: F401 (re-exported)
from .loop import bench_loop, plot_loop
from .models import (GPU_PEAK_TFLOPS, TRAIN_CONFIGS, TorchTransformer,  # noqa: F401
                           bench_decoding, bench_recurrence, bench_training,
                           bench_training_config, gpu_peak_flops, matmul_params, matmul_rate,
                           peak_flops, random_batch, transformer_flops, twin_models)
from .. import store
from ..plotting import OKABE_ITO, use_book_style
from ..utils import count_parameters  # noqa: F401 (re-exported)

SECTIONS = ("attention", "training", "decoding", "recurrence", "loop")
SCHEMA = 1
ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = ROOT / "results" / "bench"


# ---------------------------------------------------------------------------------------------
# Goals, plots, the command line
# ---------------------------------------------------------------------------------------------

def goals(results: dict) -> list[dict]:
    """The issue's goals, each met / missed / unmeasured, from loaded results:
    ``results[kind][section]`` is the JSON of OUT/kind/section.json (kind "cpu" or "cuda").

    A training speed-up is judged by the median of the per-round ratios (each round times both
    models back to back, so a change of load cancels out); when the ratio of the median times
    falls on the other side of the target, the status is "inconclusive": within the noise."""
    def speedup_goal(goal, target_text, kind, config, variant, target):
        found = None
        for c in results.get(kind, {}).get("training", {}).get("configs", []):
            if c["config"] == config:
                found = next((s for s in c["speedup"] if s["variant"] == variant), None)
        if found is None:
            return {"goal": goal, "target": target_text, "measured": None, "status": "unmeasured"}
        paired, medians = found["book_speedup_paired"], found["book_speedup"]
        # the two statistics on different sides of the target: the difference is within the noise
        status = ("met" if paired >= target else "missed") \
            if (paired >= target) == (medians >= target) else "inconclusive"
        return {"goal": goal, "target": target_text, "status": status,
                "measured": f"{paired:.2f}x (per-round ratios; ratio of medians {medians:.2f}x)"}

    out = [speedup_goal("book Transformer trains at least as fast as nn.Transformer on the CPU",
                        ">= 1.0x (fp32, eager: how chapter 9 trains on a CPU)",
                        "cpu", "small", "fp32, eager", 1.0),
           speedup_goal("book Transformer trains >= 1.3x as fast as nn.Transformer on a GPU",
                        ">= 1.3x (bf16 autocast, torch.compile, throughput configuration)",
                        "cuda", "throughput", "bf16, compiled", 1.3)]
    mfu, gpu = None, None
    for c in results.get("cuda", {}).get("training", {}).get("configs", []):
        if c["config"] == "throughput":
            gpu = results["cuda"]["training"]["device"]["name"]
            mfu = max((row.get("mfu") or 0 for row in c["results"]
                       if row["model"] == "book" and row["variant"] == "bf16, compiled"),
                      default=None)
    on_hopper = gpu is not None and ("H100" in gpu or "H200" in gpu)
    out.append({"goal": ">= 40% MFU on H100/H200 for the throughput configuration",
                "target": ">= 0.40 (book Transformer, bf16, compiled, d_model 512, 6+6 layers, "
                          "16,384 tokens per batch)",
                "measured": None if not mfu else f"{mfu:.1%} on {gpu}",
                "status": "unmeasured" if not (mfu and on_hopper) else
                ("met" if mfu >= 0.40 else "missed")})
    for kind in ("cpu", "cuda"):
        dec = results.get(kind, {}).get("decoding")
        ratios = {s["method"]: s["cached_speedup"] for s in dec["speedup"]} if dec else {}
        out.append({"goal": f"cached decoding >= 3x faster than uncached, 64-token outputs "
                            f"({kind})",
                    "target": ">= 3.0x for greedy and beam 4",
                    "measured": ", ".join(f"{m} {v:.1f}x" for m, v in ratios.items()) or None,
                    "status": "unmeasured" if not ratios else
                    ("met" if min(ratios.values()) >= 3.0 else "missed")})
    return out


def load_results(root: Path | str | None = None) -> dict:
    """results[kind][section] (a :class:`attnbook.store.Result`: the data, with its ``calls``)
    for every kind/section.json under ``root``; by default the committed ``results/bench``,
    wherever the notebook runs (:func:`attnbook.store.find`)."""
    out = {}
    for kind in ("cpu", "cuda"):
        for section in SECTIONS:
            path = (Path(root) / kind / f"{section}.json" if root is not None
                    else store.find(f"bench/{kind}/{section}.json"))
            if path is not None and path.is_file():
                out.setdefault(kind, {})[section] = store.Result(store.read(path), path)
    return out


def _colours() -> dict:
    return {"book kernel": OKABE_ITO[0], "F.scaled_dot_product_attention": OKABE_ITO[1],
            "book MultiHeadAttention": OKABE_ITO[0], "nn.MultiheadAttention": OKABE_ITO[1],
            "book MultiHeadAttention, weights": OKABE_ITO[2],
            "nn.MultiheadAttention, weights": OKABE_ITO[5],
            "book": OKABE_ITO[0], "torch": OKABE_ITO[1],
            # SDPA's backends forced one at a time (a GPU; bf16 there)
            "SDPA math": OKABE_ITO[3], "SDPA flash": OKABE_ITO[4],
            "SDPA memory-efficient": OKABE_ITO[6], "SDPA cuDNN": "#000000",
            "book kernel, bf16": OKABE_ITO[2], "SDPA math, bf16": OKABE_ITO[3],
            "SDPA flash, bf16": OKABE_ITO[4], "SDPA memory-efficient, bf16": OKABE_ITO[6],
            "SDPA cuDNN, bf16": "#000000"}


# Each plot_* function draws one result (a loaded JSON file) into ``fig``, a matplotlib Figure
# or SubFigure; make it with layout="constrained" so that the panels do not overlap.

def plot_attention(res: dict, fig) -> None:
    """Four panels: time and peak memory against T, kernels (top) and modules (bottom);
    solid lines forward, dashed forward+backward."""
    colours = _colours()
    axes = fig.subplots(2, 2)
    device = res["device"]["kind"]
    for row, kind in enumerate(("kernel", "module")):
        for col, (key, label, scale) in enumerate((("seconds", "time per call (ms)", 1e3),
                                                  ("peak_bytes", "peak memory (MiB)", 2 ** -20))):
            ax = axes[row][col]
            for name in dict.fromkeys(r["name"] for r in res["results"] if r["kind"] == kind):
                for mode, style in (("forward", "-"), ("forward+backward", "--")):
                    pts = [(r["T"], r[key] * scale) for r in res["results"]
                           if r["name"] == name and r["mode"] == mode]
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", ms=3, color=colours.get(name),
                                label=f"{name} ({'fwd' if mode == 'forward' else 'fwd+bwd'})")
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label,
                   title=f"{'Attention kernels' if kind == 'kernel' else 'Multi-head modules'}"
                         f": {label.split(' (')[0]} ({device})")
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=7)


def plot_training(res: dict, fig) -> None:
    """Grouped bars: target tokens/s of each variant, book vs nn.Transformer, per configuration."""
    colours = _colours()
    configs = res["configs"]
    axes = fig.subplots(1, len(configs), squeeze=False)[0]
    for ax, c in zip(axes, configs):
        variants = list(dict.fromkeys(r["variant"] for r in c["results"]))
        for i, (m, label) in enumerate((("book", "book Transformer"), ("torch", "nn.Transformer"))):
            vals = [next((r.get("tokens_per_s") or 0 for r in c["results"]
                          if r["variant"] == v and r["model"] == m), 0) for v in variants]
            ax.bar([j + (i - 0.5) * 0.38 for j in range(len(variants))], vals, width=0.38,
                   color=colours[m], label=label)
        ax.set_xticks(range(len(variants)), variants)
        ax.set(ylabel="target tokens per second", xlabel="variant",
               title=f"Training throughput, {c['config']} config ({res['device']['kind']})")
        ax.legend()


def plot_decoding(res: dict, fig) -> None:
    """Bars: ms per output token, cached and uncached, for greedy and beam search."""
    ax = fig.subplots()
    methods = list(dict.fromkeys(r["method"] for r in res["results"]))
    for i, (cached, label) in enumerate(((True, "with key/value cache"), (False, "without cache"))):
        vals = [next(r["ms_per_token"] for r in res["results"]
                     if r["method"] == m and r["cached"] == cached) for m in methods]
        ax.bar([j + (i - 0.5) * 0.38 for j in range(len(methods))], vals, width=0.38,
               color=OKABE_ITO[2 if cached else 5], label=label)
    for j, s in enumerate(res["speedup"]):             # above the uncached bar
        top = next(r["ms_per_token"] for r in res["results"]
                   if r["method"] == s["method"] and not r["cached"])
        ax.annotate(f"cache: {s['cached_speedup']:.1f}x faster", (j + 0.19, top), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=9)
    ax.margins(y=0.12)
    ax.set_xticks(range(len(methods)), methods)
    ax.set(ylabel="milliseconds per output token", xlabel="search",
           title=f"Decoding {res['settings']['out_len']}-token outputs ({res['device']['kind']})")
    ax.legend()


def plot_recurrence(res: dict, fig) -> None:
    """Time per training step against sequence length, one line per model (log-log)."""
    ax = fig.subplots()
    names = list(dict.fromkeys(r["name"] for r in res["results"]))
    for i, name in enumerate(names):
        pts = [(r["length"], r["median_s"] * 1e3) for r in res["results"] if r["name"] == name]
        ax.plot(*zip(*pts), marker="o", color=OKABE_ITO[i % len(OKABE_ITO)], label=name,
                ls="--" if name.startswith("Transformer") else "-")
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="sequence length (S = T)", ylabel="time per training step (ms)",
           title=f"Recurrence against attention ({res['device']['kind']}, "
                 f"B = {res['settings']['B']}, d_model = {res['settings']['d_model']})")
    ax.legend()


PLOTS = {"attention": (plot_attention, (11, 8)), "training": (plot_training, (7, 4)),
         "decoding": (plot_decoding, (6.4, 4)), "recurrence": (plot_recurrence, (6.4, 4)),
         "loop": (plot_loop, (7, 4))}
RUNS = {"attention": bench_attention, "training": bench_training, "decoding": bench_decoding,
        "recurrence": bench_recurrence, "loop": bench_loop}


def busy_processes(interval: float = 0.5, threshold: float = 0.2) -> list[dict]:
    """Other processes that used more than ``threshold`` of a core during ``interval`` seconds
    (Linux /proc; empty elsewhere): who else was using the machine while it was measured."""
    def cpu_times():
        out = {}
        for p in Path("/proc").glob("[0-9]*"):
            try:
                stat = (p / "stat").read_text()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                out[int(p.name)] = (name, int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                pass
        return out
    try:
        tick = os.sysconf("SC_CLK_TCK")
        a = cpu_times()
        time.sleep(interval)
        b = cpu_times()
    except (OSError, ValueError, AttributeError):
        return []
    busy = [{"pid": pid, "name": name, "cpu": round((t - a[pid][1]) / tick / interval, 2)}
            for pid, (name, t) in b.items()
            if pid in a and pid != os.getpid() and (t - a[pid][1]) / tick / interval > threshold]
    return sorted(busy, key=lambda p: -p["cpu"])


def section_data(section: str, device: torch.device, quick: bool, short: bool, call) -> dict:
    """The data of one benchmark's result file: the section run on ``device`` inside ``call``
    (:func:`attnbook.record.record`), whose ``extra`` gets the other busy processes at the start
    and the end. ``short`` (the GPU call's budget) changes the training benchmark only."""
    call.extra["busy_processes"] = None if quick else busy_processes()
    res = RUNS[section](device, quick, short) if section == "training" else \
        RUNS[section](device, quick)
    call.extra["busy_processes_end"] = None if quick else busy_processes()
    hw = call.hardware
    return {"benchmark": section, "schema": SCHEMA, "quick": quick, "short": short,
            "device": {"kind": device.type, "name": hw["gpu"] if device.type == "cuda" else hw["cpu"],
                       "threads": torch.get_num_threads()}, **res}


def save_plot(res: dict, out: Path) -> None:
    """Draw one result into out/<benchmark>.png (matplotlib's object interface: no backend)."""
    use_book_style()
    draw, size = PLOTS[res["benchmark"]]
    fig = Figure(figsize=size, layout="constrained")
    draw(res, fig)
    fig.savefig(out / f"{res['benchmark']}.png", dpi=100, metadata=store.figure_metadata(res))
