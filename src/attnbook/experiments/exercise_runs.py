"""The measured answers of the book's experimental exercises.

    python -m attnbook exercise_runs --results results/cpu    # all: 21 min of CPU, one thread
    python -m attnbook exercise_runs --results results/cpu --only ex-09-beam-width

Each experiment runs as its exercise's solution describes it, with the package's functions, one
thread, and 3 seeds wherever it compares settings:

* ``ex-05-heads-width`` (chapter 5): the neighbour task with (h, d_model, steps) = (16, 64, 500),
  (32, 32, 500), (1, 64, 500) and (1, 32, 1500), beside the chapter's own sweep, h = 1, 2, 4, 8
  and 16 at (d_model, steps) = (32, 500), whose seed 0 the chapter trains and whose three seeds
  it shows; accuracy (all four bits right) per seed.
* ``ex-06-plain-copy`` (chapter 6): the plain copy (shift 0), the chapter's model with and
  without the causal mask, 400 steps; teacher-forced loss, generated letters and whole answers.
* ``ex-06-too-good`` (chapter 6): the chapter's Caesar copy with the off-by-one mask
  ``tril(diagonal=1)`` (query t also sees key t + 1); the same measurements.
* ``ex-07-rope-length`` (chapter 7): the chapter's one-layer encoder with ``positional="none"``
  and its self-attention replaced by rotary attention (the solution's ``RotaryAttention``), plain
  and restricted to a window of ``|t - i| < 16``, trained as the chapter trains its encoders (600
  steps, lengths 8-16); per-token accuracy on the look-back task at lengths 4 to 48 and 200.
  Beside it, the chapter's own four encoders (``positional`` "none", "learned", "learned-large"
  and "sinusoidal"), whose seed 0 the chapter trains and whose three seeds it shows: the final
  training loss, per-token accuracy at lengths 4 to 48, the accuracy at each position of
  length-48 sequences, and whether training left the learned tables' rows 16 to 47 untouched.
* ``ex-08-warmup-experiment`` (chapter 8): the chapter's ``train_reversal`` (its tiny
  Transformer, 200 steps of Adam without warm-up on reversals of 4-8 symbols) for post-LN and
  pre-LN at learning rates 1e-3, 3e-3 and 1e-2, with 3 and with 6 layers; the mean loss of the
  last 50 steps per seed. Beside it, the chapter's own experiment (3 layers at 1e-2, post-LN and
  pre-LN, without warm-up and with 100 steps of it), whose seed 0 the chapter trains and whose
  three seeds it shows: every step's loss, and the mean probability of the right next token on
  the chapter's check batch.
* ``ex-09-beam-width`` (chapter 9): the model chapter 9 has at that point (cpu-tiny, the first
  300 of its 1,200 steps; seed 0 is the notebook's own, trained again identically, and seeds 1
  and 2 the same recipe), then BLEU, brevity penalty and mean output length on the first 300
  test sentences for beams 1, 2, 4, 8, 16 and alpha 0 and 0.6.
* ``ex-12-whole-sequence-loss`` (chapter 12): cpu-tiny's decoder-only translator trained for
  the first 200 of its 1,200 steps (scaled down, to keep the whole command near 20 minutes of
  one core) with the loss on the target only and on the whole sequence
  (:func:`whole_sequence_loss`), same batches, 3 seeds; validation loss on the target tokens
  (all validation sentences) and BLEU (beam 4) on the first 300 test sentences.

The JSON (``RESULTS/exercises.json``) holds, per exercise, its settings, every run, the mean,
min and max over seeds, and its wall and CPU time; the calls that made it are in its provenance
records (:mod:`attnbook.store`: command, git commit, date, threads, versions and hardware)
(the CPU time shows the work when other jobs share the machine: each entry records its own;
ex-05-heads-width, ex-07-rope-length and ex-08-warmup-experiment, which also run their
chapters' own experiments, took about 1.5, 1 and 4.5 minutes of CPU); ``--only``
replaces the named exercises' entries and keeps the others. ``--tiny`` runs every experiment at
a few steps (what the tests run): its numbers mean nothing and say so (``"scale": "tiny"``).
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import PAD_ID
from ..attention import causal_mask
from ..batching import translation_loss
from ..bleu import bleu
from ..data import load_multi30k
from ..decoding import greedy_generate, translate
from ..lm import lm_loss, token_positions
from ..loop import fit
from ..mha import MultiHeadAttention
from ..training.recipe import preset
from ..training.runs import load_run
from ..tasks import (NeighbourReader, make_caesar_copy_task, make_lookback_task,
                    make_neighbour_batch, task_accuracy, train_on_task)
from ..training.loop import train
from ..toy import make_batch as make_reverse_batch
from ..toy import vocab_size as toy_vocab_size
from ..transformer import SelfAttentionStack, Transformer, TransformerConfig
from .registry import SEEDS

# Each experiment's settings: what the book's solutions quote, and the tests' tiny scale.
CHAPTER_HEADS = [1, 2, 4, 8, 16]          # chapter 5's sweep: d_model 32, 500 steps
HEADS_WIDTH = dict(runs=[(h, 32, 500) for h in CHAPTER_HEADS]
                   + [(16, 64, 500), (32, 32, 500), (1, 64, 500), (1, 32, 1500)],
                   lr=5e-3, batch_size=64, seeds=SEEDS)
CAESAR = dict(k=4, n_symbols=8, steps=400, lr=3e-3, batch_size=64, n_test=1000, test_seed=2024,
              seeds=SEEDS, model=dict(d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0,
                                      max_len=16, tie_embeddings=False))
ROPE_LENGTH = dict(offset=2, n_symbols=8, min_len=8, l_train=16, steps=600, lr=5e-3,
                   batch_size=64, windows=[None, 16], lengths=list(range(4, 49, 4)) + [200],
                   n_batches=2, seeds=SEEDS,
                   model=dict(d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0, max_len=48),
                   chapter=dict(encodings=["none", "learned", "learned-large", "sinusoidal"],
                                large_std=2 ** -0.5, position_n=512, position_seed=123))
WARMUP = dict(n_symbols=10, min_len=4, max_len=8, steps=200, batch_size=32, lrs=[1e-3, 3e-3, 1e-2],
              layers=[3, 6], seeds=SEEDS,
              model=dict(d_model=64, h=4, d_ff=128, n_layers=3, dropout=0.0, max_len=32),
              chapter=dict(lr=1e-2, n_layers=3, warmups=[0, 100], check=dict(n=200, seed=1)))
BEAM_WIDTH = dict(preset="cpu-tiny", steps=300, sentences=300, beams=[1, 2, 4, 8, 16],
                  alphas=[0.0, 0.6], seeds=SEEDS)
WHOLE_SEQUENCE = dict(preset="cpu-tiny", steps=200, sentences=300, beam=4, alpha=0.6,
                      seeds=SEEDS)
TINY = {"ex-05-heads-width": dict(runs=[(2, 8, 3), (1, 8, 6)], seeds=(0, 1)),
        "ex-06-plain-copy": dict(steps=3, n_test=16, seeds=(0, 1)),
        "ex-06-too-good": dict(steps=3, n_test=16, seeds=(0, 1)),
        "ex-07-rope-length": dict(steps=3, lengths=[4, 24], n_batches=1, seeds=(0, 1),
                                  chapter=dict(encodings=["none", "learned-large"],
                                               large_std=2 ** -0.5, position_n=8,
                                               position_seed=123)),
        "ex-08-warmup-experiment": dict(steps=3, lrs=[1e-2], layers=[1], seeds=(0,),
                                        chapter=dict(lr=1e-2, n_layers=1, warmups=[0, 2],
                                                     check=dict(n=8, seed=1))),
        "ex-09-beam-width": dict(preset="smoke", steps=3, sentences=6, beams=[1, 2], seeds=(0,)),
        "ex-12-whole-sequence-loss": dict(preset="smoke", steps=3, sentences=6, beam=2,
                                          seeds=(0,))}


def spread(values) -> dict:
    """{"mean", "min", "max"} of a list of numbers, rounded to 4 places."""
    return {"mean": round(float(np.mean(values)), 4), "min": round(float(min(values)), 4),
            "max": round(float(max(values)), 4)}


def run_config(name: str, model: str, **changes):
    """preset(name, model) with recipe fields changed: the one place this module sets a
    TrainConfig's fields (max_steps, seed, eval_every, eval_sentences)."""
    return replace(preset(name, model), **changes)


