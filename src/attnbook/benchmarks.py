"""The benchmark suite of the appendix "Performance": ``python -m attnbook.benchmarks`` (``make bench``).

Four measurements, each against PyTorch's own modules and, where it is known, the hardware limit:

* ``attention``: the book's from-scratch attention against ``F.scaled_dot_product_attention``
  (the raw kernels), and the book's ``MultiHeadAttention`` against ``nn.MultiheadAttention``
  (both with their projections); forward and forward+backward; time and peak memory, T = 16..4096;
* ``training``: tokens/s of a full training step (forward, label-smoothed loss, backward, Adam)
  of the book's Transformer and of ``nn.Transformer`` with the same configuration and the same
  weights, side by side; eager and ``torch.compile``; fp32, and bf16 autocast on a GPU; the
  model-FLOPs utilisation (MFU) where the device's peak is known;
* ``decoding``: greedy and beam search with and without the key/value cache, 64-token outputs;
* ``recurrence``: time per training step of the GRU encoder-decoders and the Transformer as the
  sequence length grows: the parallelism argument of the paper.

Each runs on the CPU and, when PyTorch sees one, on a CUDA GPU, and writes
``OUT/<cpu|cuda>/<name>.json`` (hardware, versions, load, settings, wall time, every
measurement) and ``OUT/<cpu|cuda>/<name>.png``. ``--quick`` runs tiny sizes in seconds (what the
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
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import BOS_ID, PAD_ID
from .attention import scaled_dot_product_attention
from .bench import _synchronize, attention_inputs, peak_memory, time_call
from .decoding import beam_search, greedy_decode
from .mha import MultiHeadAttention
from .rnn import Seq2Seq
from .recipe import translation_loss
from .transformer import Transformer, TransformerConfig, positional_encoding
from .utils import count_parameters, versions

SECTIONS = ("attention", "training", "decoding", "recurrence")
SCHEMA = 1
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "results" / "bench"

# Dense peak FLOP/s (no structured sparsity), in TFLOP/s, from NVIDIA's data sheets:
# (a piece of torch.cuda.get_device_name, bf16 tensor cores, tf32 tensor cores, fp32 without them).
# The first entry whose piece occurs in the name wins, so the more specific names come first.
GPU_PEAK_TFLOPS = [
    ("H200", 989.0, 494.0, 67.0),
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100 NVL", 835.0, 418.0, 60.0),
    ("H100", 989.0, 494.0, 67.0),        # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0, 156.0, 19.5),
    ("L40S", 362.0, 183.0, 91.6),
    ("L4", 121.0, 60.0, 30.3),
]


# ---------------------------------------------------------------------------------------------
# FLOPs and peaks
# ---------------------------------------------------------------------------------------------

def matmul_params(cfg: TransformerConfig) -> int:
    """N, the weights that enter a matrix multiply for every token: per encoder layer 4 d^2
    (W_q, W_k, W_v, W_o) + 2 d d_ff; per decoder layer 8 d^2 (two attentions) + 2 d d_ff; the
    output layer V d. Biases, LayerNorms and the embedding lookup (a gather) are left out."""
    d, f, L, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    return L * (4 * d * d + 2 * d * f) + L * (8 * d * d + 2 * d * f) + V * d


def transformer_flops(cfg: TransformerConfig, B: int, S: int, T: int) -> dict:
    """FLOPs of the matrix multiplies of one batch of B sentences, S source and T target tokens.

    forward: every (m, k) x (k, n) product costs 2 m k n. Per source token, each encoder layer
    projects with 4 d^2 weights and runs the feed-forward (2 d d_ff), and each decoder layer's
    cross-attention projects the memory to keys and values (2 d^2). Per target token, each
    decoder layer projects with 6 d^2 (self-attention 4, cross-attention queries and output 2)
    plus the feed-forward, and the output layer has V d. Attention itself, per layer and
    sentence: q k^T and weights @ v, 2 x 2 d (query-key pairs): S^2 (encoder), T^2 (decoder,
    all of the causal matrix, as a masked dense kernel computes it) and T S (cross).
    training: 3 x forward (the backward pass computes two products for each one of the forward).
    """
    d, f, L, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    per_src = L * 2 * (4 * d * d + 2 * d * f) + L * 2 * (2 * d * d)
    per_tgt = L * 2 * (6 * d * d + 2 * d * f) + 2 * d * V
    attention = L * 4 * d * B * (S * S + T * T + T * S)
    forward = B * S * per_src + B * T * per_tgt + attention
    return {"forward": forward, "training": 3 * forward,
            "training_per_target_token": 3 * forward / (B * T),
            "attention_share": attention / forward}


def gpu_peak_flops(name: str | None, precision: str) -> float | None:
    """Dense peak FLOP/s of the GPU called ``name`` for ``precision`` ("bf16", "tf32", "fp32"),
    or None if the table does not know it."""
    if not name:
        return None
    column = {"bf16": 1, "tf32": 2, "fp32": 3}[precision]
    for row in GPU_PEAK_TFLOPS:
        if row[0].lower() in name.lower():
            return row[column] * 1e12
    return None


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s or None, where it comes from) for ``device`` at ``precision``."""
    if device.type != "cuda":
        return None, ("unknown: a CPU's peak depends on its clock under load, its vector units and "
                      "how many cores are really free; achieved FLOP/s are reported, and the rate "
                      "of one large matrix multiply measured in the same run for comparison")
    name = torch.cuda.get_device_name(device)
    if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
        precision = "tf32"
    peak = gpu_peak_flops(name, precision)
    if peak is None:
        return None, f"unknown: {name!r} is not in attnbook.benchmarks.GPU_PEAK_TFLOPS"
    return peak, f"NVIDIA data sheet, dense {precision}, {name}"


