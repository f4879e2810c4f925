"""Training a translator on Multi30k German->English (chapter 9), and its command line.

    python -m attnbook.train --preset cpu-tiny --out runs/cpu-tiny          # a few minutes on a CPU
    python -m attnbook.train --preset gpu-base --out runs/gpu-base          # the full run, on a GPU
    python -m attnbook.train --preset gpu-base --out runs/gpu-base --resume # after an interruption

The recipe of Vaswani et al. (2017), section 5: a joint BPE vocabulary; batches of about
``max_tokens`` tokens of similar length; Adam with beta2 = 0.98 and the learning rate
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (warm-up, then inverse square
root decay); label smoothing; dropout; and, from later practice, gradient clipping.
The package states the peak learning rate explicitly (``peak_lr``, reached at step ``warmup``):
the paper's factor ties it to d_model and warm-up, so that changing either silently changes the
peak, and a small model needs its own (chapter 9's sweep). The forward pass runs in the
precision the device supports (``utils.choose_precision``: bf16 autocast on recent CUDA GPUs,
fp16 autocast with a GradScaler on older ones such as a T4 and on Apple MPS, float32 on a CPU;
``--precision`` forces one), and ``--compile`` compiles the model with ``torch.compile`` (on any
device; on a CPU it needs a C++ compiler).

A run writes into its folder: ``checkpoint.pt`` (model, optimizer, schedule, data position and
random states: training resumes exactly where it stopped), ``tokenizer.model``, ``log.jsonl``
(one line per evaluation) and ``metrics.json`` (BLEU with the sacreBLEU signature, parameters,
wall time, hardware and versions).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from . import PAD_ID
from .batching import TranslationBatches
from .bleu import bleu_score
from .data import load_multi30k
from .lm import DecoderOnlyTranslator
from .mha import MultiHeadAttention
from .rnn import Seq2Seq
from .tokenizer import Tokenizer, multi30k_tokenizer
from .transformer import Transformer, TransformerConfig
from .utils import (PRECISIONS, choose_precision, count_parameters, deterministic, get_device,
                    versions)


@dataclass
class TrainConfig:
    preset: str = "custom"
    model: str = "transformer"
    d_model: int = 512
    h: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    norm_first: bool = False
    vocab_size: int = 8000
    max_tokens: int = 8192        # tokens per batch (source or target side, padded)
    max_steps: int = 20000
    warmup: int = 4000
    peak_lr: float = 512 ** -0.5 * 4000 ** -0.5  # reached at step `warmup` (the paper's: 7e-4)
    label_smoothing: float = 0.1
    clip: float = 1.0             # gradient-norm clipping; 0 turns it off
    seed: int = 0
    snapshot_steps: tuple = ()    # also save the model's weights at these steps (snapshots/)
    eval_every: int = 1000        # steps between validation losses (and checkpoints)
    beam_size: int = 4
    length_alpha: float = 0.6
    eval_sentences: int = 0       # test sentences to translate for BLEU; 0 = all 1,000
    time_budget_s: float = 0      # stop training after this many seconds (0: run max_steps)
    accum_steps: int = 1          # batches per process and optimiser step (gradient accumulation)
    precision: str = "auto"       # auto | fp32 | bf16 | fp16 (utils.choose_precision)
    compile: bool = False         # torch.compile(dynamic=True) on any device; not the GRUs
    src_lang: str = "de"
    tgt_lang: str = "en"
    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config saved in a checkpoint or metrics.json (see :func:`upgrade_config`)."""
        return cls(**upgrade_config(d))

    def transformer_config(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(vocab_size=vocab_size, d_model=self.d_model, h=self.h,
                                 d_ff=self.d_ff, n_layers=self.n_layers, dropout=self.dropout,
                                 max_len=512, norm_first=self.norm_first)


# Every model of the book, trained and evaluated by the same harness (chapter 9's leaderboard):
# the GRU encoder-decoder of chapter 1 (no attention), of chapter 2 (additive attention) and of
# chapter 3 (dot-product attention), the Transformer of chapter 8 and the decoder-only model of
# chapter 10.
# Chapter 10's decoder-only Transformer, which reads "BOS source EOS target" as one sequence,
# trains with the same harness and is on the same board.
MODELS = ("gru", "gru-additive", "gru-dot", "transformer", "decoder-only")
ALL_MODELS = MODELS


PRESETS = {
    # a few minutes on a laptop CPU: a small model that learns real (if rough) translations.
    # No dropout: in 600 steps (2.4 epochs) this small model does not over-fit yet (its
    # validation loss still falls steeply, chapter 9), and dropout would only slow it down.
    "cpu-tiny": TrainConfig(preset="cpu-tiny", d_model=128, h=4, d_ff=256, n_layers=2,
                            dropout=0.0, vocab_size=4000, max_tokens=2048, max_steps=1200,
                            warmup=200, eval_every=100, beam_size=4, precision="auto",
                            compile=False),
    # the test suite's smoke run: seconds
    "smoke": TrainConfig(preset="smoke", d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0,
                         vocab_size=1000,
                         max_tokens=1024, max_steps=20, warmup=10, eval_every=10, beam_size=2,
                         eval_sentences=16, precision="fp32", compile=False),
    # the full run on one GPU: the paper's base model, sized for Multi30k, five minutes of training
    "gpu-base": TrainConfig(preset="gpu-base", d_model=512, h=8, d_ff=2048, n_layers=6,
                            dropout=0.1, vocab_size=8000, max_tokens=16384, max_steps=20000,
                            warmup=2000, eval_every=1000, beam_size=4,
                            precision="auto", compile=True, time_budget_s=300),
}


# Each model's peak learning rate, per preset. cpu-tiny's come from chapter 9's sweep, chosen
# by validation loss (results/cpu/sweep.json); gpu-base's Transformer uses the paper's schedule
# (d_model^-0.5 * warmup^-0.5 = 9.9e-4). The rest of a preset (data, batches, steps, warm-up,
# decoding) is the same for every model.
PEAK_LR = {
    "cpu-tiny": {"transformer": 6e-3, "decoder-only": 6e-3, "gru": 1.6e-2, "gru-additive": 8e-3,
                 "gru-dot": 8e-3},
    "smoke": {m: 3e-3 for m in ALL_MODELS},
    "gpu-base": {"transformer": 512 ** -0.5 * 2000 ** -0.5,
                 "decoder-only": 512 ** -0.5 * 2000 ** -0.5,
                 "gru": 1e-3, "gru-additive": 1e-3, "gru-dot": 1e-3},
}


def preset(name: str, model: str = "transformer") -> TrainConfig:
    """The configuration of preset ``name`` for ``model`` (one of ALL_MODELS)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    if model not in ALL_MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(ALL_MODELS)}")
    return replace(PRESETS[name], model=model, peak_lr=PEAK_LR[name][model])


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's learning rate at ``step`` (1-based): linear warm-up, then ~ 1/sqrt(step)."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def warmup_lr(step: int, peak_lr: float, warmup: int) -> float:
    """The same shape with its peak stated: linear warm-up to ``peak_lr`` at step ``warmup``,
    then ``peak_lr * sqrt(warmup / step)``. noam_lr(s, d, w, f) == warmup_lr(s, f * (d * w)^-0.5, w)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, (warmup / step) ** 0.5)


