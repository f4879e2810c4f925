"""The GPU call: everything the book measures on a GPU, as one command of at most nine minutes.

    python -m attnbook gpu_run --prepare-data       # once, here: Multi30k into .gpu_data/ (ignored)
    bash tools/gpu_run.sh                           # on the GPU: python -m attnbook gpu_run --out $OUT
    python -m attnbook gpu_run --out OUT --dry-run  # the same parts, tiny, on the CPU (make test)
    python -m attnbook gpu_run --collect OUT        # afterwards: the call's files into results/

``--plan eager`` runs check, train and score only, with five of the candidates for 150 s each
(about four minutes). ``--plan seeds`` races three seeds of each family's choice at gpu-base
(the Transformer, decoder-only and GRU + additive, nine runs at once for 180 s), scores every
run with beam search and greedily, and runs sacreBLEU's paired bootstrap between the families,
seed with seed (about six minutes). The plans that give each run the GPU to itself train their
candidates one after another (``Plan.alone``): ``--plan select`` trains gpu-base against dropout
0.3 for four minutes each; ``--plan families0`` (``families1``, ``families2``) trains the
Transformer, GRU + additive, ConvS2S and decoder-only for 80 s each with one seed, scores every
run both ways and bootstraps the families. The plans are in ``gpu_plans``.

A lent GPU machine has no network, no package index and no copy of this repository's data, and
it is lent for minutes; so the call is prepared here, tried here at tiny sizes (``--dry-run``),
and runs there in one go. Its parts run in this order, each as child processes with their own
time limit, so that a part that fails or overruns loses nothing of the others (the call's
deadline, ``Plan.minutes``, shortens the limits of the last parts when the first ones overran):

* ``check``: PyTorch's version (at least MIN_TORCH), the device (a CUDA GPU, its name, memory,
  compute capability and bf16 support), every Multi30k file (sha256-checked) and the tokenizers,
  trained once here and shared with the other parts through ``ATTNBOOK_CACHE``;
* ``train``: the candidates for the gpu-base preset (CANDIDATES: the paper's schedule, a short
  warm-up, a higher peak, pre-LN, dropout 0.3, a smaller model, a larger batch) and GRU +
  additive attention at two peak rates, all trained at once on the one GPU (the small models
  do not fill it), each for the same ``Plan.train_seconds`` of training, the Transformers in
  bf16 autocast, eager (``Plan.compile``); every candidate's validation curve is kept;
* ``score``: the best Transformer and the best GRU by validation loss, translated on
  test_2016_flickr with beam 4 (alpha 0.6, as the CPU board) and greedily, scored by sacreBLEU;
  then the other candidates greedily while time is left. Equal wall time for both families is
  the paper's parallelism claim measured on the clock (all ran at once, so equally crowded);
* ``bench-recurrence``, ``bench-training``, ``bench-loop``, ``bench-attention``, ``bench-decoding``:
  ``python -m attnbook benchmarks --short``, one section each, alone on the GPU: recurrence
  against self-attention as the sequence grows, the gpu-base training step (bf16 against fp32,
  compiled against eager, the book's model against ``nn.Transformer``, MFU), the real training
  loop against its step alone on the loop's own batches (with a profile of the loop), the attention
  kernels (the book's, SDPA's backends) and the key/value cache;
* ``summary``: ``gpu_run.json`` (each part's status, limit and time, the candidates and their
  curves, the scores, and one provenance record) and ``gpu_run.png`` (the curves).

OUT receives at most 8 files (what a lent machine returns): gpu_run.json, gpu_run.png,
gpu_run.log and <device>/{attention,decoding,recurrence,training,loop}.json (``--plan seeds``:
gpu_run_hypotheses.json too, every translation, which stays out of results/). ``--collect``
copies them into results/gpu/ and results/bench/cuda/ and draws the benchmark figures.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from matplotlib.figure import Figure

from .. import store
from ..record import COMMIT_FILE, Provenance, git_commit, record, write_commit
from .registry import save
from .scoring import paired_bootstrap
from .sweeps import TINY_VAL_SENTENCES
from ..benchmarks.suite import save_plot
from ..bleu import bleu
from ..data import SPLITS, DataError, locate, load_multi30k
from ..decoding import translate
from ..plotting import OKABE_ITO, PAGE_WIDTH, use_book_style
from ..training.recipe import ConfigError, check_config, flatten, override, preset
from ..training.runs import load_run
from ..tokenizer import multi30k_tokenizer
from ..training.loop import train
from ..utils import get_device, versions

ROOT = Path(__file__).resolve().parents[3]
DATA_COPY = COMMIT_FILE.parent            # what travels to the GPU machine (ignored by git)
MIN_TORCH = (2, 4)                        # the oldest PyTorch the call's code paths are known for
SCHEMA = 1

from .gpu_plans import (BENCH_PARTS, CANDIDATES, DRY, DRY_CANDIDATES, DRY_SEEDS,  # noqa: F401
                        DRY_SEEDS_CANDIDATES, EAGER, EXTRA_PARTS, FAMILIES, FULL, PARTS, PLANS,
                        SEED_FAMILIES,
                        SEEDS, SEEDS_CANDIDATES, SELECT, Plan)



def candidate_config(plan: Plan, name: str):
    """The TrainConfig of candidate ``name``: the base preset with its changes, trained for
    ``plan.train_seconds`` (max_steps out of reach), evaluated every ``plan.eval_every`` steps
    (a dry run's on the first TINY_VAL_SENTENCES validation sentences)."""
    model, changes = plan.candidates[name]
    cfg = override(preset(plan.preset, model), **changes, max_steps=10 ** 6,
                   time_budget_s=plan.train_seconds, eval_every=plan.eval_every,
                   val_sentences=TINY_VAL_SENTENCES if plan.dry else 0,
                   compile=plan.compile and plan.device == "cuda" and model != "gru-additive")
    check_config(cfg)
    return cfg


# --- the parts that run as child processes ----------------------------------------------------

def _write(path: Path, obj) -> None:
    """Write JSON atomically: a part killed at its limit leaves the last complete version."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def child_check(plan: Plan, work: Path) -> int:
    """PyTorch, the device, the data and the tokenizers; check.json says what was found."""
    found = {"torch": torch.__version__, "versions": versions()}
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    problems = []
    if (major, minor) < MIN_TORCH:
        problems.append(f"PyTorch {torch.__version__} is older than "
                        f"{'.'.join(map(str, MIN_TORCH))}; use a newer one")
    if plan.device == "cuda":
        if not torch.cuda.is_available():
            problems.append("PyTorch sees no CUDA GPU; run the call on a GPU machine, or pass "
                            "--dry-run to try it on the CPU")
        else:
            p = torch.cuda.get_device_properties(0)
            found["gpu"] = {"name": p.name, "memory_gib": round(p.total_memory / 2 ** 30, 1),
                            "capability": f"{p.major}.{p.minor}",
                            "multiprocessors": p.multi_processor_count,
                            "bf16": torch.cuda.is_bf16_supported(including_emulation=False)}
    try:
        found["data"] = {split: len(load_multi30k(split)) for split in SPLITS}
        sizes = sorted({candidate_config(plan, n).arch.vocab_size for n in plan.candidates})
        if not problems:                 # no tokenizer for a call that cannot run anyway
            found["tokenizers"] = {str(v): len(multi30k_tokenizer(v)) for v in sizes}
    except (DataError, ConfigError) as e:
        problems.append(str(e))
    found["problems"] = problems
    _write(work / "check.json", found)
    print(json.dumps(found, indent=1))
    return 2 if problems else 0


def child_candidate(plan: Plan, work: Path, name: str) -> int:
    """Train candidate ``name`` into work/runs/NAME (no BLEU here: the score part decodes)."""
    torch.set_num_threads(plan.threads)
    train(candidate_config(plan, name), work / "runs" / name, device=get_device(plan.device),
          progress=False, evaluate=False)
    return 0


def child_score(plan: Plan, work: Path) -> int:
    """BLEU on test_2016_flickr: each family's best by validation loss, with beam search and
    greedily, then the others greedily (``plan.score_all``: every run both ways, then the paired
    bootstrap between the families, seed with seed); score.json grows after every decoding."""
    runs = collect_candidates(plan, work)
    best = best_runs(plan, runs)
    pairs = load_multi30k("test_2016_flickr")
    pairs = pairs[:plan.test_sentences] if plan.test_sentences else pairs
    if plan.score_all:
        order = [(n, b) for n in plan.candidates if runs[n]["val_loss"] for b in (plan.beam, 1)]
    else:
        order = [(n, plan.beam) for n in best.values()] + [(n, 1) for n in best.values()]
        order += [(n, 1) for n in plan.candidates
                  if n not in best.values() and runs[n]["val_loss"]]
    hyps_by_run = {}
    scores = {"test_set": f"test_2016_flickr ({len(pairs)} of 1000 sentences)", "best": best,
              "runs": {}}
    device = get_device(plan.device)
    for name, beam in order:
        start = time.perf_counter()
        model, tok, _ = load_run(work / "runs" / name, device)
        hyps = translate(model, tok, [s for s, _ in pairs], beam, alpha=0.6, device=device)
        result = bleu(hyps, [t for _, t in pairs])
        key = "greedy" if beam == 1 else f"beam {beam}, alpha 0.6"
        scores["runs"].setdefault(name, {})[key] = {
            **result, "seconds": round(time.perf_counter() - start, 1), "examples": hyps[:3]}
        hyps_by_run.setdefault(name, {})["greedy" if beam == 1 else "beam"] = hyps
        _write(work / "score.json", scores)
        print(f"{name} {key}: BLEU {result['bleu']}", flush=True)
    if plan.score_all:
        _write(work / "hypotheses.json", hyps_by_run)
        scores["bootstrap"] = bootstrap_families(plan, hyps_by_run, [t for _, t in pairs])
        _write(work / "score.json", scores)
    return 0


def bootstrap_families(plan: Plan, hyps_by_run: dict, refs: list[str]) -> list[dict]:
    """sacreBLEU's paired bootstrap (``scoring.paired_bootstrap``) between every two families of
    the plan, seed with seed, for the runs decoded both ways (step "end": each run's last)."""
    runs = [{"model": model, "seed": changes["seed"],
             "hypotheses_at_step": {"end": hyps_by_run[name]}}
            for name, (model, changes) in plan.candidates.items()
            if set(hyps_by_run.get(name, {})) == {"beam", "greedy"}]
    return paired_bootstrap(runs, refs, list(dict.fromkeys(m for m, _ in plan.candidates.values())))


CHILDREN = {"_check": child_check, "_candidate": child_candidate, "_score": child_score}


# --- reading what the parts left -------------------------------------------------------------

def read_curve(run: Path) -> list[dict]:
    """The validation curve of a run folder's log.jsonl (empty if it never evaluated)."""
    path = run / "log.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    keys = ("step", "elapsed_s", "train_loss", "val_loss", "epoch")
    return [{k: round(v, 4) if isinstance(v, float) else v
             for k, v in json.loads(line).items() if k in keys} for line in lines if line.strip()]


def collect_candidates(plan: Plan, work: Path) -> dict:
    """name -> what its run folder shows: configuration, curve, and the final metrics if the
    run finished (else the last evaluation's)."""
    out = {}
    for name, (model, changes) in plan.candidates.items():
        run = work / "runs" / name
        curve = read_curve(run)
        metrics = json.loads((run / "metrics.json").read_text()) \
            if (run / "metrics.json").is_file() else {}
        last = curve[-1] if curve else {}
        cfg = flatten(asdict(candidate_config(plan, name)))
        out[name] = {
            "model": model, "changes": changes, "finished": bool(metrics),
            "config": {k: cfg[k] for k in ("d_model", "h", "d_ff", "n_layers", "dropout",
                                           "norm_first", "vocab_size", "max_tokens", "warmup",
                                           "peak_lr", "precision", "compile")},
            "steps": metrics.get("steps", last.get("step")),
            "epochs": round(metrics["epochs"], 2) if metrics else last.get("epoch"),
            "train_time_s": metrics.get("train_time_s", last.get("elapsed_s")),
            "tokens_per_s": metrics.get("tokens_per_s"),
            "parameters": metrics.get("parameters"), "compiled": metrics.get("compiled"),
            "val_loss": round(metrics["val_loss"], 4) if metrics else last.get("val_loss"),
            "curve": curve}
    return out


def best_runs(plan: Plan, runs: dict) -> dict:
    """model -> the name of its candidate with the lowest validation loss (chosen on the
    validation set only; families with no evaluated run are left out)."""
    best = {}
    for model in dict.fromkeys(m for m, _ in plan.candidates.values()):
        done = [n for n in plan.runs(model) if runs[n]["val_loss"] is not None]
        if done:
            best[model] = min(done, key=lambda n: runs[n]["val_loss"])
    return best


# --- the driver ------------------------------------------------------------------------------

def _child_env(plan: Plan, work: Path, data_dir: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ATTNBOOK_CACHE=str(work / "cache"),
               ATTNBOOK_GIT_COMMIT=git_commit()[0],
               ATTNBOOK_DETERMINISM="warn", CUBLAS_WORKSPACE_CONFIG=":4096:8",
               OMP_NUM_THREADS=str(plan.threads), PYTHONUNBUFFERED="1",
               TORCHINDUCTOR_COMPILE_THREADS="2")
    if data_dir is not None:
        env["MULTI30K_DIR"] = str(data_dir)
    return env


def run_processes(commands: list[list[str]], limit: float, log: Path, env: dict | None = None,
                  cwd: Path | None = None) -> dict:
    """Run ``commands`` at once, each in its own process group, their output appended to
    ``log``; after ``limit`` seconds the ones still running are killed with all they started.
    Returns the part's record: status ok (all exited 0), failed or timeout; return codes; time."""
    start = time.perf_counter()
    with open(log, "a") as f:
        procs = [subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                  start_new_session=True) for c in commands]
        timed_out = False
        for p in procs:
            try:
                p.wait(timeout=max(0.0, limit - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                timed_out = True
                for q in procs:
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                        q.wait()
                break
    codes = [p.returncode for p in procs]
    status = "timeout" if timed_out else "ok" if all(c == 0 for c in codes) else "failed"
    return {"status": status, "return_codes": codes, "limit_s": round(limit, 1),
            "seconds": round(time.perf_counter() - start, 1)}


def run_one_at_a_time(commands: list[list[str]], limit: float, log: Path, env=None) -> dict:
    """``run_processes`` for each command in turn, each with an equal share of what is left of
    ``limit``; one record for all of them."""
    start, records = time.perf_counter(), []
    for i, c in enumerate(commands):
        left = limit - (time.perf_counter() - start)
        records.append(run_processes([c], max(0.0, left / (len(commands) - i)), log, env))
    codes = [r["return_codes"][0] for r in records]
    status = "timeout" if any(r["status"] == "timeout" for r in records) else \
        "ok" if all(c == 0 for c in codes) else "failed"
    return {"status": status, "return_codes": codes, "limit_s": round(limit, 1),
            "seconds": round(time.perf_counter() - start, 1), "one_at_a_time": True}


def part_commands(part: str, plan: Plan, work: Path) -> list[list[str]]:
    """The child processes of one part."""
    me = [sys.executable, "-m", "attnbook", "gpu_run"]
    if part == "train":
        return [me + ["_candidate", plan.name, str(work), n] for n in plan.candidates]
    if part in ("check", "score"):
        return [me + ["_" + part, plan.name, str(work)]]
    if part == "recall-generation":                # run in OUT: the file lands there
        return [[sys.executable, "-m", "attnbook", "recall_runs", "--only",
                 "generation", "--device", plan.device, "--out", "recall_generation.json",
                 "--note", "the GPU call (python -m attnbook gpu_run --plan recall)"]
                + (["--lengths", "64", "128"] if plan.dry else [])]
    section = part.removeprefix("bench-")          # run in OUT, so that --out is relative
    return [[sys.executable, "-m", "attnbook", "benchmarks", "--only", section, "--device",
             plan.device, "--out", plan.device, "--short", "--no-plots",
             "--threads", str(plan.threads if plan.dry else 4),
             "--note", "the GPU call (python -m attnbook gpu_run)"]
            + (["--quick"] if plan.dry else [])]


def run_call(plan: Plan, out: Path, work: Path, data_dir: Path | None, only=None) -> dict:
    """Every part in turn within the call's deadline, measured as one call (``record``);
    then the summary. Returns it."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    plan_name = plan.name.removeprefix("dry").removeprefix("-") or "full"
    own = ("python -m attnbook gpu_run" + (" --dry-run" if plan.dry else "")
           + (f" --plan {plan_name}" if plan_name != "full" else "")
           + "".join(f" --only {p}" for p in plan.parts if only and p in only) + " --out OUT")
    at_once = 1 if plan.alone else len(plan.candidates)
    with record(own, threads=plan.threads, processes=at_once) as call:
        parts = run_parts(plan, out, work, data_dir, only)
    return summarise(plan, out, work, parts, call)


def run_parts(plan: Plan, out: Path, work: Path, data_dir: Path | None, only=None) -> dict:
    """part -> its record (status, return codes, limit, seconds; or why it was skipped)."""
    deadline = time.time() + 60 * plan.minutes - 15            # 15 s for the summary
    log, env = out / "gpu_run.log", _child_env(plan, work, data_dir)
    parts = {}
    for part in plan.parts:
        if only and part not in only:
            continue
        left = deadline - time.time()
        if parts.get("check", {}).get("status") not in (None, "ok"):
            parts[part] = {"status": "skipped", "why": "the check failed (see check)"}
            continue
        if left < 5:
            parts[part] = {"status": "skipped", "why": "the call's deadline had passed"}
            continue
        with open(log, "a") as f:
            f.write(f"\n=== {part} (limit {min(plan.limits[part], left):.0f} s) ===\n")
        cwd = out if part.startswith("bench-") or part in EXTRA_PARTS else None
        commands, limit = part_commands(part, plan, work), min(plan.limits[part], left)
        if part == "train" and plan.alone:         # one after another: the GPU to each alone
            parts[part] = run_one_at_a_time(commands, limit, log, env)
        else:
            parts[part] = run_processes(commands, limit, log, env, cwd)
        print(f"{part}: {parts[part]['status']} in {parts[part]['seconds']} s", flush=True)
        if part == "train":
            _append_run_logs(plan, work, log)
    return parts


def _append_run_logs(plan: Plan, work: Path, log: Path) -> None:
    """The last lines of each candidate's log into the call's log (the runs write no more)."""
    with open(log, "a") as f:
        for name in plan.candidates:
            lines = read_curve(work / "runs" / name)[-3:]
            f.write(f"--- {name}: last evaluations {json.dumps(lines)}\n")


def summarise(plan: Plan, out: Path, work: Path, parts: dict, call: Provenance) -> dict:
    """gpu_run.json (with ``call``, the call's provenance record) and gpu_run.png from what the
    parts left."""
    runs = collect_candidates(plan, work)
    check = json.loads((work / "check.json").read_text()) if (work / "check.json").is_file() \
        else {}
    scores = json.loads((work / "score.json").read_text()) if (work / "score.json").is_file() \
        else {}
    call.extra.update(gpu=check.get("gpu"),
                      processes_at_once={"train": 1 if plan.alone else len(plan.candidates),
                                         "other parts": 1})
    save(experiment_of(plan.name), out / "gpu_run.json", {
        "kind": "attnbook GPU call", "schema": SCHEMA, "dry_run": plan.dry,
        "plan": {k: v for k, v in asdict(plan).items() if k != "candidates"},
        "parts": parts, "check": {k: v for k, v in check.items() if k != "versions"},
        "candidates": runs, "best": best_runs(plan, runs), "scores": scores}, call)
    summary = store.read(out / "gpu_run.json")
    if (work / "hypotheses.json").is_file():      # every translation, to test other claims later
        shutil.copy2(work / "hypotheses.json", out / "gpu_run_hypotheses.json")
    if any(r["curve"] for r in runs.values()):
        plot_candidates(summary, out / "gpu_run.png")
    return summary


def plot_candidates(summary: dict, path: Path) -> None:
    """Validation loss against training time and against steps, one line per candidate:
    Transformers solid, GRUs dashed, each family's best drawn thicker."""
    use_book_style()
    fig = Figure(figsize=(PAGE_WIDTH, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    best = set(summary["best"].values())
    device = (summary["calls"][0]["extra"]["gpu"] or {}).get("name", summary["plan"]["device"])
    for i, (name, run) in enumerate(summary["candidates"].items()):
        if not run["curve"]:
            continue
        style = dict(color=OKABE_ITO[i % len(OKABE_ITO)], marker="o", ms=2,
                     ls="--" if run["model"].startswith("gru") else "-",
                     lw=2.6 if name in best else 1.2,
                     label=f"{name}{' (best)' if name in best else ''}")
        for ax, key in zip(axes, ("elapsed_s", "step")):
            ax.plot([p[key] for p in run["curve"]], [p["val_loss"] for p in run["curve"]], **style)
    for ax, xlabel in zip(axes, ("training time (s)", "optimiser steps")):
        ax.set(xlabel=xlabel, ylabel="validation loss (nats per token)",
               title=f"Candidates trained at once on {device}")
    axes[1].legend(fontsize=8)
    fig.savefig(path, dpi=100, metadata=store.figure_metadata(summary))


# --- before and after the call -----------------------------------------------------------------

def prepare_data(dest: Path = DATA_COPY) -> list[Path]:
    """Copy the nine Multi30k files (from $MULTI30K_DIR or the cache, sha256-checked) into
    ``dest``/multi30k and record the current commit in ``dest``/COMMIT: what the GPU machine,
    which sees only the repository, reads."""
    (dest / "multi30k").mkdir(parents=True, exist_ok=True)
    copied = []
    for split in SPLITS:
        for lang in ("de", "en", "fr"):
            src = locate(split, lang)
            copied.append(Path(shutil.copy2(src, dest / "multi30k" / src.name)))
    commit, dirty = git_commit()
    if not commit or dirty:
        raise ValueError("src/ has uncommitted changes (or this is no git repository): commit "
                         "them first, so that the call's results name the code they ran")
    write_commit(commit, dest / "COMMIT")
    return copied


def result_stem(plan: str) -> str:
    """The name a call's summary gets in results/gpu/: gpu_run (the full call), gpu_run_PLAN."""
    return "gpu_run" if plan == "full" else f"gpu_run_{plan}"


def experiment_of(plan: str) -> str:
    """The experiment of the registry that a call of ``plan`` makes (a dry run: that of the plan
    it stands in for): the stem of its summary; recall_gpu for plan recall (its summary and its
    recall_generation.json); gpu_run_families for the three calls of the families."""
    plan = "full" if plan == "dry" else plan.removeprefix("dry-")
    if plan == "recall":
        return "recall_gpu"
    return "gpu_run_families" if plan.startswith("families") else result_stem(plan)


def collect(src: Path, results: Path, allow_dry: bool = False) -> list[Path]:
    """Copy a call's files from ``src`` into ``results``/gpu and ``results``/bench/<device>,
    and draw the benchmark figures. Refuses a dry run (unless ``allow_dry``: the tests) and a
    file that names a path of the machine that made it."""
    summary_path = src / "gpu_run.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} not found; give the folder the call wrote "
                                "(its $OUT)")
    summary = json.loads(summary_path.read_text())
    if summary.get("dry_run") and not allow_dry:
        raise ValueError(f"{summary_path} is a dry run's (tiny sizes on the CPU), not results; "
                         "collect the files of a call made on a GPU")
    device, stem = summary["plan"]["device"], result_stem(summary["plan"]["name"])
    files = [(summary_path, results / "gpu" / f"{stem}.json"),
             (src / "gpu_run.png", results / "gpu" / f"{stem}.png"),
             (src / "recall_generation.json", results / "gpu" / "recall_generation.json")]
    files += [(f, results / "bench" / device / f.name)
              for f in sorted((src / device).glob("*.json"))]
    copied = []
    for f, dest in files:
        if not f.is_file():
            continue
        text = f.read_text() if f.suffix == ".json" else ""
        for marker in ("/tmp/", "/root/", "/home/", "/work/", "/opt/"):
            if marker in text:
                raise ValueError(f"{f} names a path of the machine that made it ({marker}...); "
                                 "results must not: fix the writer, then run the call again")
        dest.parent.mkdir(parents=True, exist_ok=True)
        copied.append(Path(shutil.copy2(f, dest)))
        if f.suffix == ".json" and dest.parent.name == device:
            save_plot(json.loads(text), dest.parent)
    return copied