def matmul_rate(device: torch.device, n: int, dtype=torch.float32) -> dict:
    """FLOP/s of one (n, n) @ (n, n) product, the fastest of a few: a practical ceiling."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    seconds = time_call(torch.mm, a, b, repeats=3, min_time=0.2)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "seconds": seconds,
            "flops_per_s": 2 * n ** 3 / seconds}


# ---------------------------------------------------------------------------------------------
# nn.Transformer with the book's embeddings around it, and copied weights
# ---------------------------------------------------------------------------------------------

class TorchTransformer(nn.Module):
    """``nn.Transformer`` wrapped like the book's Transformer: the same embedding (scaled by
    sqrt(d_model)), positional encoding, dropout and tied output layer, so both do the same work.

    forward(src (B, S), src_mask (B, S), tgt_in (B, T), tgt_mask (B, T)) -> logits (B, T, V);
    masks in the book's convention (True = real token), negated for PyTorch's modules.
    Post-LN stacks get no final LayerNorm (nn.Transformer's default adds one), as in the book.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        kw = dict(d_model=cfg.d_model, nhead=cfg.h, dim_feedforward=cfg.d_ff,
                  dropout=cfg.dropout, batch_first=True, norm_first=cfg.norm_first)
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), cfg.n_layers,
                                    norm=nn.LayerNorm(cfg.d_model) if cfg.norm_first else None,
                                    enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), cfg.n_layers,
                                    norm=nn.LayerNorm(cfg.d_model) if cfg.norm_first else None)
        self.transformer = nn.Transformer(custom_encoder=enc, custom_decoder=dec, **kw)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.pos = positional_encoding(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.out.weight = self.embed.weight

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.pos(self.embed(ids) * math.sqrt(self.cfg.d_model)))

    def forward(self, src, src_mask, tgt_in, tgt_mask=None):
        T = tgt_in.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # True = blocked
        x = self.transformer(self.embed_tokens(src), self.embed_tokens(tgt_in), tgt_mask=future,
                             src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask,
                             tgt_key_padding_mask=None if tgt_mask is None else ~tgt_mask,
                             tgt_is_causal=True)                          # (B, T, d_model)
        return self.out(x)                                                # (B, T, V)

    @torch.no_grad()
    def load_from_book(self, model: Transformer) -> "TorchTransformer":
        """Copy the weights of the book's ``model`` (same configuration) into this module."""
        self.embed.weight.copy_(model.embed.weight)
        mine = list(self.transformer.encoder.layers) + list(self.transformer.decoder.layers)
        for theirs, book in zip(mine, list(model.encoder) + list(model.decoder)):
            pairs = [(theirs.self_attn, book.self_attn)]
            if hasattr(theirs, "multihead_attn"):
                pairs.append((theirs.multihead_attn, book.cross_attn))
            for t, b in pairs:
                t.in_proj_weight.copy_(torch.cat([b.W_q.weight, b.W_k.weight, b.W_v.weight]))
                t.in_proj_bias.copy_(torch.cat([b.W_q.bias, b.W_k.bias, b.W_v.bias]))
                t.out_proj.load_state_dict(b.W_o.state_dict())
            theirs.linear1.load_state_dict(book.ff.linear1.state_dict())
            theirs.linear2.load_state_dict(book.ff.linear2.state_dict())
            for i in (1, 2, 3):
                if hasattr(theirs, f"norm{i}"):
                    mine_norm, book_norm = getattr(theirs, f"norm{i}"), getattr(book, f"norm{i}")
                    mine_norm.load_state_dict(book_norm.state_dict())
        if self.cfg.norm_first:
            self.transformer.encoder.norm.load_state_dict(model.enc_norm.state_dict())
            self.transformer.decoder.norm.load_state_dict(model.dec_norm.state_dict())
        return self


