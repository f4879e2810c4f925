"""The training runs of chapter 13: three token mixers, three seeds each, on two of the book's
tasks.

    python -m attnbook beyond_runs --out results/cpu/beyond.json   # 24 minutes on a busy 2-core VM

1. **Reversal** (chapter 1's task as one sequence, :func:`attnbook.beyond.reversal_batch`):
   exact-match and per-token accuracy by length for softmax attention, linear attention and the
   gated recurrence, each in the same one-block decoder-only model.
2. **Language model** (chapter 12's captions, model and recipe): validation loss of the same
   three mixers in chapter 12's two-block model after 320 steps.
3. **Variants** (the exercises ex-13-state-size and ex-13-more-state): the reversal model with
   its mixer replaced by ``LinearAttention(32, 4)`` (4 heads) or ``GatedRecurrence(32,
   d_state=256)`` (eight times the state), trained and scored like the reversal runs.

Each (task, mixer, seed) trains from its own seed on the same data order for that seed (the
reversal settings and the run are the library's, :data:`attnbook.beyond.REVERSAL` and
:func:`attnbook.beyond.run_reversal`). The JSON (:mod:`attnbook.store`'s format) names the
settings, and its provenance records the calls (command, git commit, versions, hardware, wall and
CPU time); the notebook loads it. ``--only PART`` runs only that part (``reversal``, ``lm`` or
``variants``; repeatable) and merges it into the existing file by part: the others stay, and the
call is appended to the file's ``calls`` with the parts it made:

    python -m attnbook beyond_runs --out results/cpu/beyond.json --only variants
"""
from __future__ import annotations

import time

import torch

from ..batching import translation_loss
from ..beyond import (MIXERS, REVERSAL, GatedRecurrence, LinearAttention, mixer_model,
                     reversal_config, run_reversal, train_model)
from ..data import load_multi30k
from ..lm import lm_batches
from ..tokenizer import multi30k_tokenizer
from ..transformer import TransformerConfig
from ..utils import count_parameters, deterministic
from .registry import ROWS

__all__ = ["REVERSAL", "reversal_config", "run_reversal"]   # reversal_*: from beyond

LM = dict(vocab=4000, steps=320, warmup=32, lr=3e-3, max_tokens=1536, n_val=500,
          model=dict(d_model=64, h=4, d_ff=256, n_layers=2, dropout=0.0, norm_first=True))
# The exercises' variants of the reversal model: name -> (mixer kind, the mixer put in its block)
VARIANTS = {
    "linear-4-heads": ("linear", lambda: LinearAttention(32, 4)),             # ex-13-state-size
    "recurrent-state-256": ("recurrent", lambda: GatedRecurrence(32, d_state=256)),  # ex-13-more-state
}
PARTS = ROWS["beyond"].key              # reversal, lm, variants


def caption_data():
    """Chapter 12's data: (train batches, validation batches) of BOS caption EOS."""
    tok = multi30k_tokenizer(LM["vocab"])
    train = tok.encode_batch([en for _, en in load_multi30k("train", "de", "en")],
                             bos=True, eos=True)
    val = tok.encode_batch([en for _, en in load_multi30k("val", "de", "en")][:LM["n_val"]],
                           bos=True, eos=True)
    return (lm_batches(train, max_tokens=LM["max_tokens"], seed=0),
            lm_batches(val, max_tokens=4096, shuffle=False))


@torch.no_grad()
def validation_loss(model, val_batches) -> float:
    """Mean next-token cross-entropy over the real tokens of the validation batches."""
    model.eval()
    total, n = 0.0, 0
    for b in val_batches:
        k = b.n_scored
        total += translation_loss(model(b.ids, b.mask), b.targets).item() * k
        n += k
    return total / n


def run_lm(kind: str, seed: int, train_batches, val_batches) -> dict:
    """Train one caption language model; its validation loss, parameters and training seconds."""
    deterministic(seed)
    cfg = TransformerConfig(vocab_size=LM["vocab"], **LM["model"])
    model = mixer_model(cfg, kind)

    start = time.perf_counter()
    train_model(model, lambda step: train_batches[step % len(train_batches)], LM["steps"],
                lr=LM["lr"], warmup=LM["warmup"])
    seconds = time.perf_counter() - start
    return {"mixer": kind, "seed": seed, "params": count_parameters(model),
            "train_seconds": round(seconds, 2),
            "val_loss": round(validation_loss(model, val_batches), 4)}


def run_variant(name: str, seed: int, steps: int | None = None) -> dict:
    """One run of :data:`VARIANTS`: the reversal model with the variant's mixer."""
    kind, mixer = VARIANTS[name]
    return {"variant": name} | run_reversal(kind, seed, mixer=mixer, steps=steps)


def run_part(part: str, args) -> dict:
    """One part of beyond.json: its settings and runs (every mixer or variant, every seed)."""
    runs = []
    if part == "lm":
        train_batches, val_batches = caption_data()
        for seed in args.seeds:
            for kind in MIXERS:
                runs.append(run_lm(kind, seed, train_batches, val_batches))
                print(f"lm {kind:9s} seed {seed}: validation loss {runs[-1]['val_loss']:.3f} "
                      f"({runs[-1]['train_seconds']:.0f} s)", flush=True)
        return {"settings": LM, "runs": runs}
    settings = REVERSAL | ({"steps": args.steps} if args.steps else {})
    if part == "reversal":
        for seed in args.seeds:
            for kind in MIXERS:
                runs.append(run_reversal(kind, seed, steps=args.steps))
                print(f"reversal {kind:9s} seed {seed}: exact {runs[-1]['exact']} "
                      f"({runs[-1]['train_seconds']:.0f} s)", flush=True)
        return {"settings": settings, "runs": runs}
    for name in VARIANTS:
        for seed in args.seeds:
            runs.append(run_variant(name, seed, steps=args.steps))
            print(f"variant {name} seed {seed}: exact {runs[-1]['exact']} "
                  f"({runs[-1]['train_seconds']:.0f} s)", flush=True)
    return {"settings": settings,
            "mixers": {"linear-4-heads": "LinearAttention(32, 4)",
                       "recurrent-state-256": "GatedRecurrence(32, d_state=256)"},
            "runs": runs}


def in_order(out: dict, old: dict | None) -> dict:
    """A beyond.json as :func:`attnbook.experiments.registry.save` merged it (a call's parts
    replace those of the file), its keys in the order of :data:`PARTS`. ``old``: the file
    before the call (None: there was none)."""
    out["calls"][-1]["rows"] = list(out["calls"][-1].get("rows") or
                                    [p for p in PARTS if p in out])
    return {k: out[k] for k in ("experiment", "format", "calls", "seeds", *PARTS) if k in out}