# ---------------------------------------------------------------------------------------------
# Chapter 5: many narrow heads, or the number of heads?

def heads_width(s: dict, work: Path) -> dict:
    """Accuracy of NeighbourReader(h, d_model) after `steps`, per seed, as the solution's
    mean_accuracy computes it."""
    runs = []
    for h, d_model, steps in s["runs"]:
        for seed in s["seeds"]:
            torch.manual_seed(seed)
            model = NeighbourReader(h, d_model)
            train_on_task(model, make_neighbour_batch, steps=steps, lr=s["lr"],
                          batch_size=s["batch_size"], seed=seed)
            acc = task_accuracy(model, make_neighbour_batch)[0]
            runs.append(dict(h=h, d_model=d_model, d_k=d_model // h, steps=steps, seed=seed,
                             accuracy=round(acc, 4)))
            print(f"  h {h:2d} d_model {d_model} steps {steps} seed {seed}: accuracy {acc:.3f}",
                  flush=True)
    summary = [dict(h=h, d_model=d, steps=n, accuracy=spread(
        [r["accuracy"] for r in runs if (r["h"], r["d_model"], r["steps"]) == (h, d, n)]))
        for h, d, n in s["runs"]]
    return {"runs": runs, "summary": summary}


# ---------------------------------------------------------------------------------------------
# Chapter 6: a plain copy without the mask; an off-by-one mask