def translation_loss(logits: torch.Tensor, tgt_out: torch.Tensor,
                     label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over real target tokens. logits (B, T, V), tgt_out (B, T) with PAD at
    padded positions (ignored). With label smoothing eps the target distribution puts 1 - eps on
    the right token and spreads eps uniformly over the whole vocabulary."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, V), tgt_out.reshape(-1),
                           ignore_index=PAD_ID, label_smoothing=label_smoothing)


@dataclass
class Data:
    tokenizer: Tokenizer
    train: TranslationBatches
    val: TranslationBatches
    test_pairs: list = field(default_factory=list)


def prepare_data(cfg: TrainConfig, data_dir=None) -> Data:
    """Tokenizer and batches. Every sentence is kept: nothing is filtered or truncated."""
    tok = multi30k_tokenizer(cfg.vocab_size, (cfg.src_lang, cfg.tgt_lang), data_dir)

    def encode(split):
        pairs = load_multi30k(split, cfg.src_lang, cfg.tgt_lang, data_dir)
        return pairs, tok.encode_batch([s for s, _ in pairs]), tok.encode_batch([t for _, t in pairs])

    _, src, tgt = encode("train")
    train = TranslationBatches(src, tgt, cfg.max_tokens, shuffle=True, seed=cfg.seed)
    _, vsrc, vtgt = encode("val")
    val = TranslationBatches(vsrc, vtgt, cfg.max_tokens, shuffle=False)
    test_pairs = load_multi30k("test_2016_flickr", cfg.src_lang, cfg.tgt_lang, data_dir)
    return Data(tok, train, val, test_pairs)