def random_batch(B: int, S: int, T: int, V: int, device="cpu", seed: int = 0) -> dict:
    """A batch of random sentences without padding: src (B, S), tgt_in = BOS + tgt_out[:, :-1]
    (B, T), tgt_out (B, T), and all-True masks (book convention)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt_out = torch.randint(4, V, (B, T), generator=g)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt_out[:, :-1]], dim=1)
    b = {"src": src, "src_mask": torch.ones(B, S, dtype=torch.bool), "tgt_in": tgt_in,
         "tgt_mask": torch.ones(B, T, dtype=torch.bool), "tgt_out": tgt_out}
    return {k: v.to(device) for k, v in b.items()}


def twin_models(cfg: TransformerConfig, device="cpu", seed: int = 0):
    """The book's Transformer and a TorchTransformer holding a copy of its weights."""
    torch.manual_seed(seed)
    book = Transformer(cfg)
    ref = TorchTransformer(cfg).load_from_book(book)
    return book.to(device), ref.to(device)


# ---------------------------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------------------------

def _seconds(fn, device: torch.device, n: int = 1) -> float:
    """Wall-clock seconds of n calls of fn() (gradients as the caller set them), per call."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    _synchronize(device)
    return (time.perf_counter() - start) / n


def interleaved(fns: dict, device: torch.device, rounds: int, n: int = 1) -> dict:
    """Time every fn of ``fns`` (name -> fn()) once per round, in an order reversed every other
    round (A B C, C B A, ...), so that a change of load affects all of them alike.
    Returns name -> list of seconds per call (n calls per sample)."""
    names, samples = list(fns), {name: [] for name in fns}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(_seconds(fns[name], device, n))
    return samples


def _stats(samples: list[float]) -> dict:
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "samples_s": [round(s, 6) for s in samples]}


def _error(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:300]


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


# ---------------------------------------------------------------------------------------------
# 1. Attention kernels and modules
# ---------------------------------------------------------------------------------------------

def _attention_calls(B: int, h: int, d_k: int, device: torch.device):
    """name -> (kind, make). make(T) returns (forward fn, forward+backward fn, inputs): each fn
    is called as fn(*inputs), so that time_call and peak_memory see the device of the inputs.
    Raw kernels take q, k, v (B, h, T, d_k); modules take x (B, T, d_model = h d_k) and include
    their projections."""
    d_model = h * d_k
    torch.manual_seed(0)
    book_mha = MultiHeadAttention(d_model, h).to(device).eval()
    torch_mha = nn.MultiheadAttention(d_model, h, batch_first=True).to(device).eval()
    book_mha.load_from_torch(torch_mha)

    def kernel(f):
        def make(T):
            q, k, v = (t.requires_grad_()
                       for t in attention_inputs(T, B=B, h=h, d_k=d_k, device=device))

            def fwd_bwd(q, k, v):
                with torch.enable_grad():
                    return torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
            return f, fwd_bwd, (q, k, v)
        return make

    def module(m, f):
        def make(T):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(B, T, d_model, generator=g).to(device).requires_grad_()

            def fwd_bwd(x):
                with torch.enable_grad():
                    return torch.autograd.grad(f(x).sum(), [x, *m.parameters()])
            return f, fwd_bwd, (x,)
        return make

    return {
        "book kernel": ("kernel", kernel(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0])),
        "F.scaled_dot_product_attention": ("kernel", kernel(F.scaled_dot_product_attention)),
        "book MultiHeadAttention": ("module", module(book_mha, lambda x: book_mha(x)[0])),
        "nn.MultiheadAttention": ("module", module(
            torch_mha, lambda x: torch_mha(x, x, x, need_weights=False)[0])),
        "book MultiHeadAttention, weights": ("module", module(
            book_mha, lambda x: book_mha(x, need_weights=True)[0])),
        "nn.MultiheadAttention, weights": ("module", module(
            torch_mha, lambda x: torch_mha(x, x, x, need_weights=True,
                                           average_attn_weights=False)[0])),
    }


def bench_attention(device: torch.device, quick: bool = False) -> dict:
    """Time and peak memory of each attention implementation, forward and forward+backward, for
    each sequence length; lengths whose predicted cost passes the limits are skipped and said so."""
    B, h, d_k = (1, 2, 16) if quick else (1, 8, 64)
    lengths = [16, 64] if quick else [16, 64, 256, 1024, 4096]
    if device.type == "cuda":
        max_bytes = int(0.5 * torch.cuda.get_device_properties(device).total_memory)
    else:
        max_bytes = 4 * 2 ** 30
    max_seconds = 4.0
    settings = {"B": B, "h": h, "d_k": d_k, "d_model": h * d_k, "lengths": lengths,
                "dtype": "float32", "self_attention": True, "mask": None,
                "timing": "fastest of a warm-up call and 3 more (2 when a call takes > 0.5 s; "
                          "small ones repeated for at least 0.05 s, attnbook.bench.time_call); "
                          "lengths in the outer loop, implementations in the inner one; "
                          "peak_memory: one more call, bytes above the start",
                "limits": {"max_seconds_per_call": max_seconds, "max_peak_bytes": max_bytes,
                           "rule": "the next length is skipped when the last measured time or "
                                   "memory, scaled by (T_next / T_last)^2, passes a limit"},
                "modules_mode": "eval(); forward without gradients lets nn.MultiheadAttention "
                                "take its fused inference fast path, as it does for any user"}
    rows, capped, last = [], [], {}
    calls = _attention_calls(B, h, d_k, device)
    # length by length, every implementation right after the others: a change of load between
    # two lengths affects all of them alike
    for mode in ("forward", "forward+backward"):
        for T in lengths:
            for name, (kind, make) in calls.items():
                why = _predicted_over_limit(last.get((name, mode)), T, max_seconds, max_bytes)
                if why:
                    capped.append({"name": name, "mode": mode, "T": T,
                                   "why": f"{why} on {device.type}"})
                    continue
                try:
                    fwd, fwd_bwd, inputs = make(T)
                    fn = fwd if mode == "forward" else fwd_bwd
                    first = time_call(fn, *inputs, repeats=1, warmup=0, min_time=0)  # warm-up
                    again = time_call(fn, *inputs, repeats=3 if first < 0.5 else 2, warmup=0,
                                      min_time=0.05)
                    row = {"name": name, "kind": kind, "mode": mode, "T": T,
                           "seconds": min(first, again), "peak_bytes": peak_memory(fn, *inputs)}
                except RuntimeError as e:
                    if not _is_oom(e):
                        raise
                    capped.append({"name": name, "mode": mode, "T": T, "why": _error(e)})
                    last[(name, mode)] = {"T": T, "seconds": math.inf, "peak_bytes": math.inf}
                    continue
                finally:
                    fn = fwd = fwd_bwd = inputs = None
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
                last[(name, mode)] = row
                print(f"  attention {name:34s} {mode:17s} T={T:5d} {row['seconds'] * 1e3:9.2f} ms "
                      f"{row['peak_bytes'] / 2**20:9.1f} MiB", flush=True)
    return {"settings": settings, "results": rows, "capped": capped,
            "summary": _attention_summary(rows)}


def _predicted_over_limit(last: dict | None, T: int, max_seconds: float,
                          max_bytes: float) -> str | None:
    """Why length T is skipped, or None: the last measured time or memory, scaled by
    (T / T_last)^2 (attention's cost grows with the square of the length), passes a limit."""
    if last is None:
        return None
    grow = (T / last["T"]) ** 2
    if last["seconds"] * grow > max_seconds:
        return f"predicted {last['seconds'] * grow:.1f} s per call > {max_seconds} s limit"
    if last["peak_bytes"] * grow > max_bytes:
        return (f"predicted peak {last['peak_bytes'] * grow / 2**30:.1f} GiB > "
                f"{max_bytes / 2**30:.1f} GiB limit")
    return None


def _attention_summary(rows: list[dict]) -> list[dict]:
    """book / PyTorch time and memory ratios, per pair, mode and length both measured."""
    pairs = [("book kernel", "F.scaled_dot_product_attention"),
             ("book MultiHeadAttention", "nn.MultiheadAttention"),
             ("book MultiHeadAttention, weights", "nn.MultiheadAttention, weights")]
    index = {(r["name"], r["mode"], r["T"]): r for r in rows}
    out = []
    for ours, theirs in pairs:
        for (name, mode, T), r in index.items():
            if name == ours and (theirs, mode, T) in index:
                t = index[(theirs, mode, T)]
                out.append({"book": ours, "torch": theirs, "mode": mode, "T": T,
                            "time_ratio": r["seconds"] / t["seconds"],
                            "memory_ratio": r["peak_bytes"] / max(t["peak_bytes"], 1)})
    return out


# ---------------------------------------------------------------------------------------------
# 2. Training throughput: the book's Transformer against nn.Transformer
# ---------------------------------------------------------------------------------------------

TRAIN_CONFIGS = {
    # the model of the cpu-tiny preset (chapter 9 trains it on a CPU); 2,048 target tokens
    "small": (dict(vocab_size=4000, d_model=128, h=4, d_ff=256, n_layers=2, dropout=0.1),
              dict(B=64, S=32, T=32)),
    # the paper's base model as the gpu-base preset trains it; 16,384 target tokens per batch
    "throughput": (dict(vocab_size=8000, d_model=512, h=8, d_ff=2048, n_layers=6, dropout=0.1),
                   dict(B=256, S=64, T=64)),
    "quick": (dict(vocab_size=200, d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.1),
              dict(B=4, S=8, T=8)),
}


def _train_step(model, opt, b: dict, bf16: bool, device: torch.device):
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(b["src"], b["src_mask"], b["tgt_in"], b["tgt_mask"])  # (B, T, V)
        loss = translation_loss(logits, b["tgt_out"], label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _same_loss(book, ref, b: dict) -> dict:
    """Loss of both models on ``b`` without dropout: equal weights must give equal losses."""
    book.eval(), ref.eval()
    with torch.no_grad():
        l1, l2 = (translation_loss(m(b["src"], b["src_mask"], b["tgt_in"], b["tgt_mask"]),
                                   b["tgt_out"], 0.1) for m in (book, ref))
    book.train(), ref.train()
    return {"book": l1.item(), "torch": l2.item(), "abs_diff": abs(l1.item() - l2.item())}


def bench_training_config(name: str, device: torch.device, variants: list[tuple[str, bool]],
                          rounds: int, compile_skip: str | None = None) -> dict:
    """Tokens/s of both models for each (precision, compiled) variant of TRAIN_CONFIGS[name]."""
    model_kw, shape = TRAIN_CONFIGS[name]
    cfg = TransformerConfig(**model_kw, max_len=max(shape["S"], shape["T"]))
    B, S, T = shape["B"], shape["S"], shape["T"]
    b = random_batch(B, S, T, cfg.vocab_size, device)
    book, ref = twin_models(cfg, device)
    check = _same_loss(book, ref, b)
    flops = transformer_flops(cfg, B, S, T)
    opts = {m: torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            for m, model in (("book", book), ("torch", ref))}
    models = {"book": book, "torch": ref}
    steps, meta = {}, {}
    for precision, compiled in variants:
        vname = f"{precision}, {'compiled' if compiled else 'eager'}"
        for m, model in models.items():
            key = (vname, m)
            meta[key] = {"variant": vname, "precision": precision, "compiled": compiled,
                         "model": m}
            if compiled and compile_skip:
                meta[key]["error"] = compile_skip
                continue
            fwd = model
            try:
                if compiled:
                    fwd = torch.compile(model)
                step = _train_step(fwd, opts[m], b, precision == "bf16", device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                first = _seconds(step, device)          # compiles, for a compiled model
                if compiled:
                    meta[key]["compile_s"] = round(first, 2)
                warm = min(_seconds(step, device) for _ in range(2))
                if device.type == "cuda":
                    meta[key]["peak_bytes"] = torch.cuda.max_memory_allocated(device)
            except Exception as e:  # noqa: BLE001 - a failed compile is a result, not a crash
                meta[key]["error"] = _error(e)
                print(f"  training {name}: {vname} {m}: {meta[key]['error']}", flush=True)
                continue
            meta[key]["n_per_sample"] = max(1, math.ceil(0.2 / max(warm, 1e-6))) \
                if device.type == "cuda" else 1
            steps[key] = step
    # one sample = n steps; samples of every (variant, model) interleaved round by round
    samples = {key: [] for key in steps}
    names = list(steps)
    for r in range(rounds):
        for key in (names if r % 2 == 0 else names[::-1]):
            samples[key].append(_seconds(steps[key], device, meta[key]["n_per_sample"]))
    peak, source = {}, {}
    for p in ("fp32", "bf16"):
        peak[p], source[p] = peak_flops(device, p)
    rows = []
    for key, m in meta.items():
        row = dict(m)
        if key in samples:
            st = _stats(samples[key])
            row.update(st)
            row["tokens_per_s"] = B * T / st["median_s"]
            row["flops_per_s"] = flops["training"] / st["median_s"]
            row["mfu"] = None if peak[m["precision"]] is None \
                else row["flops_per_s"] / peak[m["precision"]]
        rows.append(row)
        if "median_s" in row:
            print(f"  training {name:10s} {row['variant']:15s} {row['model']:5s} "
                  f"{row['tokens_per_s']:10,.0f} tok/s  {row['flops_per_s'] / 1e9:8.1f} GFLOP/s",
                  flush=True)
    # how much faster the book's model is: nn.Transformer time / book time (> 1: book faster)
    speedup = []
    for precision, compiled in variants:
        vname = f"{precision}, {'compiled' if compiled else 'eager'}"
        a, t = samples.get((vname, "book")), samples.get((vname, "torch"))
        if a and t:
            speedup.append({"variant": vname,
                            "book_speedup": statistics.median(t) / statistics.median(a),
                            "book_speedup_paired": statistics.median(
                                [y / x for x, y in zip(a, t)])})
    return {"config": name, "model": cfg.to_dict(), "batch": shape,
            "target_tokens_per_batch": B * T, "parameters": count_parameters(book),
            "matmul_params": matmul_params(cfg), "flops": flops,
            "peak_flops": peak, "peak_source": source, "same_loss_check": check,
            "rounds": rounds, "results": rows, "speedup": speedup}


def bench_training(device: torch.device, quick: bool = False) -> dict:
    if device.type == "cuda":
        variants = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]
    else:
        variants = [("fp32", False), ("fp32", True)]
    compile_skip = "skipped in --quick: compiling takes tens of seconds" if quick else None
    rounds = 3 if quick else 16
    configs = ["quick"] if quick else ["small"] + (["throughput"] if device.type == "cuda" else [])
    settings = {"step": "forward, label-smoothed cross-entropy (0.1), backward, Adam step "
                        "(lr 1e-4, betas (0.9, 0.98)); zero_grad(set_to_none=True)",
                "data": "random token ids, no padding (all masks True), S = T",
                "variants": [f"{p}, {'compiled' if c else 'eager'}" for p, c in variants],
                "bf16": "torch.autocast(bfloat16), CUDA only; the loss in float32",
                "compile": "torch.compile(model) (default mode, inductor); the optimizer is not "
                           "compiled; compile_s is the first step (includes compiling; inductor's "
                           "on-disk cache makes it shorter on a second run)",
                "timing": f"{rounds} rounds; every (variant, model) runs one sample per round, "
                          "in an order reversed every other round; median and min reported; "
                          "book_speedup_paired (the median of the per-round ratios) is the primary "
                          "statistic, book_speedup (ratio of the medians) a cross-check; "
                          "a CUDA sample is enough steps for ~0.2 s",
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "flops": "transformer_flops: matmuls only, training = 3 x forward; "
                         "MFU = (training FLOPs / median step time) / dense peak of the device"}
    out = {"settings": settings, "configs": []}
    if not quick:
        out["matmul_ceiling"] = matmul_rate(device, 8192 if device.type == "cuda" else 2048)
        if device.type == "cuda":
            out["matmul_ceiling_bf16"] = matmul_rate(device, 8192, torch.bfloat16)
    for name in configs:
        out["configs"].append(bench_training_config(name, device, variants, rounds, compile_skip))
    if "throughput" not in configs:
        model_kw, shape = TRAIN_CONFIGS["throughput"]
        out["throughput_config"] = {
            "status": "not measured", "model": model_kw, "batch": shape,
            "why": ("CUDA only: the paper's base model with 16,384 target tokens per batch; its "
                    "goal, >= 40% MFU in bf16 compiled, is about H100/H200 GPUs" if
                    device.type != "cuda" else "--quick"),
            "goal": ">= 40% MFU on an H100 or H200 (bf16, compiled): still to be measured"}
    return out


# ---------------------------------------------------------------------------------------------
# 3. Decoding with and without the key/value cache
# ---------------------------------------------------------------------------------------------

def bench_decoding(device: torch.device, quick: bool = False) -> dict:
    """Greedy and beam search (beam 4) of exactly ``out_len`` tokens, with and without the cache."""
    if quick:
        model_kw, B, S, out_len, rounds = dict(vocab_size=200, d_model=32, h=2, d_ff=64,
                                                n_layers=1), 2, 6, 8, 1
    else:
        model_kw, B, S, out_len, rounds = dict(vocab_size=8000, d_model=256, h=4, d_ff=1024,
                                                n_layers=3), 4, 20, 64, 3
    cfg = TransformerConfig(**model_kw, dropout=0.0, max_len=256)
    torch.manual_seed(0)
    model = Transformer(cfg).to(device).eval()
    b = random_batch(B, S, 1, cfg.vocab_size, device)
    src, src_mask = b["src"], b["src_mask"]
    beam = 4
    calls = {}
    for cached in (True, False):
        kw = dict(max_len=out_len, min_len=out_len, use_cache=cached)
        calls[("greedy", cached)] = lambda kw=kw: greedy_decode(model, src, src_mask, **kw)
        calls[("beam 4", cached)] = lambda kw=kw: beam_search(model, src, src_mask, beam_size=beam,
                                                              alpha=0.6, **kw)
    outputs = {key: fn() for key, fn in calls.items()}              # warm-up, and the outputs
    samples = interleaved(calls, device, rounds)
    rows = []
    for (method, cached), s in samples.items():
        st = _stats(s)
        rows.append({"method": method, "cached": cached, **st,
                     "sentences_per_s": B / st["median_s"],
                     "ms_per_step": 1e3 * st["median_s"] / out_len,
                     "ms_per_token": 1e3 * st["median_s"] / (B * out_len),
                     "output_lengths": sorted({len(o) for o in outputs[(method, cached)]})})
        print(f"  decoding {method:7s} {'cached' if cached else 'uncached':9s} "
              f"{rows[-1]['sentences_per_s']:8.2f} sentences/s {rows[-1]['ms_per_token']:8.3f} "
              f"ms/token", flush=True)
    speedup = [{"method": m,
                "cached_speedup": statistics.median(samples[(m, False)]) /
                statistics.median(samples[(m, True)]),
                "same_output": outputs[(m, True)] == outputs[(m, False)]}
               for m in ("greedy", "beam 4")]
    settings = {"model": cfg.to_dict(), "weights": "random (seed 0), eval mode",
                "B": B, "S": S, "out_len": out_len, "beam_size": beam, "alpha": 0.6,
                "how": f"min_len = max_len = {out_len}: EOS is banned, so every output has "
                       f"exactly {out_len} tokens; one call decodes the whole batch",
                "timing": f"{rounds} rounds after a warm-up call, interleaved; median reported",
                "ms_per_token": "median seconds / (B x out_len) (one sentence's token)",
                "ms_per_step": "median seconds / out_len (one step of the whole batch)"}
    return {"settings": settings, "parameters": count_parameters(model), "results": rows,
            "speedup": speedup}


# ---------------------------------------------------------------------------------------------
# 4. Recurrence against attention: time per training step as sequences grow
# ---------------------------------------------------------------------------------------------

def _recurrence_models(V: int, d: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=V, d_model=d, h=4, d_ff=4 * d, n_layers=2, dropout=0.1,
                            max_len=1024)
    return {"GRU": Seq2Seq(V, d, attention=False).to(device),
            "GRU + additive attention": Seq2Seq(V, d, attention=True, score="additive").to(device),
            "GRU + dot-product attention": Seq2Seq(V, d, attention=True, score="dot").to(device),
            "Transformer (2+2 layers)": Transformer(cfg).to(device)}


def bench_recurrence(device: torch.device, quick: bool = False) -> dict:
    V, d, B = (200, 32, 4) if quick else (1000, 128, 16)
    lengths = [8, 16] if quick else [8, 16, 32, 64, 128, 256]
    rounds = 1 if quick else 3
    max_seconds = 5.0
    models = _recurrence_models(V, d, device)
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}

    def make_step(name, model, b):
        def step():
            if isinstance(model, Seq2Seq):
                logits = model(b["src"], b["src_mask"], b["tgt_in"])[0]
            else:
                logits = model(b["src"], b["src_mask"], b["tgt_in"], b["tgt_mask"])
            translation_loss(logits, b["tgt_out"], label_smoothing=0.1).backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
        return step

    rows, capped, last = [], [], {}
    for L in lengths:
        b = random_batch(B, L, L, V, device, seed=L)
        steps = {}
        for name, model in models.items():
            if name in last and last[name][1] * (L / last[name][0]) ** 2 > max_seconds:
                capped.append({"name": name, "length": L,
                               "why": f"predicted > {max_seconds} s per step on {device.type}"})
                continue
            steps[name] = make_step(name, model, b)
            steps[name]()                                            # warm-up
        for name, s in interleaved(steps, device, rounds).items():
            st = _stats(s)
            last[name] = (L, st["median_s"])
            rows.append({"name": name, "length": L, **st, "tokens_per_s": B * L / st["median_s"]})
            print(f"  recurrence {name:28s} L={L:4d} {st['median_s'] * 1e3:9.1f} ms/step",
                  flush=True)
    settings = {"vocab_size": V, "d_model": d, "B": B, "lengths": lengths, "S = T": True,
                "models": {k: {"parameters": count_parameters(m)} for k, m in models.items()},
                "transformer": "h 4, d_ff 4 d_model, 2 encoder + 2 decoder layers, dropout 0.1",
                "gru": "attnbook.rnn.Seq2Seq: bidirectional GRU encoder (nn.GRU), a GRU decoder "
                       "stepped in Python one target position at a time",
                "step": "forward, label-smoothed loss, backward, Adam step",
                "timing": f"{rounds} rounds after one warm-up step, models interleaved; median",
                "limits": {"max_seconds_per_step": max_seconds}}
    return {"settings": settings, "results": rows, "capped": capped}


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
            gpu = results["cuda"]["training"]["environment"].get("gpu")
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


def load_results(root: Path | str = DEFAULT_OUT) -> dict:
    """results[kind][section] for every OUT/kind/section.json under ``root``."""
    root = Path(root)
    out = {}
    for kind in ("cpu", "cuda"):
        for section in SECTIONS:
            path = root / kind / f"{section}.json"
            if path.is_file():
                out.setdefault(kind, {})[section] = json.loads(path.read_text())
    return out


def _colours() -> dict:
    from .plotting import OKABE_ITO
    return {"book kernel": OKABE_ITO[0], "F.scaled_dot_product_attention": OKABE_ITO[1],
            "book MultiHeadAttention": OKABE_ITO[0], "nn.MultiheadAttention": OKABE_ITO[1],
            "book MultiHeadAttention, weights": OKABE_ITO[2],
            "nn.MultiheadAttention, weights": OKABE_ITO[5],
            "book": OKABE_ITO[0], "torch": OKABE_ITO[1]}


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
    from .plotting import OKABE_ITO
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
    from .plotting import OKABE_ITO
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
         "decoding": (plot_decoding, (6.4, 4)), "recurrence": (plot_recurrence, (6.4, 4))}