class SeesNextToken(MultiHeadAttention):
    """ex-06-too-good's bug: self-attention whose "causal" mask was built with
    ``tril(diagonal=1)``, so query t also sees key t + 1, the token it must predict."""

    def forward(self, x, context=None, key_mask=None, causal=False, need_weights=False,
                cache=None):
        B, T, _ = x.shape
        q, k, v = (self.split_heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))  # (B,h,T,d_k)
        mask = causal_mask(T, offset=1, device=x.device)                             # (T, T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)               # (B,h,T,d_k)
        return self.W_o(out.transpose(1, 2).reshape(B, T, self.d_model)), None


def caesar_model(s: dict, vocab: int, mask: str, seed: int) -> torch.nn.Module:
    """Chapter 6's decoder-only model with mask "none", "causal" or "off-by-one" (the causal
    model's weights, its attention's mask moved one place up)."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, **s["model"])
    model = SelfAttentionStack(cfg, causal=mask != "none")
    if mask == "off-by-one":
        for block in model.blocks:
            block.self_attn.__class__ = SeesNextToken
    return model


def caesar_runs(s: dict, shift: int, masks: tuple) -> dict:
    """Train each mask's model on the Caesar copy with ``shift`` (0: plain copy) for each seed;
    the teacher-forced loss (mean of the last 20 steps) and, generating greedily from the prompt
    BOS a_1..a_k SEP, the share of answer letters and of whole answers right."""
    k, n = s["k"], s["n_symbols"]
    task = make_caesar_copy_task(k, n, shift=shift)
    test = task(s["n_test"], torch.Generator().manual_seed(s["test_seed"]))
    x, y = test.ids, test.targets                                          # (N, 2k + 2)
    runs = []
    for seed in s["seeds"]:
        for mask in masks:
            m = caesar_model(s, n + 5, mask, seed)
            losses = train_on_task(m, task, steps=s["steps"], lr=s["lr"],
                                   batch_size=s["batch_size"], seed=seed)
            written = greedy_generate(m, x[:, :k + 2], k + 1)[:, :k]         # (N, k)
            right = written == y[:, k + 1:2 * k + 1]                          # (N, k)
            runs.append(dict(mask=mask, seed=seed, loss=round(float(np.mean(losses[-20:])), 4),
                             letters=round(right.float().mean().item(), 4),
                             answers=round(right.all(1).float().mean().item(), 4)))
            print(f"  {mask:10s} seed {seed}: " + ", ".join(f"{key} {runs[-1][key]:.3f}"
                  for key in ("loss", "letters", "answers")), flush=True)
    summary = {mask: {key: spread([r[key] for r in runs if r["mask"] == mask])
                      for key in ("loss", "letters", "answers")} for mask in masks}
    return {"loss_floor": round(k * math.log(n) / (2 * k + 2), 4), "runs": runs,
            "summary": summary}


def plain_copy(s: dict, work: Path) -> dict:
    return caesar_runs(s, shift=0, masks=("none", "causal"))


def too_good(s: dict, work: Path) -> dict:
    return caesar_runs(s, shift=1, masks=("off-by-one",))


# ---------------------------------------------------------------------------------------------
# Chapter 7: does RoPE extrapolate?

def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (2j, 2j + 1) of x (..., T, d) by positions[t] * 10000 ** (-2j / d):
    rotary position embeddings, chapter 7's ``apply_rope``."""
    d = x.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)       # (d/2,)
    angle = positions.to(torch.float64)[:, None] * omega                       # (T, d/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]                                 # (..., T, d/2)
    return torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], -1).flatten(-2)


