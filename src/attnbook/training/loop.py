"""The training loop of chapter 9's translators: ``python -m attnbook train`` runs it, the
experiments call it (this module is the library; ``train`` the command).

The recipe (configuration, presets, schedule, loss, model registry) is in ``recipe``; the run
folder's files (checkpoints, loading a run, averaging) in ``runs``. The loop reads top to bottom
in :func:`train`: :func:`setup` (data, model, optimiser, schedule, precision, resume), then
:func:`train_step` until :func:`finished`, with :func:`evaluate_and_save` every ``eval_every``
steps, and :func:`finish` (metrics and BLEU). The forward pass runs in the precision the device
supports (``utils.choose_precision``: bf16 autocast on recent CUDA GPUs, fp16 autocast with a
GradScaler on older ones such as a T4 and on Apple MPS, float32 on a CPU), and
``cfg.compile`` compiles the model with ``torch.compile``.

A run writes into its folder: ``checkpoint.pt`` (model, optimizer, schedule, data position and
random states: training resumes exactly where it stopped), ``tokenizer.model``, ``log.jsonl``
(one line per evaluation), ``snapshots/step_N.pt`` (weights at ``cfg.snapshot_steps``) and
``metrics.json`` (BLEU with the sacreBLEU signature, parameters, wall time, hardware and
versions). Batches are (B, S) sources and (B, T) targets with masks True at real tokens.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..batching import TranslationBatches, translation_loss
from ..bleu import bleu_score
from ..data import load_multi30k
from ..mha import attention_modules, recording
from .recipe import TrainConfig, build_model, forward_logits
from ..rnn import Seq2Seq
from .runs import check_resumable, load_checkpoint, save_checkpoint, trim_log
from ..schedules import training_scheduler
from ..tokenizer import Tokenizer, multi30k_tokenizer
from ..utils import (Precision, choose_precision, count_parameters, deterministic, get_device,
                    versions)


@dataclass
class Data:
    tokenizer: Tokenizer
    train: TranslationBatches
    val: TranslationBatches
    test_pairs: list = field(default_factory=list)


# Encoding Multi30k's 58,000 training sentences takes a second or two. A process that prepares
# the same data again (a notebook, the runs of a sweep in one process, the test suite) reuses the
# ids: keyed by the tokenizer's bytes and the sentences themselves, so nothing stale is reused.
_ENCODED: dict = {}


def encode_pairs(tok: Tokenizer, pairs: list) -> tuple[tuple, tuple]:
    """The ids of the sources and of the targets of ``pairs`` (as tuples: shared, read-only)."""
    key = (tok.model_file.read_bytes(), hash(tuple(pairs)))
    if key not in _ENCODED:
        if len(_ENCODED) >= 8:
            _ENCODED.clear()
        _ENCODED[key] = (tuple(tok.encode_batch([s for s, _ in pairs])),
                         tuple(tok.encode_batch([t for _, t in pairs])))
    return _ENCODED[key]


def prepare_data(cfg: TrainConfig, data_dir=None) -> Data:
    """Tokenizer and batches. Every sentence is kept: nothing is filtered or truncated. The
    tokenizer has exactly ``cfg.arch.vocab_size`` pieces, the model's vocabulary."""
    tok = multi30k_tokenizer(cfg.arch.vocab_size, (cfg.src_lang, cfg.tgt_lang), data_dir)

    def encode(split):
        return encode_pairs(tok, load_multi30k(split, cfg.src_lang, cfg.tgt_lang, data_dir))

    src, tgt = encode("train")
    train = TranslationBatches(src, tgt, cfg.max_tokens, shuffle=True, seed=cfg.seed)
    vsrc, vtgt = encode("val")
    if cfg.val_sentences:                       # the tests' tiny runs: the first few only
        vsrc, vtgt = vsrc[:cfg.val_sentences], vtgt[:cfg.val_sentences]
    val = TranslationBatches(vsrc, vtgt, cfg.max_tokens, shuffle=False)
    test_pairs = load_multi30k("test_2016_flickr", cfg.src_lang, cfg.tgt_lang, data_dir)
    return Data(tok, train, val, test_pairs)


