"""Chapter 10's experiments, run as commands: the learning-rate sweep and the seeded leaderboard.

    python -m attnbook translators sweep --preset cpu-tiny --out runs/sweep --results results/cpu
    python -m attnbook translators board --preset cpu-tiny --out runs/board --reuse runs/sweep \
        --results results/cpu
    python -m attnbook translators board --preset gpu-base --out runs/board-gpu --jobs 1 \
        --results results/gpu                                          # on a GPU
    python -m attnbook translators base --out runs/cpu-base --jobs 1 --threads 2 \
        --results results/cpu                                          # an evening on a CPU

Both train many small runs with ``attnbook.commands.train`` (``--jobs`` processes at once, each with
``--threads`` PyTorch threads: one thread per run gives results that do not depend on how busy
the machine is), then score them.

* **sweep**: every model at several peak learning rates (seed 0, ``--max-steps``, shorter than
  the preset), chosen by validation loss, never by the test set. Each run also records the
  attention entropy of every layer during training, and the scoring measures what a collapsed
  model does: validation BLEU, how much the decoder leans on the source (the validation loss
  when each source is replaced by another sentence's), and how often its outputs run past
  twice the reference length. Writes ``sweep.json``.
* **board**: every model at its chosen peak learning rate, 3 seeds, the full preset (or
  ``--max-steps``), with snapshots of the weights at earlier steps: test BLEU (sacreBLEU, beam
  search and greedy) at every snapshot gives BLEU against training budget, and sacreBLEU's paired
  bootstrap compares every two models of the call, seed with seed, at every snapshot. Writes
  ``board.json`` (or ``NAME.json`` with ``--name``).
* **base**: the candidates for the ``cpu-base`` preset (BASE_CANDIDATES: a model size, batch,
  schedule and dropout each), one long run each with snapshots; every snapshot's validation
  loss and test BLEU against training minutes; checkpoint averaging of the last k snapshots,
  k chosen by validation BLEU, and the candidate with the best validation BLEU. Writes
  ``cpu_base.json``.

A run whose folder already holds its metrics is not trained again, so an interrupted command
continues where it stopped.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from ..batching import TranslationBatches, make_batch, translation_loss
from ..bleu import bleu, bleu_by_length
from ..data import load_multi30k
from ..decoding import translate
from ..training.recipe import forward_logits, override, preset
from ..training.runs import load_checkpoint, save_checkpoint
from .scoring import merge_bootstrap, output_stats, paired_bootstrap, score_base_run
from .sweeps import (SNAPSHOTS, load_weights, open_run, run_name,  # noqa: F401
                     score_all, summarise, tiny_run, train_all)
from ..utils import get_device

# Peak learning rates tried at cpu-tiny (the book's earlier Transformer peak was 1.25e-2). Each
# range brackets its model's best rate: a best rate at the end of a range would call for more.
SWEEP_LRS = {
    "transformer": (1e-3, 2e-3, 3e-3, 6e-3, 1.25e-2),
    "decoder-only": (1.5e-3, 3e-3, 6e-3, 1.2e-2),
    "gru": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2),
    "gru-additive": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2),
    "gru-dot": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2),
    "conv": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2),
    "gru-additive-wide": (2e-3, 4e-3, 8e-3, 1.6e-2),
}
# BLEU against budget: sweeps.SNAPSHOTS and the preset's last step,
BUDGET_MODELS = ("gru-additive", "transformer", "decoder-only", "conv",  # these (decoding costs)
                 "gru-additive-wide")


def sweep_jobs(preset_name: str, models, max_steps: int, out: Path, rates=None) -> list:
    """Each model at each of its SWEEP_LRS (or ``rates``), seed 0, ``max_steps`` steps."""
    jobs = []
    for m in models:
        for lr in rates or SWEEP_LRS[m]:
            cfg = replace(preset(preset_name, m, peak_lr=lr), max_steps=max_steps, seed=0,
                          snapshot_steps=tuple(s for s in SNAPSHOTS if s < max_steps))
            jobs.append((cfg, out / run_name(cfg)))
    return jobs


def board_jobs(preset_name: str, models, seeds, out: Path, reuse: Path | None = None,
               max_steps: int | None = None) -> list:
    """Every model at its preset's peak learning rate, for each seed, trained for the preset's
    steps (or ``max_steps``). With ``reuse`` (the sweep's folder, or a board's), a run whose
    first steps were already trained there (same model, rate and seed, fewer steps) starts
    from that checkpoint: the schedule does not depend on the total number of steps, so
    continuing it is the same as training from scratch (tests/test_train.py)."""
    jobs = []
    for m in models:
        for seed in seeds:
            cfg = preset(preset_name, m)
            cfg = replace(cfg, seed=seed, max_steps=max_steps or cfg.max_steps)
            cfg = replace(cfg, snapshot_steps=tuple(s for s in SNAPSHOTS if s < cfg.max_steps))
            folder = out / run_name(cfg)
            for steps in sorted({s for s in SNAPSHOTS if s < cfg.max_steps}, reverse=True):
                done = reuse and reuse / run_name(replace(cfg, max_steps=steps))
                finished = done and (done / "metrics.json").is_file()    # not one mid-way
                if finished and (done / "checkpoint.pt").is_file() and not folder.exists():
                    shutil.copytree(done, folder)
                    (folder / "metrics.json").unlink(missing_ok=True)
                    for cached in folder.glob("score_*.json"):      # the shorter run's scores
                        cached.unlink()
                    ckpt = load_checkpoint(folder / "checkpoint.pt")   # its last step: a snapshot
                    (folder / "snapshots").mkdir(exist_ok=True)
                    save_checkpoint(folder / "snapshots" / f"step_{steps}.pt", model=ckpt["model"],
                                    step=ckpt["step"], elapsed=ckpt["elapsed"])
                    break
            jobs.append((cfg, folder))
    return jobs


# ---------------------------------------------------------------------------------------------
# Scoring (after training; in worker processes too)

@torch.no_grad()
def source_reliance(model, tok, pairs, max_tokens: int) -> tuple[float, float]:
    """Validation loss with the right sources, and with each source replaced by its neighbour's
    in the same length-bucketed batch: how much the decoder uses the source (in nats/token)."""
    src = tok.encode_batch([s for s, _ in pairs])
    tgt = tok.encode_batch([t for _, t in pairs])
    val = TranslationBatches(src, tgt, max_tokens, shuffle=False)
    device = next(model.parameters()).device
    totals = {"right": 0.0, "shuffled": 0.0}
    n = 0
    for idx in val.epoch_groups(0):
        shifted = idx[1:] + idx[:1]                          # another sentence of similar length
        for key, src_idx in (("right", idx), ("shuffled", shifted)):
            b = make_batch([src[i] for i in src_idx], [tgt[i] for i in idx], idx).to(device)
            totals[key] += translation_loss(forward_logits(model, b), b.tgt_out).item() * b.n_tgt_tokens
        n += b.n_tgt_tokens
    return totals["right"] / n, totals["shuffled"] / n


def _score_sweep_run(job) -> dict:
    folder, model, tok, cfg, val, _ = open_run(job, "val")
    right, shuffled = source_reliance(model, tok, val, cfg.max_tokens)
    refs = [t for _, t in val]
    hyps = translate(model, tok, [s for s, _ in val], beam_size=cfg.beam_size, alpha=cfg.length_alpha)
    metrics = json.loads((folder / "metrics.json").read_text())
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return {"model": cfg.model, "peak_lr": cfg.peak_lr, "seed": cfg.seed, "steps": cfg.max_steps,
            "parameters": metrics["parameters"], "train_time_s": metrics["train_time_s"],
            "val_loss": round(right, 4), "val_loss_shuffled_sources": round(shuffled, 4),
            "val_bleu": bleu(hyps, refs)["bleu"], **output_stats(hyps, refs),
            "log": [{k: r[k] for k in ("step", "train_loss", "val_loss", "attention_entropy")}
                    for r in log]}


@torch.no_grad()
def flops_per_token(model, b) -> float:
    """Training FLOPs (forward + backward) per target token of batch ``b``, counted by PyTorch."""
    from torch.utils.flop_counter import FlopCounterMode
    model.train()
    with FlopCounterMode(display=False) as counter:
        with torch.enable_grad():
            translation_loss(forward_logits(model, b), b.tgt_out).backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    return counter.get_total_flops() / b.n_tgt_tokens


def _score_board_run(job) -> dict:
    """One board run's scores: test BLEU with beam search (``bleu_at_step``) and greedy search
    (``greedy_bleu_at_step``) at each snapshot and the last step, the training seconds each
    snapshot had cost (``train_s_at_step``), and the last step's details. The translations
    (``hypotheses_at_step``) are kept for the paired bootstrap and dropped from the results."""
    folder, _, tok, cfg, test, device = open_run(job, "test_2016_flickr")
    sources, refs = [s for s, _ in test], [t for _, t in test]
    row = {"model": cfg.model, "peak_lr": cfg.peak_lr, "seed": cfg.seed, "steps": cfg.max_steps,
           "bleu_at_step": {}, "greedy_bleu_at_step": {}, "train_s_at_step": {},
           "hypotheses_at_step": {}}
    steps = cfg.snapshot_steps if cfg.model in BUDGET_MODELS else ()
    for step in (*steps, cfg.max_steps):
        model, _, _ = load_weights(folder, step, device)
        hyps = translate(model, tok, sources, beam_size=cfg.beam_size, alpha=cfg.length_alpha)
        greedy = translate(model, tok, sources, beam_size=1)
        row["bleu_at_step"][str(step)] = bleu(hyps, refs)["bleu"]
        row["greedy_bleu_at_step"][str(step)] = bleu(greedy, refs)["bleu"]
        row["hypotheses_at_step"][str(step)] = {"beam": hyps, "greedy": greedy}
        if step != cfg.max_steps:
            snap = torch.load(folder / "snapshots" / f"step_{step}.pt", map_location="cpu",
                              weights_only=True)
            row["train_s_at_step"][str(step)] = round(float(snap["elapsed"]), 1)
    result = bleu(hyps, refs)
    metrics = json.loads((folder / "metrics.json").read_text())
    b = make_batch(tok.encode_batch(sources[:64]), tok.encode_batch(refs[:64])).to(device)
    row.update({"test_bleu": result["bleu"], "bleu_signature": result["signature"],
                "parameters": metrics["parameters"], "train_flops_per_token": round(flops_per_token(model, b)),
                "train_time_s": metrics["train_time_s"], "tokens_per_s": metrics["tokens_per_s"],
                "val_loss": round(metrics["val_loss"], 4), "bleu_by_length": bleu_by_length(hyps, test),
                **output_stats(hyps, refs), "hypotheses": hyps})
    row["train_s_at_step"][str(cfg.max_steps)] = metrics["train_time_s"]
    return row


_score_board_run.version = 2      # greedy as well as beam search; the translations kept


# ---------------------------------------------------------------------------------------------
# cpu-base: long runs, their snapshots, and checkpoint averaging, all chosen on the validation set

BASE_CANDIDATES = {  # name: overrides of the cpu-base preset (recipe.override); each is trained
    "medium": {},                                                     # the preset itself
    "tiny-long": dict(d_model=128, h=4, d_ff=256, n_layers=2, vocab_size=4000, max_tokens=2048,
                      warmup=200, peak_lr=6e-3, max_steps=7000, eval_every=500,
                      snapshot_steps=(2000, 4000, 6000, 6250, 6500, 6750)),  # cpu-tiny's, with dropout
}
def base_jobs(out: Path, steps: int | None = None) -> list:
    """The cpu-base candidates; with ``steps`` (the tests' tiny run), each trained that many
    steps, without snapshots."""
    jobs = []
    for name, overrides in BASE_CANDIDATES.items():
        cfg = override(preset("cpu-base"), **overrides)
        if steps:
            cfg = tiny_run(cfg, steps)
        jobs.append((cfg, out / name))
    return jobs


EXAMPLE_RULE = "test sentences 0, 100, 200, 300 and 400 (every 100th, fixed in advance), seed 0 of each model"
EXAMPLES = (0, 100, 200, 300, 400)




def score_sweep(args, folders: list) -> dict:
    """sweep.json's results: every run's scores, and each model's rate of lowest validation loss."""
    runs = score_all(_score_sweep_run, folders, args.jobs, args.threads, args.data_dir,
                     args.sentences, str(get_device(args.device)))
    chosen = {}
    for m in args.models:
        mine = [r for r in runs if r["model"] == m]
        chosen[m] = min(mine, key=lambda r: r["val_loss"])["peak_lr"]
    return {"selection": "lowest validation loss (no label smoothing) after the sweep's steps",
            "chosen_peak_lr": chosen, "runs": runs}


def score_base(args, folders: list) -> dict:
    """cpu_base.json's results: every candidate's scores, the one of best validation BLEU, and
    its translations of the example sentences."""
    runs = score_all(score_base_run, folders, 1, args.threads, args.data_dir,
                     args.sentences, str(get_device(args.device)))
    for folder, r in zip(folders, runs):
        r["candidate"] = folder.name
    chosen = max(runs, key=lambda r: r["val_bleu"])
    test = load_multi30k("test_2016_flickr", data_dir=args.data_dir)
    examples = [{"index": i, "source": test[i][0], "reference": test[i][1],
                 "hypothesis": chosen["hypotheses"][i]}
                for i in EXAMPLES if i < len(chosen["hypotheses"])]
    for r in runs:
        del r["hypotheses"], r["greedy_hypotheses"]
    return {"selection": "checkpoint average (last k snapshots) with the lowest validation "
                         "loss; then the candidate with the best validation BLEU (beam "
                         "search); the test set is scored but never chooses",
            "chosen": chosen["candidate"], "test_bleu": chosen["test_bleu"],
            "bleu_signature": chosen["bleu_signature"],
            "example_rule": EXAMPLE_RULE.replace(", seed 0 of each model", ""),
            "examples": examples, "runs": runs}


def score_board(args, folders: list) -> dict:
    """board.json's results: every run's scores, each model's test BLEU over the seeds at each
    snapshot, and the first seed's translations of the example sentences."""
    runs = score_all(_score_board_run, folders, args.jobs, args.threads, args.data_dir,
                     args.sentences, str(get_device(args.device)))
    test = load_multi30k("test_2016_flickr", data_dir=args.data_dir)
    examples = [{"index": i, "source": test[i][0], "reference": test[i][1],
                 **{r["model"]: r["hypotheses"][i] for r in runs if r["seed"] == args.seeds[0]}}
                for i in EXAMPLES if i < len(runs[0]["hypotheses"])]
    bootstrap = paired_bootstrap(runs, [t for _, t in test][:len(runs[0]["hypotheses"])],
                                 args.models)
    for r in runs:
        del r["hypotheses"], r["hypotheses_at_step"]
    summary, greedy = {}, {}
    for m in args.models:
        mine = [r for r in runs if r["model"] == m]
        summary[m] = {step: summarise([r["bleu_at_step"][step] for r in mine])
                      for step in mine[0]["bleu_at_step"]}
        greedy[m] = {step: summarise([r["greedy_bleu_at_step"][step] for r in mine])
                     for step in mine[0]["greedy_bleu_at_step"]}
    return {"summary_test_bleu": summary, "summary_greedy_test_bleu": greedy,
            "bootstrap_rule": "sacreBLEU's paired bootstrap (1,000 resamples of the test set): "
                              "every two models of a call, seed with seed, at every step both "
                              "were scored, beam search and greedy",
            "bootstrap": bootstrap, "example_rule": EXAMPLE_RULE,
            "examples": examples, "runs": runs}


def merged(out: dict, old: dict | None) -> dict:
    """A sweep.json or board.json as :func:`attnbook.experiments.registry.save` merged it (a
    call's runs replace those of the same model, rate and seed), with what is said per model
    merged too: each model's chosen rate and summaries, the bootstrap comparisons of the call's
    pairs, the call's models' translations of each example; ``train_time_s_sum`` over all the
    runs (some may have been trained by earlier calls: an interrupted command continues).
    ``old``: the file before the call (None: there was none)."""
    out = dict(out)
    if old is not None:
        for key in ("chosen_peak_lr", "summary_test_bleu", "summary_greedy_test_bleu"):
            if key in out:
                out[key] = {**old.get(key, {}), **out[key]}
        if "bootstrap" in out:
            out["bootstrap"] = merge_bootstrap(old.get("bootstrap", []), out["bootstrap"])
        if "examples" in out and "examples" in old:          # one more model per example
            mine = {e["index"]: e for e in out["examples"]}
            out["examples"] = [{**e, **mine.get(e["index"], {})} for e in old["examples"]]
    out["train_time_s_sum"] = round(sum(r["train_time_s"] for r in out["runs"]), 1)
    return out
