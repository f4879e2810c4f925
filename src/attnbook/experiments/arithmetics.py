"""Numbers on your machine: the same runs with three of PyTorch's kernel sets, on one machine
(the book's page book/reproducibility.md).

    python -m attnbook arithmetics --results results/cpu   # about 20 CPU-minutes
    python -m attnbook arithmetics --results out --tiny    # seconds (the tests)

A reader's laptop computes with other vector instructions than the machine that made the book's
results: AVX2 instead of AVX-512, NEON on Apple silicon, and other kernels of MKL and oneDNN. To
see what that does without another machine, the command runs the same work in three
:data:`ARITHMETICS`: this machine's own, and PyTorch, MKL and oneDNN capped at AVX2 and at their
plain kernels (the environment variables that ``make test-portable`` sets). Each is a worker
process, this command again with ``--worker NAME`` in that environment, which

* times a 1,024 x 1,024 matrix product in float32 and in bfloat16 (GFLOP/s, the best of five):
  where the CPU has no native bf16, PyTorch emulates it;
* computes three things in float32 from seeded numbers (:data:`PROBES`): a matrix product, a
  softmax and a sum of a million numbers; their largest difference from this machine's own,
  relative to their largest value, shows the last bits;
* trains seed 0 of chapters 1-3's reversal runs (:data:`RUNS`) with the ``toy_seeds`` command,
  as the chapters train them.

The command then compares each run with seed 0 of the committed ``results/cpu/toy_seeds.json``,
kind of quantity by kind (:func:`attnbook.reproduce.kind`: exact match by length, per-token
accuracy, the final loss, the attention statistics): the largest difference from the committed
seed 0, and the largest difference between two of the committed seeds. Their ratio is what
:data:`attnbook.reproduce.K_RANGE` must cover. It writes ``arithmetics.json`` and its figure.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .. import store
from ..reproduce import K_RANGE, from_seeds, kind
from ..toy import run_quantities
from ..utils import arithmetic, native_bf16

# name: the environment variables that lower this machine's kernels (none: its own)
ARITHMETICS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "plain": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
              "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
RUNS = ("no-attention", "additive", "additive-600", "dot-600", "general-600")
PROBES = {"matrix product": "a 256 x 512 times a 512 x 256 matrix",
          "softmax": "along the rows of a 1000 x 1000 matrix",
          "sum": "of the 1000000 numbers of that matrix"}
SIZE, TINY_SIZE = 1024, 64


def gflops(dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """GFLOP/s of an n x n matrix product in ``dtype`` (the best of ``repeats``, after one)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return round(2 * n ** 3 / best / 1e9, 2)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def worker(name: str, tiny: bool, folder: Path) -> None:
    """One arithmetic's measurements (run in its own environment), written into ``folder``:
    NAME.json (its arithmetic, bf16, GFLOP/s), NAME.pt (the last-bit probes) and, by the toy_seeds
    command run here in the same environment, NAME/toy_seeds.json (the runs)."""
    torch.set_num_threads(1)
    n = TINY_SIZE if tiny else SIZE
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(256, 512, generator=g), torch.randn(512, 256, generator=g)
    x = torch.randn(1000, 1000, generator=g)
    torch.save({"matrix product": a @ b, "softmax": x.softmax(-1), "sum": x.sum()},
               folder / f"{name}.pt")
    result = {"name": name, "made_with": arithmetic(), "native_bf16": native_bf16()[0],
              "gflops": {"fp32": gflops(torch.float32, n), "bf16": gflops(torch.bfloat16, n)}}
    (folder / f"{name}.json").write_text(json.dumps(result))
    subprocess.run([sys.executable, "-m", "attnbook", "toy_seeds", "--results",
                    str(folder / name), "--runs", *RUNS, "--seeds", "0", "--no-timing"]
                   + (["--tiny"] if tiny else []), check=True, stdout=subprocess.DEVNULL)


def spawn(name: str, tiny: bool, folder: Path) -> subprocess.Popen:
    """Start the worker of arithmetic ``name`` in its environment (one thread)."""
    env = {k: v for k, v in os.environ.items() if k not in ARITHMETICS["plain"]}
    env |= ARITHMETICS[name] | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnbook", "arithmetics", "--worker", name,
           "--results", str(folder)] + (["--tiny"] if tiny else [])
    return subprocess.Popen(cmd, env=env)


def compared(worker_result: dict, committed: dict, probes: dict, native: dict) -> dict:
    """A worker's measurements against the committed seeds of each run, kind by kind."""
    rows = []
    for r in worker_result["runs"]:
        keys = tuple(r.get("alignment", {}))
        seeds = {s["seed"]: run_quantities(s, keys) for s in committed["runs"]
                 if s["name"] == r["name"]}
        here, seed0 = run_quantities(r, keys), seeds[0]
        spread = from_seeds(list(seeds.values()), k=1)      # each kind's largest seed difference
        kinds = {}
        for group in dict.fromkeys(kind(q) for q in here):
            names = [q for q in here if kind(q) == group]
            apart = spread[names[0]].value
            diff = max(abs(here[q] - seed0[q]) for q in names)
            kinds[group] = {"difference": round(diff, 4), "seeds_apart": round(apart, 4),
                            "ratio": round(diff / apart, 3) if apart else None}
        rows.append({"run": r["name"], "kinds": kinds})
    out = {k: worker_result[k] for k in ("name", "made_with", "native_bf16", "gflops")}
    out["last_bits"] = {k: float((probes[k] - native[k]).abs().max() / native[k].abs().max())
                        for k in probes}     # the largest difference, relative to the largest value
    return out | {"runs": rows}


def figure(result: dict, path: Path) -> None:
    """Each run's distance from the committed seed 0, in units of the largest difference
    between two committed seeds (the largest over its kinds), for each arithmetic."""
    import matplotlib.pyplot as plt
    from ..plotting import OKABE_ITO, use_book_style
    use_book_style()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    names = [r["run"] for r in result["arithmetics"][0]["runs"]]
    for i, a in enumerate(result["arithmetics"]):
        ratios = [max((k["ratio"] or 0.0) for k in r["kinds"].values()) for r in a["runs"]]
        x = [j + (i - 1) * 0.27 for j in range(len(names))]
        ax.bar(x, ratios, width=0.27, color=OKABE_ITO[i],
               label=f"{a['name']} ({a['made_with']['cpu_capability']})")
        for xi, r in zip(x, ratios):
            if r == 0:                                  # bit for bit: no bar to see
                ax.text(xi, 0.05, "0", ha="center", va="bottom", fontsize=8, color=OKABE_ITO[i])
    ax.axhline(K_RANGE, color="grey", linestyle="--", label=f"the checks' tolerance, {K_RANGE} x")
    ax.axhline(1, color="grey", linestyle=":", lw=1)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, K_RANGE + 1.2)
    ax.set(xlabel="seed 0 of chapters 1-3's reversal runs",
           ylabel="difference from the committed run\n/ largest difference between two seeds",
           title="The same seed, three arithmetics: how far from the committed run?")
    ax.legend(fontsize=8, loc="upper center", ncols=2)
    fig.tight_layout()
    fig.savefig(path, metadata=store.figure_metadata(result))
    plt.close(fig)
