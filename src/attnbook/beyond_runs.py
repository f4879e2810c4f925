"""The training runs of chapter 11: three token mixers, three seeds each, on two of the book's
tasks.

    python -m attnbook.beyond_runs --out results/cpu/beyond.json   # 17 minutes on a busy 2-core VM

1. **Reversal** (chapter 1's task as one sequence, :func:`attnbook.beyond.reversal_batch`):
   exact-match and per-token accuracy by length for softmax attention, linear attention and the
   gated recurrence, each in the same one-block decoder-only model.
2. **Language model** (chapter 10's captions, model and recipe): validation loss of the same
   three mixers in chapter 10's two-block model after 320 steps.

Each (task, mixer, seed) trains from its own seed on the same data order for that seed. The JSON
names the settings, the versions and hardware, and the wall time; the notebook loads it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from . import PAD_ID
from .batching import translation_loss
from .beyond import MIXERS, mixer_model, reversal_accuracy, reversal_batch, train_model
from .data import load_multi30k
from .lm import lm_batches
from .tokenizer import multi30k_tokenizer
from .toy import vocab_size
from .transformer import TransformerConfig
from .utils import count_parameters, deterministic, versions

SEEDS = (0, 1, 2)
REVERSAL = dict(n_symbols=8, min_len=1, max_len=16, steps=1500, batch_size=32, lr=3e-3,
                lengths=list(range(2, 17, 2)), n_per_length=200,
                model=dict(d_model=32, h=1, d_ff=64, n_layers=1, dropout=0.0, norm_first=True,
                           positional="sinusoidal", max_len=64))
LM = dict(vocab=4000, steps=320, warmup=32, lr=3e-3, max_tokens=1536, n_val=500,
          model=dict(d_model=64, h=4, d_ff=256, n_layers=2, dropout=0.0, norm_first=True))


def reversal_config() -> TransformerConfig:
    return TransformerConfig(vocab_size=vocab_size(REVERSAL["n_symbols"]), **REVERSAL["model"])


def run_reversal(kind: str, seed: int) -> dict:
    """Train one reversal model; its accuracy by length, parameters and training seconds."""
    r = REVERSAL
    deterministic(seed)
    model = mixer_model(reversal_config(), kind)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    losses = train_model(model, lambda step: reversal_batch(r["batch_size"], r["min_len"],
                                                            r["max_len"], r["n_symbols"], gen),
                         r["steps"], lr=r["lr"])
    seconds = time.perf_counter() - start
    acc = reversal_accuracy(model, r["lengths"], r["n_symbols"], r["n_per_length"])
    return {"mixer": kind, "seed": seed, "params": count_parameters(model),
            "train_seconds": round(seconds, 2), "final_loss": round(sum(losses[-50:]) / 50, 4),
            "exact": [round(a, 4) for a in acc["exact"]],
            "token": [round(a, 4) for a in acc["token"]]}


def caption_data():
    """Chapter 10's data: (train batches, validation batches) of BOS caption EOS."""
    tok = multi30k_tokenizer(LM["vocab"])
    train = tok.encode_batch([en for _, en in load_multi30k("train", "de", "en")],
                             bos=True, eos=True)
    val = tok.encode_batch([en for _, en in load_multi30k("val", "de", "en")][:LM["n_val"]],
                           bos=True, eos=True)
    return (lm_batches(train, max_tokens=LM["max_tokens"], seed=0),
            lm_batches(val, max_tokens=4096, shuffle=False))


def next_token_targets(ids: torch.Tensor) -> torch.Tensor:
    """ids (B, L) -> targets (B, L): the next token at each position, PAD after the last."""
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], PAD_ID)], 1)


@torch.no_grad()
def validation_loss(model, val_batches) -> float:
    """Mean next-token cross-entropy over the real tokens of the validation batches."""
    model.eval()
    total, n = 0.0, 0
    for ids, mask in val_batches:
        targets = next_token_targets(ids)
        k = int((targets != PAD_ID).sum())
        total += translation_loss(model(ids, mask), targets).item() * k
        n += k
    return total / n


def run_lm(kind: str, seed: int, train_batches, val_batches) -> dict:
    """Train one caption language model; its validation loss, parameters and training seconds."""
    deterministic(seed)
    cfg = TransformerConfig(vocab_size=LM["vocab"], **LM["model"])
    model = mixer_model(cfg, kind)

    def next_batch(step):
        ids, mask = train_batches[step % len(train_batches)]
        return ids, next_token_targets(ids), mask

    start = time.perf_counter()
    train_model(model, next_batch, LM["steps"], lr=LM["lr"], warmup=LM["warmup"])
    seconds = time.perf_counter() - start
    return {"mixer": kind, "seed": seed, "params": count_parameters(model),
            "train_seconds": round(seconds, 2),
            "val_loss": round(validation_loss(model, val_batches), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    p.add_argument("--note", default="", help="a note stored with the results")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    reversal = []
    for seed in SEEDS:
        for kind in MIXERS:
            reversal.append(run_reversal(kind, seed))
            print(f"reversal {kind:9s} seed {seed}: exact {reversal[-1]['exact']} "
                  f"({reversal[-1]['train_seconds']:.0f} s)", flush=True)
    train_batches, val_batches = caption_data()
    lm = []
    for seed in SEEDS:
        for kind in MIXERS:
            lm.append(run_lm(kind, seed, train_batches, val_batches))
            print(f"lm {kind:9s} seed {seed}: validation loss {lm[-1]['val_loss']:.3f} "
                  f"({lm[-1]['train_seconds']:.0f} s)", flush=True)
    result = {"command": shlex.join(["python", "-m", "attnbook.beyond_runs",
                                     *(sys.argv[1:] if argv is None else argv)]),
              "note": args.note, "environment": versions(),
              "wall_time_s": round(time.perf_counter() - start, 1), "seeds": list(SEEDS),
              "reversal": {"settings": REVERSAL, "runs": reversal},
              "lm": {"settings": LM, "runs": lm}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