def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model named by ``cfg.model``; the GRU models use d_model as embedding and state size."""
    if cfg.model == "transformer":
        return Transformer(cfg.transformer_config(vocab_size))
    if cfg.model == "decoder-only":  # as many blocks as the encoder and decoder together
        return DecoderOnlyTranslator(replace(cfg.transformer_config(vocab_size),
                                             n_layers=2 * cfg.n_layers))
    if cfg.model == "gru":
        return Seq2Seq(vocab_size, cfg.d_model, attention=False)
    if cfg.model in ("gru-additive", "gru-dot"):
        return Seq2Seq(vocab_size, cfg.d_model, attention=True, score=cfg.model[4:])
    raise ValueError(f"unknown model {cfg.model!r}; choose one of {', '.join(ALL_MODELS)}")


def forward_logits(model: torch.nn.Module, b) -> torch.Tensor:
    """Teacher-forced logits (B, T, V) of a batch, for a Transformer or a GRU Seq2Seq (which
    takes no target mask: its recurrence only ever looks back) -- compiled or not."""
    if isinstance(getattr(model, "_orig_mod", model), Seq2Seq):
        return model(b.src, b.src_mask, b.tgt_in)[0]
    return model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)


@torch.no_grad()
def attention_entropy(model, b) -> dict:
    """Mean entropy (nats) of the attention weights of every MultiHeadAttention of ``model`` on
    batch ``b``, averaged over heads and real query positions: {module name: entropy}. Uniform
    weights over n keys give ln n; a one-hot row gives 0 (Zhai et al., 2023: "entropy
    collapse"). Empty for models without multi-head attention (the GRUs)."""
    mods = {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    if not mods:
        return {}
    was_training = model.training
    model.eval()
    for m in mods.values():
        m.record = True
    try:
        forward_logits(model, b)
    finally:
        for m in mods.values():
            m.record = False
    out = {}
    for name, m in mods.items():
        w, key_mask = m.last                                     # (B, h, T, S), (B, S)
        m.last = None
        ent = -torch.special.xlogy(w, w).sum(-1).mean(1)         # (B, T): per query position
        if "cross" in name:
            rows = b.tgt_mask                                    # queries: target positions
        elif key_mask is not None and key_mask.shape == ent.shape:
            rows = key_mask                                      # self-attention: queries = keys
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
        b = batch.to(device)
        logits = forward_logits(model, b)
        total += translation_loss(logits, b.tgt_out).item() * b.n_tgt_tokens
        n += b.n_tgt_tokens
    model.train()
    return total / n


def save_checkpoint(path: Path, **state) -> None:
    """Write atomically: an interruption during the write never leaves half a checkpoint."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device="cpu") -> dict:
    """Load safely: ``weights_only=True`` refuses anything but tensors and plain containers."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train first, or drop --resume")
    return torch.load(path, map_location=device, weights_only=True)


def load_run(run: Path, device=None):
    """The model and tokenizer of a run folder written by ``python -m attnbook.train``."""
    run = Path(run)
    device = device or get_device()
    if not run.is_dir():
        raise FileNotFoundError(f"{run} is not a run folder; train one with "
                                "`python -m attnbook.train --preset cpu-tiny --out RUN`")
    ckpt = load_checkpoint(run / "checkpoint.pt", device)
    tok = Tokenizer(run / "tokenizer.model")
    cfg = TrainConfig.from_dict(ckpt["config"])
    model = build_model(cfg, ckpt["vocab_size"]).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), tok, cfg


# Options that may differ when a run is resumed: how long it trains and what it records.
# Everything else (model, data, recipe, seed) must match the checkpoint's.
EXTENDABLE = ("max_steps", "time_budget_s", "eval_every", "snapshot_steps", "eval_sentences",
              "beam_size", "length_alpha")