RUNS = {"attention": bench_attention, "training": bench_training, "decoding": bench_decoding,
        "recurrence": bench_recurrence}


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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


def environment(device: torch.device, quick: bool = False) -> dict:
    env = versions()
    env.update(device=str(device), threads=torch.get_num_threads(),
               load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               busy_processes=None if quick else busy_processes(), git_commit=_git_commit(),
               date=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()) + " UTC")
    return env


def run_section(section: str, device: torch.device, out: Path, quick: bool = False,
                note: str = "", plot: bool = True) -> dict:
    """Run one benchmark on ``device``; write out/section.json (and .png); return the result."""
    env = environment(device, quick)
    start = time.perf_counter()
    res = RUNS[section](device, quick)
    wall = time.perf_counter() - start
    env_end = {"load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "busy_processes_end": None if quick else busy_processes()}
    res = {"benchmark": section, "schema": SCHEMA, "quick": quick,
           "device": {"kind": device.type,
                      "name": env["gpu"] if device.type == "cuda" else env["cpu"],
                      "threads": torch.get_num_threads()},
           "environment": {**env, **env_end}, "command": " ".join(["python -m attnbook.benchmarks", *sys.argv[1:]]),
           "note": note, "wall_time_s": round(wall, 3), **res}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{section}.json").write_text(json.dumps(res, indent=1) + "\n")
    if plot:
        save_plot(res, out)
    return res


def save_plot(res: dict, out: Path) -> None:
    """Draw one result into out/<benchmark>.png (matplotlib's object interface: no backend)."""
    from matplotlib.figure import Figure

    from .plotting import use_book_style
    use_book_style()
    draw, size = PLOTS[res["benchmark"]]
    fig = Figure(figsize=size, layout="constrained")
    draw(res, fig)
    fig.savefig(out / f"{res['benchmark']}.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnbook.benchmarks",
                                description="The book's benchmark suite (appendix Performance).")
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds (the tests run it)")
    p.add_argument("--only", action="append", choices=SECTIONS,
                   help="run only this benchmark (may be repeated)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default results/bench, or a new temporary folder with "
                        "--quick); results go into its cpu/ and cuda/ subfolders, or into OUT "
                        "itself when OUT is named cpu or cuda")
    p.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                   help="all (default): the CPU, and CUDA when PyTorch sees a GPU")
    p.add_argument("--threads", type=int, help="CPU threads (default: PyTorch's choice)")
    p.add_argument("--note", default="", help="a remark stored in every JSON file")
    p.add_argument("--no-plots", action="store_true", help="write the JSON files only")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: redraw the PNG files from the JSON files in OUT")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    kinds = ["cpu"] if args.device == "cpu" else []
    if args.device in ("all", "cuda"):
        if torch.cuda.is_available():
            kinds.append("cuda")
        elif args.device == "cuda":
            p.error("--device cuda: PyTorch sees no CUDA GPU")
        if args.device == "all":
            kinds.insert(0, "cpu")
    if args.out is not None:
        root = args.out
    elif args.quick:            # tiny sizes: never mixed up with the results the book shows
        import tempfile
        root = Path(tempfile.mkdtemp(prefix="attnbook-bench-quick-"))
    else:
        root = DEFAULT_OUT
    saved_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        _run_all(kinds, root, args, p)
    finally:
        torch.set_num_threads(saved_threads)
    return 0


def _run_all(kinds, root, args, p) -> None:
    if args.replot:
        kinds = ["cpu", "cuda"]
    for kind in kinds:
        if root.name in ("cpu", "cuda"):
            if root.name != kind and len(kinds) > 1:
                out = root.parent / kind
            elif root.name != kind:
                p.error(f"--out {root} is named {root.name!r} but the device is {kind}")
            else:
                out = root
        else:
            out = root / kind
        for section in args.only or SECTIONS:
            if args.replot:
                if (out / f"{section}.json").is_file():
                    save_plot(json.loads((out / f"{section}.json").read_text()), out)
                    print(f"redrew {out / (section + '.png')}")
                continue
            print(f"[{kind}] {section} -> {out / (section + '.json')}", flush=True)
            res = run_section(section, torch.device(kind), out, args.quick, args.note,
                              not args.no_plots)
            print(f"[{kind}] {section}: {res['wall_time_s']} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