class RotaryAttention(MultiHeadAttention):
    """ex-07-rope-length's solution: self-attention that rotates its queries and keys by their
    positions 0 .. T-1 (no positional encoding elsewhere); with ``window``, key i is visible
    from query t only when |t - i| < window."""

    def __init__(self, d_model: int, h: int, window: int | None = None):
        super().__init__(d_model, h)
        self.window = window

    def forward(self, x, context=None, key_mask=None, causal=False, need_weights=False,
                cache=None):
        B, T, _ = x.shape
        pos = torch.arange(T, device=x.device)
        q = rope(self.split_heads(self.W_q(x)), pos)                  # (B, h, T, d_k)
        k = rope(self.split_heads(self.W_k(x)), pos)                  # (B, h, T, d_k)
        v = self.split_heads(self.W_v(x))                             # (B, h, T, d_k)
        mask = key_mask[:, None, None, :]                             # (B, 1, 1, T)
        if self.window is not None:
            mask = mask & ((pos[:, None] - pos[None, :]).abs() < self.window)  # (B, 1, T, T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.W_o(out.transpose(1, 2).reshape(B, T, self.d_model)), None


def encoder(s: dict, positional: str, seed: int) -> SelfAttentionStack:
    """Chapter 7's ``build_model(positional, seed)``: the one-layer encoder of ``s["model"]``
    that labels each position; "learned-large" is the learned table started at std
    ``s["chapter"]["large_std"]``."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=4 + s["n_symbols"], **s["model"],
                            positional=positional.removesuffix("-large"))
    model = SelfAttentionStack(cfg, causal=False, n_out=s["n_symbols"] + 1)
    if positional == "learned-large":
        torch.nn.init.normal_(model.pos.embedding.weight, std=s["chapter"]["large_std"])
    return model


@torch.no_grad()
def lookback_accuracy(model, s: dict, L: int) -> float:
    """Per-token accuracy on look-back sequences of exactly L symbols, as the chapter scores."""
    return task_accuracy(model, make_lookback_task(L, L, offset=s["offset"],
                                                   n_symbols=s["n_symbols"]),
                         n_batches=s["n_batches"])[0]


def rope_length(s: dict, work: Path) -> dict:
    """Chapter 7's encoder without positions (``build_model("none", seed)``: the same seed, the
    same config) with each block's self-attention replaced by RotaryAttention, trained on the
    look-back task as the chapter trains it; per-token accuracy by test length, per seed."""
    task = make_lookback_task(s["min_len"], s["l_train"], offset=s["offset"],
                              n_symbols=s["n_symbols"])
    runs = []
    for window in s["windows"]:
        for seed in s["seeds"]:
            model = encoder(s, "none", seed)
            for block in model.blocks:
                block.self_attn = RotaryAttention(model.cfg.d_model, model.cfg.h, window=window)
            losses = train_on_task(model, task, steps=s["steps"], lr=s["lr"],
                                   batch_size=s["batch_size"], seed=seed)
            acc = [round(lookback_accuracy(model, s, L), 4) for L in s["lengths"]]
            runs.append(dict(window=window, seed=seed,
                             loss=round(float(np.mean(losses[-20:])), 4), accuracy=acc))
            print(f"  window {window} seed {seed}: loss {runs[-1]['loss']:.3f}, accuracy " +
                  " ".join(f"{a:.2f}" for a in acc), flush=True)
    summary = [dict(window=window, length=L, accuracy=spread(
        [r["accuracy"][i] for r in runs if r["window"] == window]))
        for window in s["windows"] for i, L in enumerate(s["lengths"])]
    return {"lengths": s["lengths"], "runs": runs, "summary": summary,
            "chapter": [encoder_run(s, task, positional, seed)
                        for positional in s["chapter"]["encodings"] for seed in s["seeds"]]}


def encoder_run(s: dict, task, positional: str, seed: int) -> dict:
    """Chapter 7's ``build_model(positional, seed)`` trained and measured as the chapter does:
    "learned-large" is the learned table started at std ``large_std``; the accuracy of each
    length (the rope lengths but 200) and of each position of length-``max_len`` sequences."""
    c, L_test = s["chapter"], s["model"]["max_len"]
    model = encoder(s, positional, seed)
    learned = positional.startswith("learned")
    table = model.pos.embedding.weight.detach().clone() if learned else None   # (max_len, d)
    losses = train_on_task(model, task, steps=s["steps"], lr=s["lr"], batch_size=s["batch_size"],
                           seed=seed)
    by_length = [lookback_accuracy(model, s, L) for L in s["lengths"] if L <= L_test]
    with torch.no_grad():
        b = make_lookback_task(L_test, L_test, offset=s["offset"], n_symbols=s["n_symbols"])(
            c["position_n"], torch.Generator().manual_seed(c["position_seed"]))  # (n, L_test)
        model.eval()
        by_position = (model(b.ids, b.mask).argmax(-1) == b.targets).float().mean(0).tolist()
    run = dict(positional=positional, seed=seed, final_loss=float(np.mean(losses[-20:])),
               by_length=by_length, by_position=by_position)
    if table is not None:
        now, L = model.pos.embedding.weight.detach(), s["l_train"]
        run |= dict(untouched=torch.equal(now[L:], table[L:]),       # rows never trained
                    trained=not torch.equal(now[:L], table[:L]))
    print(f"  chapter: {positional} seed {seed}: final loss {run['final_loss']:.3f}", flush=True)
    return run


# ---------------------------------------------------------------------------------------------
# Chapter 8: where does post-LN break?

def train_reversal(s: dict, norm_first: bool, seed: int, lr: float, n_layers: int,
                   warmup: int = 0):
    """Chapter 8's ``train_reversal``: its tiny Transformer (``toy_cfg`` with ``n_layers`` and
    ``norm_first``), Adam, reversals of min_len..max_len symbols, the learning rate warmed up
    linearly over the first ``warmup`` steps (0: none). Returns the model (in evaluation mode)
    and the loss of every step."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=toy_vocab_size(s["n_symbols"]),
                            **(s["model"] | {"n_layers": n_layers, "norm_first": norm_first}))
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    gen = torch.Generator().manual_seed(seed)

    def next_batch(step):
        return make_reverse_batch(s["batch_size"], s["min_len"], s["max_len"], s["n_symbols"],
                                  generator=gen)

    def loss_fn(model, b):
        return translation_loss(model(b.src, b.src_mask, b.tgt_in, b.tgt_mask), b.tgt_out)

    losses = fit(model, next_batch, loss_fn, s["steps"], opt, sched)
    return model.eval(), losses