def upgrade_config(d: dict) -> dict:
    """A saved config in today's fields: older runs saved ``bf16`` (autocast on CUDA only), which
    ``precision`` replaced: True is "auto", False is "fp32"; JSON turned tuples into lists."""
    d = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    if "bf16" in d:
        d.setdefault("precision", "auto" if d.pop("bf16") else "fp32")
    return d


def same_run(a: dict, b: dict) -> bool:
    """Whether configs a and b describe the same training run (up to EXTENDABLE options)."""
    strip = lambda c: {k: v for k, v in upgrade_config(c).items() if k not in EXTENDABLE}  # noqa: E731
    return strip(a) == strip(b)


def distributed() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless the process group of ``torchrun`` is initialised."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train(cfg: TrainConfig, out: Path, resume: bool = False, data_dir=None,
          device: torch.device | None = None, progress: bool = True,
          stop_after: int | None = None, evaluate: bool = True) -> dict:
    """Train (or resume) a run in folder ``out``; returns the metrics also written there.

    One optimiser step uses ``world_size * accum_steps`` consecutive batches of the
    length-bucketed stream (epoch after epoch, so nothing is dropped at an epoch's end): under
    ``torchrun`` each rank takes its ``accum_steps`` of them, and DistributedDataParallel
    averages the gradients, which equals one process accumulating all of them. Only rank 0
    writes logs and checkpoints and evaluates.

    ``stop_after`` interrupts the run after that many steps in this call, as a crash would
    (the tests use it to check that resuming gives exactly the uninterrupted result).
    ``evaluate=False`` skips the final BLEU (the experiments decode their snapshots later).

    At every evaluation ``log.jsonl`` gets the step, the losses, the elapsed training time and
    the attention entropy of every attention layer on the first validation batch.
    """
    import torch.distributed as dist
    from tqdm import tqdm   # a text bar (tqdm.auto warns in notebooks without ipywidgets)

    rank, world = distributed()
    main_rank = rank == 0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = device or get_device()
    deterministic(cfg.seed)
    data = prepare_data(cfg, data_dir)
    if main_rank:
        shutil.copyfile(data.tokenizer.model_file, out / "tokenizer.model")
    model = build_model(cfg, data.tokenizer.vocab_size).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: warmup_lr(i + 1, cfg.peak_lr, cfg.warmup))
    # bf16 / fp16 autocast or fp32 (utils.choose_precision); the GradScaler is a pass-through
    # unless the precision is fp16, so one code path serves all three.
    precision = choose_precision(device, cfg.precision)
    scaler = precision.grad_scaler(device)
    step, epoch, next_batch, tokens_seen, elapsed = 0, 0, 0, 0, 0.0
    ckpt_path = out / "checkpoint.pt"
    if resume:
        ckpt = load_checkpoint(ckpt_path, device)
        if not same_run(ckpt["config"], asdict(cfg)) or ckpt.get("world_size", 1) != world:
            raise ValueError(f"{ckpt_path} was trained with another configuration or number of "
                             "processes; resume with the same preset, options and --nproc_per_node, "
                             "or use a new --out folder")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        step, epoch, next_batch = ckpt["step"], ckpt["epoch"], ckpt["next_batch"]
        tokens_seen, elapsed = ckpt["tokens_seen"], ckpt["elapsed"]
        torch.set_rng_state(ckpt["rng_cpu"].cpu())
        if device.type == "cuda" and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"].cpu())
    fwd = model
    if world > 1:  # gradients are averaged over the ranks during backward()
        fwd = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    # torch.compile with dynamic shapes: one graph serves every (batch, length) shape of the
    # length-bucketed batches (tests/test_precision.py). The GRU models are left eager: their
    # Python loop over target positions is unrolled into one graph per target length, so they
    # would recompile at nearly every batch (until dynamo gives up after 8 and runs them eager).
    compiled = cfg.compile and not isinstance(model, Seq2Seq)
    if compiled:
        fwd = torch.compile(fwd, dynamic=True)

    def checkpoint():
        if not main_rank:
            return
        save_checkpoint(ckpt_path, model=model.state_dict(), optimizer=opt.state_dict(),
                        scheduler=sched.state_dict(), scaler=scaler.state_dict(),
                        step=step, epoch=epoch,
                        next_batch=next_batch, tokens_seen=tokens_seen, elapsed=elapsed,
                        rng_cpu=torch.get_rng_state(),
                        rng_cuda=torch.cuda.get_rng_state() if device.type == "cuda" else None,
                        config=asdict(cfg), vocab_size=data.tokenizer.vocab_size,
                        world_size=world)

    def next_groups(n: int) -> list:
        """The next n batches (lists of example indices) of the stream, across epochs."""
        nonlocal epoch, next_batch
        taken = []
        while len(taken) < n:
            groups = data.train.epoch_groups(epoch)
            k = min(n - len(taken), len(groups) - next_batch)
            taken += groups[next_batch:next_batch + k]
            next_batch += k
            if next_batch == len(groups):
                epoch, next_batch = epoch + 1, 0
        return taken

    model.train()
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not (progress and main_rank),
               unit="step", dynamic_ncols=True, desc=cfg.preset)
    steps_this_call, start = 0, time.perf_counter()
    log = open(out / "log.jsonl", "a") if main_rank else None

    def finished() -> bool:  # all steps done, or the time budget spent (rank 0's clock decides)
        if step >= cfg.max_steps:
            return True
        if cfg.time_budget_s <= 0:
            return False
        over = torch.tensor(float(elapsed + time.perf_counter() - start >= cfg.time_budget_s))
        if world > 1:
            dist.broadcast(over, src=0)
        return bool(over)

    while not finished():
        mine = next_groups(world * cfg.accum_steps)[rank * cfg.accum_steps:
                                                   (rank + 1) * cfg.accum_steps]
        n_tokens = 0
        for i, idx in enumerate(mine):
            b = data.train.batch(idx).to(device)
            with precision.autocast(device):
                logits = forward_logits(fwd, b)
            loss = translation_loss(logits, b.tgt_out, cfg.label_smoothing)
            if world > 1 and i < len(mine) - 1:
                with fwd.no_sync():           # all-reduce only after the last micro-batch
                    scaler.scale(loss / cfg.accum_steps).backward()
            else:
                scaler.scale(loss / cfg.accum_steps).backward()
            n_tokens += b.n_tgt_tokens
        if cfg.clip:
            scaler.unscale_(opt)              # fp16: clip the true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        scaler.step(opt)                      # fp16: skips the step if a gradient overflowed
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if world > 1:
            n = torch.tensor(n_tokens)
            dist.all_reduce(n)
            n_tokens = int(n)
        step, tokens_seen = step + 1, tokens_seen + n_tokens
        steps_this_call += 1
        bar.update(1)
        if step in cfg.snapshot_steps and main_rank:  # weights only, for BLEU against budget
            (out / "snapshots").mkdir(exist_ok=True)
            save_checkpoint(out / "snapshots" / f"step_{step}.pt", model=model.state_dict(),
                            step=step, elapsed=elapsed + time.perf_counter() - start)
        if step % 10 == 0:  # .item() waits for the GPU: not at every step
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{sched.get_last_lr()[0]:.2e}",
                            tok_s=f"{tokens_seen / (elapsed + time.perf_counter() - start):,.0f}")
        if step % cfg.eval_every == 0 or finished():
            elapsed += time.perf_counter() - start
            if main_rank:
                val = validation_loss(model, data.val, device)
                probe = data.val.batch(data.val.epoch_groups(0)[0]).to(device)
                log.write(json.dumps({"step": step, "epoch": epoch, "train_loss": loss.item(),
                                      "val_loss": val, "elapsed_s": elapsed,
                                      "attention_entropy": attention_entropy(model, probe)})
                          + "\n")
                log.flush()
                if progress:
                    bar.write(f"step {step}: train loss {loss.item():.3f}, val loss {val:.3f}")
                checkpoint()
            if world > 1:
                dist.barrier()
            start = time.perf_counter()
        if stop_after is not None and steps_this_call >= stop_after:
            elapsed += time.perf_counter() - start
            checkpoint()
            bar.close()
            if log:
                log.close()
            return {"interrupted_at_step": step}
    bar.close()
    elapsed += time.perf_counter() - start
    if not main_rank:
        return {"rank": rank, "steps": step}
    log.close()
    metrics = {
        "preset": cfg.preset, "config": asdict(cfg), "parameters": count_parameters(model),
        "steps": step, "epochs": epoch + next_batch / max(1, len(data.train)),
        "train_tokens": tokens_seen, "train_time_s": round(elapsed, 1),
        "tokens_per_s": round(tokens_seen / max(elapsed, 1e-9), 1),
        "val_loss": validation_loss(model, data.val, device),
        "device": str(device), "precision": precision.name, "compiled": compiled,
        "threads": torch.get_num_threads(), "processes": world,
        "hardware": versions(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if not evaluate:
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        return metrics
    model.eval()
    test_pairs = data.test_pairs[:cfg.eval_sentences] if cfg.eval_sentences else data.test_pairs
    result = bleu_score(model, data.tokenizer, test_pairs, beam_size=cfg.beam_size,
                        alpha=cfg.length_alpha, device=device)
    metrics.update({
        "test_bleu": result["bleu"], "bleu_signature": result["signature"],
        "test_set": f"test_2016_flickr ({len(test_pairs)} of {len(data.test_pairs)} sentences)",
        "decoding": f"beam {cfg.beam_size}, alpha {cfg.length_alpha}"})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "test_hypotheses.txt").write_text("\n".join(result["hypotheses"]) + "\n")
    return metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnbook.train",
                                description="Train a translator on Multi30k (de->en).")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny")
    p.add_argument("--out", type=Path, required=True, help="run folder")
    p.add_argument("--model", choices=ALL_MODELS, help="the model to train (default: the preset's, "
                   "a Transformer); the GRU models use the preset's GRU learning rate")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--max-steps", type=int, help="override the preset's number of steps")
    p.add_argument("--peak-lr", type=float, help="override the preset's peak learning rate")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch (results depend on it)")
    p.add_argument("--accum-steps", type=int, help="batches per process and step (default 1)")
    p.add_argument("--device", help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--precision", choices=PRECISIONS, help="auto (the default: bf16 on recent "
                   "GPUs, fp16 + GradScaler on a T4 or MPS, fp32 on a CPU), fp32, bf16 or fp16")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: the preset's; gpu-base compiles)")
    p.add_argument("--data-dir", help="folder with the Multi30k files (default: $MULTI30K_DIR or the cache)")
    args = p.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        p.error(f"--max-steps must be at least 1, got {args.max_steps}")
    if args.peak_lr is not None and not args.peak_lr > 0:
        p.error(f"--peak-lr must be positive, got {args.peak_lr}")
    if args.threads is not None:
        if args.threads < 1:
            p.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    cfg = preset(args.preset, args.model or "transformer")
    if args.max_steps:
        cfg = replace(cfg, max_steps=args.max_steps)
    if args.peak_lr:
        cfg = replace(cfg, peak_lr=args.peak_lr)
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    if args.precision is not None:
        cfg = replace(cfg, precision=args.precision)
    if args.compile is not None:
        cfg = replace(cfg, compile=args.compile)
    if args.accum_steps is not None:
        if args.accum_steps < 1:
            p.error(f"--accum-steps must be at least 1, got {args.accum_steps}")
        cfg = replace(cfg, accum_steps=args.accum_steps)
    if args.resume and not (args.out / "checkpoint.pt").is_file():
        p.error(f"--resume: no checkpoint in {args.out}; train first, or drop --resume")
    try:
        device = get_device(args.device)
    except (RuntimeError, ValueError) as e:
        p.error(str(e))
    try:
        choose_precision(device, cfg.precision)   # e.g. bf16 asked for on a GPU without it
    except ValueError as e:
        p.error(f"--precision: {e}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # started by torchrun: one process per GPU (or per CPU share, with gloo)
        import torch.distributed as dist
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        metrics = train(cfg, args.out, resume=args.resume, data_dir=args.data_dir, device=device)
    finally:
        if world > 1:
            dist.destroy_process_group()
    if "test_bleu" not in metrics:  # ranks other than 0 report nothing
        return 0
    print(json.dumps({k: metrics[k] for k in ("preset", "steps", "train_time_s", "tokens_per_s",
                                               "val_loss", "test_bleu", "bleu_signature")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