@torch.no_grad()
def attention_entropy(model, b) -> dict:
    """Mean entropy (nats) of the attention weights of every MultiHeadAttention of ``model`` on
    batch ``b``, averaged over heads and real query positions: {module name: entropy}. Uniform
    weights over n keys give ln n; a one-hot row gives 0 (Zhai et al., 2023: "entropy
    collapse"). Empty for models without multi-head attention (the GRUs)."""
    mods = attention_modules(model)
    if not mods:
        return {}
    was_training = model.training
    model.eval()
    out = {}
    with recording(mods):
        forward_logits(model, b)
        for name, m in mods.items():
            w, key_mask = m.last                                 # (B, h, T, S), (B, S)
            ent = -torch.special.xlogy(w, w).sum(-1).mean(1)     # (B, T): per query position
            if "cross" in name:
                rows = b.tgt_mask                                # queries: target positions
            elif key_mask is not None and key_mask.shape == ent.shape:
                rows = key_mask                                  # self-attention: queries = keys
            else:
                rows = torch.ones_like(ent, dtype=torch.bool)
            out[name] = round(float(ent[rows].mean()), 4)
    model.train(was_training)
    return out


@torch.no_grad()
def validation_loss(model, batches: TranslationBatches, device) -> float:
    """Mean per-token cross-entropy (no label smoothing) on all validation batches."""
    model.eval()
    total, n = 0.0, 0
    for batch in batches:
        n_b = batch.n_tgt_tokens                     # counted on the CPU, before the copy
        b = batch.to(device)
        logits = forward_logits(model, b)
        total += translation_loss(logits, b.tgt_out).item() * n_b
        n += n_b
    model.train()
    return total / n


def distributed() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless the process group of ``torchrun`` is initialised."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass
class Run:
    """One training run: what it trains with, and where it is (what ``checkpoint.pt`` saves).

    ``fwd`` is the model as the step calls it (wrapped in DistributedDataParallel under
    ``torchrun``, compiled with ``--compile``); ``model`` is the bare module whose weights are
    saved. The run's clock is ``elapsed`` (seconds trained before ``start``) plus the time
    since ``start``, restarted after each evaluation so that evaluating is not counted."""
    cfg: TrainConfig
    out: Path
    device: torch.device
    data: Data
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    precision: Precision
    scaler: torch.amp.GradScaler
    rank: int = 0
    world: int = 1
    fwd: torch.nn.Module | None = None
    compiled: bool = False
    step: int = 0
    epoch: int = 0
    next_batch: int = 0          # the next batch of the epoch's length-bucketed order
    tokens_seen: int = 0
    elapsed: float = 0.0
    start: float = 0.0
    last_val: tuple | None = None  # (step, validation loss) of the latest evaluation

    @property
    def main_rank(self) -> bool:
        return self.rank == 0

    def clock(self) -> float:
        """Seconds of training so far (evaluations aside)."""
        return self.elapsed + time.perf_counter() - self.start