@torch.no_grad()
def p_right(model, s: dict) -> float:
    """The mean probability ``model`` gives the right next token on chapter 8's check batch
    (``s["chapter"]["check"]``: n reversals of min_len..max_len symbols, generator seed)."""
    c = s["chapter"]["check"]
    b = make_reverse_batch(c["n"], s["min_len"], s["max_len"], s["n_symbols"],
                           generator=torch.Generator().manual_seed(c["seed"]))
    p = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask).softmax(-1)          # (B, T, V)
    return p.gather(-1, b.tgt_out[..., None])[..., 0][b.tgt_mask].mean().item()


def warmup_experiment(s: dict, work: Path) -> dict:
    """The mean loss of the last 50 steps of train_reversal for each depth, learning rate,
    LayerNorm placement and seed; and the chapter's four runs per seed, with every step's loss
    and the mean probability of the right next token."""
    runs = []
    for n_layers in s["layers"]:
        for lr in s["lrs"]:
            for norm_first in (False, True):
                for seed in s["seeds"]:
                    _, losses = train_reversal(s, norm_first, seed, lr, n_layers)
                    runs.append(dict(n_layers=n_layers, lr=lr, norm="pre" if norm_first else "post",
                                     seed=seed, last50=float(np.mean(losses[-50:]))))
                    print(f"  {n_layers} layers lr {lr:g} {runs[-1]['norm']}-LN seed {seed}: "
                          f"{runs[-1]['last50']:.3f}", flush=True)
    summary = [dict(n_layers=n, lr=lr, norm=norm, last50=spread(
        [r["last50"] for r in runs if (r["n_layers"], r["lr"], r["norm"]) == (n, lr, norm)]))
        for n in s["layers"] for lr in s["lrs"] for norm in ("post", "pre")]
    c, chapter = s["chapter"], []
    for warmup in c["warmups"]:
        for norm_first in (False, True):
            for seed in s["seeds"]:
                model, losses = train_reversal(s, norm_first, seed, c["lr"], c["n_layers"], warmup)
                chapter.append(dict(norm="pre" if norm_first else "post", warmup=warmup,
                                    seed=seed, last50=float(np.mean(losses[-50:])),
                                    p_right=round(p_right(model, s), 6),
                                    losses=[round(x, 5) for x in losses]))
                print(f"  chapter: {chapter[-1]['norm']}-LN warm-up {warmup} seed {seed}: "
                      f"{chapter[-1]['last50']:.3f}", flush=True)
    return {"runs": runs, "summary": summary, "chapter": chapter}


# ---------------------------------------------------------------------------------------------
# Chapter 9: beam width and length penalty

def beam_width(s: dict, work: Path) -> dict:
    """For each seed, train chapter 9's model (the preset's first `steps` steps; seed 0 is the
    notebook's own), then BLEU, brevity penalty and mean output length (words) on the first
    `sentences` test pairs for each alpha and beam. Beam 1 is greedy search, whatever alpha."""
    part = load_multi30k("test_2016_flickr", "de", "en")[:s["sentences"]]
    srcs, refs = [x for x, _ in part], [t for _, t in part]
    models, rows = [], []
    for seed in s["seeds"]:
        cfg = run_config(s["preset"], "transformer", max_steps=s["steps"], seed=seed)
        metrics = train(cfg, work / f"seed-{seed}", device=torch.device("cpu"), progress=False)
        model, tok, _ = load_run(work / f"seed-{seed}", torch.device("cpu"))
        models.append(dict(seed=seed, steps=metrics["steps"], test_bleu=metrics["test_bleu"],
                           decoding=metrics["decoding"], train_time_s=metrics["train_time_s"],
                           bleu_signature=metrics["bleu_signature"]))
        greedy = translate(model, tok, srcs, beam_size=1)
        for alpha in s["alphas"]:
            for k in s["beams"]:
                hyps = greedy if k == 1 else translate(model, tok, srcs, beam_size=k, alpha=alpha)
                b = bleu(hyps, refs)
                rows.append(dict(seed=seed, alpha=alpha, beam=k, bleu=b["bleu"], bp=b["bp"],
                                 mean_words=round(float(np.mean([len(h.split()) for h in hyps])),
                                                  3), bleu_signature=b["signature"]))
                print(f"  seed {seed} alpha {alpha} beam {k:2d}: BLEU {b['bleu']:5.2f}, "
                      f"bp {b['bp']:.3f}, {rows[-1]['mean_words']:.2f} words", flush=True)
    summary = [dict(alpha=alpha, beam=k, **{key: spread([r[key] for r in rows if
                                                         (r["alpha"], r["beam"]) == (alpha, k)])
                                            for key in ("bleu", "bp", "mean_words")})
               for alpha in s["alphas"] for k in s["beams"]]
    return {"models": models, "runs": rows, "summary": summary,
            "reference_mean_words": round(float(np.mean([len(t.split()) for t in refs])), 3)}


# ---------------------------------------------------------------------------------------------
# Chapter 12: the loss on the whole sequence