def setup(cfg: TrainConfig, out: Path, resume: bool = False, data_dir=None,
          device: torch.device | None = None) -> Run:
    """Data, model, optimiser and schedule, precision; the checkpoint's state if ``resume``
    (RunError if it is missing, damaged or of other options); the model wrapped for DDP and
    ``torch.compile``. Rank 0 copies the tokenizer into ``out``."""
    rank, world = distributed()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = device or get_device()
    deterministic(cfg.seed)
    data = prepare_data(cfg, data_dir)
    if rank == 0:
        shutil.copyfile(data.tokenizer.model_file, out / "tokenizer.model")
    model = build_model(cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = training_scheduler(opt, cfg.schedule, cfg.peak_lr, cfg.warmup, cfg.max_steps)
    # bf16 / fp16 autocast or fp32 (utils.choose_precision); the GradScaler is a pass-through
    # unless the precision is fp16, so one code path serves all three.
    precision = choose_precision(device, cfg.precision)
    run = Run(cfg, out, device, data, model, opt, sched, precision,
              precision.grad_scaler(device), rank, world)
    if resume:
        restore(run)
    run.fwd, run.compiled = wrap(run)
    return run


def restore(run: Run) -> None:
    """Load ``out/checkpoint.pt`` into the run: weights, optimiser, schedule, scaler, data
    position, clock and random states, so that training goes on exactly as if never stopped."""
    path = run.out / "checkpoint.pt"
    ckpt = load_checkpoint(path, run.device, missing="train first, or drop --resume")
    check_resumable(ckpt, asdict(run.cfg), run.world, path)
    run.model.load_state_dict(ckpt["model"])
    run.opt.load_state_dict(ckpt["optimizer"])
    run.sched.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler"):
        run.scaler.load_state_dict(ckpt["scaler"])
    run.step, run.epoch, run.next_batch = ckpt["step"], ckpt["epoch"], ckpt["next_batch"]
    run.tokens_seen, run.elapsed = ckpt["tokens_seen"], ckpt["elapsed"]
    torch.set_rng_state(ckpt["rng_cpu"].cpu())
    if run.device.type == "cuda" and ckpt.get("rng_cuda") is not None:
        torch.cuda.set_rng_state(ckpt["rng_cuda"].cpu())


def wrap(run: Run) -> tuple[torch.nn.Module, bool]:
    """(the model as the step calls it, whether it is compiled)."""
    fwd = run.model
    if run.world > 1:  # gradients are averaged over the ranks during backward()
        fwd = torch.nn.parallel.DistributedDataParallel(
            fwd, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    # torch.compile with dynamic shapes: one graph serves every (batch, length) shape of the
    # length-bucketed batches (tests/test_precision.py). The GRU models are left eager: their
    # Python loop over target positions is unrolled into one graph per target length, so they
    # would recompile at nearly every batch (until dynamo gives up after 8 and runs them eager).
    compiled = run.cfg.compile and not isinstance(run.model, Seq2Seq)
    if compiled:
        fwd = torch.compile(fwd, dynamic=True)
    return fwd, compiled


def save_state(run: Run) -> None:
    """Rank 0 writes ``out/checkpoint.pt``: everything :func:`restore` reads back."""
    if not run.main_rank:
        return
    cuda = run.device.type == "cuda"
    save_checkpoint(run.out / "checkpoint.pt", model=run.model.state_dict(),
                    optimizer=run.opt.state_dict(), scheduler=run.sched.state_dict(),
                    scaler=run.scaler.state_dict(), step=run.step, epoch=run.epoch,
                    next_batch=run.next_batch, tokens_seen=run.tokens_seen, elapsed=run.elapsed,
                    rng_cpu=torch.get_rng_state(),
                    rng_cuda=torch.cuda.get_rng_state() if cuda else None,
                    config=asdict(run.cfg), world_size=run.world)


def next_groups(run: Run, n: int) -> list:
    """The next n batches (lists of example indices) of the stream, across epochs."""
    taken = []
    while len(taken) < n:
        groups = run.data.train.epoch_groups(run.epoch)
        k = min(n - len(taken), len(groups) - run.next_batch)
        taken += groups[run.next_batch:run.next_batch + k]
        run.next_batch += k
        if run.next_batch == len(groups):
            run.epoch, run.next_batch = run.epoch + 1, 0
    return taken


def batch_loss(run: Run, b, loss_fn=None) -> torch.Tensor:
    """The training loss of batch ``b``: the book's (the logits under autocast, the
    label-smoothed loss outside it) or ``loss_fn(fwd, b, label_smoothing)``'s."""
    with run.precision.autocast(run.device):
        if loss_fn is not None:
            return loss_fn(run.fwd, b, run.cfg.label_smoothing)
        logits = forward_logits(run.fwd, b)                     # (B, T, vocab)
    return translation_loss(logits, b.tgt_out, run.cfg.label_smoothing)


def train_step(run: Run, loss_fn=None) -> torch.Tensor:
    """One optimiser step: this rank's ``accum_steps`` of the next ``world * accum_steps``
    batches, their gradients accumulated (and averaged over the ranks), clipped, applied.
    Returns the last batch's loss."""
    k = run.cfg.accum_steps
    mine = next_groups(run, run.world * k)[run.rank * k:(run.rank + 1) * k]
    batches = [run.data.train.batch(idx) for idx in mine]
    n_tokens = sum(b.n_tgt_tokens for b in batches)   # counted on the CPU: on a GPU, a count
    #                                                   after the copy would wait for the step
    return step_on(run, [b.to(run.device) for b in batches], n_tokens, loss_fn)


def step_on(run: Run, batches: list, n_tokens: int, loss_fn=None) -> torch.Tensor:
    """The optimiser step of :func:`train_step` on ``batches`` already on the device, with
    ``n_tokens`` real target tokens in them (``attnbook.benchmarks.loop`` times it alone)."""
    import torch.distributed as dist
    cfg, k = run.cfg, len(batches)
    for i, b in enumerate(batches):
        loss = batch_loss(run, b, loss_fn)
        sync = run.world == 1 or i == k - 1   # DDP: all-reduce after the last batch only
        with contextlib.nullcontext() if sync else run.fwd.no_sync():
            run.scaler.scale(loss / k).backward()
    if cfg.clip:
        run.scaler.unscale_(run.opt)          # fp16: clip the true gradients, not scaled ones
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip)
    run.scaler.step(run.opt)                  # fp16: skips the step if a gradient overflowed
    run.scaler.update()
    run.sched.step()
    run.opt.zero_grad(set_to_none=True)
    if run.world > 1:
        n = torch.tensor(n_tokens)
        dist.all_reduce(n)
        n_tokens = int(n)
    run.step, run.tokens_seen = run.step + 1, run.tokens_seen + n_tokens
    return loss


def finished(run: Run) -> bool:
    """All steps done, or the time budget spent (rank 0's clock decides for every rank)."""
    import torch.distributed as dist
    if run.step >= run.cfg.max_steps:
        return True
    if run.cfg.time_budget_s <= 0:
        return False
    over = torch.tensor(float(run.clock() >= run.cfg.time_budget_s))
    if run.world > 1:
        dist.broadcast(over, src=0)
    return bool(over)


def save_snapshot(run: Run) -> None:
    """Weights only, in ``out/snapshots/step_N.pt`` (BLEU against the budget, averaging)."""
    (run.out / "snapshots").mkdir(exist_ok=True)
    save_checkpoint(run.out / "snapshots" / f"step_{run.step}.pt", model=run.model.state_dict(),
                    step=run.step, elapsed=run.clock())


def evaluate_and_save(run: Run, loss: torch.Tensor, log, bar=None, on_eval=None) -> None:
    """Stop the clock; rank 0 logs the losses and the attention entropy on the first validation
    batch to ``log`` (and to ``bar`` and ``on_eval(line)`` if given) and saves the checkpoint;
    restart the clock."""
    import torch.distributed as dist
    run.elapsed += time.perf_counter() - run.start
    if run.main_rank:
        val = validation_loss(run.model, run.data.val, run.device)
        run.last_val = (run.step, val)
        probe = run.data.val.batch(run.data.val.epoch_groups(0)[0]).to(run.device)
        line = {"step": run.step, "epoch": run.epoch, "train_loss": loss.item(), "val_loss": val,
                "elapsed_s": run.elapsed, "attention_entropy": attention_entropy(run.model, probe)}
        log.write(json.dumps(line) + "\n")
        log.flush()
        if on_eval is not None:
            on_eval(line)
        if bar is not None:
            bar.write(f"step {run.step}: train loss {loss.item():.3f}, val loss {val:.3f}")
        save_state(run)
    if run.world > 1:
        dist.barrier()
    run.start = time.perf_counter()


def finish(run: Run, evaluate: bool = True) -> dict:
    """The run's metrics (parameters, steps, time, throughput, validation loss, hardware) and,
    if ``evaluate``, the test BLEU of beam search; written to ``metrics.json`` (and the
    hypotheses to ``test_hypotheses.txt``)."""
    cfg, data, model, device = run.cfg, run.data, run.model, run.device
    # the run's last step was evaluated (train evaluates the step that ends it): the same
    # weights on the same batches, so the same number, without a second pass
    if run.last_val is not None and run.last_val[0] == run.step:
        val = run.last_val[1]
    else:
        val = validation_loss(model, data.val, device)
    metrics = {
        "preset": cfg.preset, "config": asdict(cfg), "parameters": count_parameters(model),
        "steps": run.step, "epochs": run.epoch + run.next_batch / max(1, len(data.train)),
        "train_tokens": run.tokens_seen, "train_time_s": round(run.elapsed, 1),
        "tokens_per_s": round(run.tokens_seen / max(run.elapsed, 1e-9), 1),
        "val_loss": val,
        "device": str(device), "precision": run.precision.name,
        "precision_reason": run.precision.reason, "compiled": run.compiled,
        "threads": torch.get_num_threads(), "processes": run.world,
        "hardware": versions(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if evaluate:
        model.eval()
        test = data.test_pairs[:cfg.eval_sentences] if cfg.eval_sentences else data.test_pairs
        result = bleu_score(model, data.tokenizer, test, beam_size=cfg.beam_size,
                            alpha=cfg.length_alpha, device=device)
        metrics.update({
            "test_bleu": result["bleu"], "bleu_signature": result["signature"],
            "test_set": f"test_2016_flickr ({len(test)} of {len(data.test_pairs)} sentences)",
            "decoding": f"beam {cfg.beam_size}, alpha {cfg.length_alpha}"})
    (run.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if evaluate:
        (run.out / "test_hypotheses.txt").write_text("\n".join(result["hypotheses"]) + "\n")
    return metrics


def train(cfg: TrainConfig, out: Path, resume: bool = False, data_dir=None,
          device: torch.device | None = None, progress: bool = True,
          stop_after: int | None = None, evaluate: bool = True, loss_fn=None,
          on_eval=None) -> dict:
    """Train (or resume) a run in folder ``out``; returns the metrics also written there.

    One optimiser step uses ``world_size * accum_steps`` consecutive batches of the
    length-bucketed stream (epoch after epoch, so nothing is dropped at an epoch's end): under
    ``torchrun`` each rank takes its ``accum_steps`` of them, and DistributedDataParallel
    averages the gradients, which equals one process accumulating all of them. Only rank 0
    writes logs and checkpoints and evaluates.

    ``stop_after`` interrupts the run after that many steps in this call, as a crash would
    (the tests use it to check that resuming gives exactly the uninterrupted result).
    ``evaluate=False`` skips the final BLEU (the experiments decode their snapshots later).
    ``loss_fn(model, b, label_smoothing) -> loss`` replaces the training loss (default: the
    book's one loss on the target tokens; chapter 12's exercise trains on the whole sequence);
    validation and BLEU stay as they are. ``on_eval(line)`` is called with each log line as it
    is written (chapter 11 redraws its curves with it).

    At every evaluation ``log.jsonl`` gets the step, the losses, the elapsed training time and
    the attention entropy of every attention layer on the first validation batch. A run first
    cuts the log back to its starting step (``runs.trim_log``): a crash between a log line and
    its checkpoint would otherwise log those steps twice once resumed.
    """
    from tqdm import tqdm   # a text bar (tqdm.auto warns in notebooks without ipywidgets)

    run = setup(cfg, out, resume, data_dir, device)
    run.model.train()
    bar = tqdm(total=cfg.max_steps, initial=run.step, disable=not (progress and run.main_rank),
               unit="step", dynamic_ncols=True, desc=cfg.preset)
    steps_this_call, run.start = 0, time.perf_counter()
    if run.main_rank:  # the log's lines after the checkpoint's step (a crash) are logged again
        trim_log(run.out / "log.jsonl", run.step)
    log = open(run.out / "log.jsonl", "a") if run.main_rank else None
    done = finished(run)          # asked once a step: the step that ends the run is evaluated
    while not done:
        loss = train_step(run, loss_fn)
        steps_this_call += 1
        bar.update(1)
        if run.step in cfg.snapshot_steps and run.main_rank:
            save_snapshot(run)
        if run.step % 10 == 0:  # .item() waits for the GPU: not at every step
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{run.sched.get_last_lr()[0]:.2e}",
                            tok_s=f"{run.tokens_seen / run.clock():,.0f}")
        done = finished(run)
        if run.step % cfg.eval_every == 0 or done:
            evaluate_and_save(run, loss, log, bar if progress else None, on_eval)
        if stop_after is not None and steps_this_call >= stop_after:  # as if killed here
            run.elapsed += time.perf_counter() - run.start
            save_state(run)
            bar.close()
            if log:
                log.close()
            return {"interrupted_at_step": run.step}
    bar.close()
    run.elapsed += time.perf_counter() - run.start
    if not run.main_rank:
        return {"rank": run.rank, "steps": run.step}
    log.close()
    return finish(run, evaluate)