def whole_sequence_loss(model, b, label_smoothing: float = 0.0) -> torch.Tensor:
    """The next-token loss on ``BOS source EOS target EOS``, source tokens included, for a
    DecoderOnlyTranslator on a translation batch b (the exercise's solution)."""
    prompt, prompt_mask = model.encode(b.src, b.src_mask)                  # (B, S+2)
    ids = torch.cat([prompt, b.tgt_out], 1)                    # (B, L): BOS src EOS [gap] tgt EOS
    mask = torch.cat([prompt_mask, b.tgt_mask], 1)                         # (B, L)
    logits = model.stack(ids, mask, positions=token_positions(mask))       # (B, L, V)
    ids = torch.where(mask, ids, PAD_ID)
    order = torch.argsort((~mask).int(), dim=1, stable=True)   # real tokens first, in order
    packed_ids = ids.gather(1, order)                                      # (B, L)
    packed_logits = logits.gather(1, order[..., None].expand_as(logits))   # (B, L, V)
    return lm_loss(packed_logits, packed_ids, label_smoothing)


def whole_sequence(s: dict, work: Path) -> dict:
    """The decoder-only translator trained with the target-only loss and the whole-sequence
    loss, same batches and steps, per seed: validation loss on the target tokens (all
    validation sentences) and BLEU on the first `sentences` test pairs."""
    runs = []
    for seed in s["seeds"]:
        for loss in ("target", "whole"):
            cfg = run_config(s["preset"], "decoder-only", max_steps=s["steps"], seed=seed,
                             eval_every=s["steps"], eval_sentences=s["sentences"],
                             beam_size=s["beam"], length_alpha=s["alpha"])
            m = train(cfg, work / f"{loss}-{seed}", device=torch.device("cpu"), progress=False,
                      loss_fn=whole_sequence_loss if loss == "whole" else None)
            runs.append(dict(loss=loss, seed=seed, val_loss=round(m["val_loss"], 4),
                             bleu=m["test_bleu"], train_time_s=m["train_time_s"],
                             bleu_signature=m["bleu_signature"]))
            print(f"  {loss:6s} seed {seed}: validation loss {runs[-1]['val_loss']:.3f}, "
                  f"BLEU {m['test_bleu']:5.2f} ({m['train_time_s']:.0f} s)", flush=True)
    summary = {loss: {key: spread([r[key] for r in runs if r["loss"] == loss])
                      for key in ("val_loss", "bleu")} for loss in ("target", "whole")}
    return {"runs": runs, "summary": summary}


EXPERIMENTS = {"ex-05-heads-width": (heads_width, HEADS_WIDTH),
               "ex-06-plain-copy": (plain_copy, CAESAR),
               "ex-06-too-good": (too_good, CAESAR),
               "ex-07-rope-length": (rope_length, ROPE_LENGTH),
               "ex-08-warmup-experiment": (warmup_experiment, WARMUP),
               "ex-09-beam-width": (beam_width, BEAM_WIDTH),
               "ex-12-whole-sequence-loss": (whole_sequence, WHOLE_SEQUENCE)}


def run(name: str, tiny: bool = False) -> dict:
    """Run one exercise's experiment; its entry of exercises.json (with its own wall and CPU
    time; the call's provenance is the file's, :mod:`attnbook.store`)."""
    fn, settings = EXPERIMENTS[name]
    s = settings | (TINY[name] if tiny else {})
    start, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as work:
        result = fn(s, Path(work))
    return {"scale": "tiny" if tiny else "full", "settings": s, **result,
            "wall_time_s": round(time.perf_counter() - start, 1),
            "cpu_time_s": round(time.process_time() - cpu, 1)}


def in_order(out: dict, old: dict | None) -> dict:
    """An exercises.json as :func:`attnbook.experiments.registry.save` merged it (a call's
    entries replace those of the same exercise), its entries in the order of
    :data:`EXPERIMENTS`. ``old``: the file before the call (None: there was none)."""
    out["calls"][-1]["rows"] = list(out["calls"][-1].get("rows") or out["exercises"])
    return out | {"exercises": {n: out["exercises"][n] for n in EXPERIMENTS
                                if n in out["exercises"]}}
