"""The model benchmarks of the suite (``python -m attnbook benchmarks``): training, decoding and
recurrence, and what they need (FLOPs and peak FLOP/s, ``nn.Transformer`` with the book's weights).

* ``bench_training``: tokens/s of a full training step of the book's Transformer and of
  ``nn.Transformer`` with the same configuration and weights; eager and ``torch.compile``; fp32,
  and bf16 autocast on a GPU; the model-FLOPs utilisation where the device's peak is known;
* ``bench_decoding``: greedy and beam search with and without the key/value cache;
* ``bench_recurrence``: time per training step of the GRU encoder-decoders and the Transformer
  as the sequence length grows.

``transformer_flops`` counts FLOPs as the docstring of ``attnbook.benchmarks`` says.
"""
from __future__ import annotations

import math
import statistics

import torch

from .. import BOS_ID
from ..bench import time_call
from .attention import _error, _seconds, _stats, interleaved
from ..decoding import beam_search, greedy_decode
from ..batching import Batch, translation_loss
from ..rnn import Seq2Seq
from ..torch_twins import TorchTransformer
from ..transformer import Transformer, TransformerConfig
from ..utils import count_parameters


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
# Batches, and the book's Transformer beside nn.Transformer (attnbook.torch_twins) with its weights
# ---------------------------------------------------------------------------------------------

def random_batch(B: int, S: int, T: int, V: int, device="cpu", seed: int = 0) -> Batch:
    """A translation Batch of random sentences without padding: src (B, S), tgt_in = BOS +
    tgt_out[:, :-1] (B, T), tgt_out (B, T), and all-True masks (book convention)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt_out = torch.randint(4, V, (B, T), generator=g)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt_out[:, :-1]], dim=1)
    return Batch(src, torch.ones(B, S, dtype=torch.bool), tgt_in, tgt_out,
                 torch.ones(B, T, dtype=torch.bool), torch.arange(B)).to(device)


def twin_models(cfg: TransformerConfig, device="cpu", seed: int = 0):
    """The book's Transformer and a TorchTransformer holding a copy of its weights."""
    torch.manual_seed(seed)
    book = Transformer(cfg)
    ref = TorchTransformer(cfg).load_from_book(book)
    return book.to(device), ref.to(device)


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
            logits = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)  # (B, T, V)
        loss = translation_loss(logits, b.tgt_out, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _same_loss(book, ref, b: dict) -> dict:
    """Loss of both models on ``b`` without dropout: equal weights must give equal losses."""
    book.eval(), ref.eval()
    with torch.no_grad():
        l1, l2 = (translation_loss(m(b.src, b.src_mask, b.tgt_in, b.tgt_mask),
                                   b.tgt_out, 0.1) for m in (book, ref))
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


def bench_training(device: torch.device, quick: bool = False, short: bool = False) -> dict:
    """Training throughput and MFU (module docstring). ``short`` is the GPU call's budget
    (``attnbook.experiments.gpu_run``): on a GPU only the paper's base model, in fp32 eager, bf16 eager and
    bf16 compiled (both models: the GPU goal compares them compiled), 6 rounds."""
    if device.type == "cuda":
        variants = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]
        if short:
            variants = [("fp32", False), ("bf16", False), ("bf16", True)]
    else:
        variants = [("fp32", False), ("fp32", True)]
    compile_skip = "skipped in --quick: compiling takes tens of seconds" if quick else None
    rounds = 3 if quick else 6 if short else 16
    configs = ["quick"] if quick else ["small"] + (["throughput"] if device.type == "cuda" else [])
    if short and device.type == "cuda":
        configs = ["throughput"]
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
            "goal": ">= 40% MFU on an H100 or H200 (bf16, compiled): a GPU's, not this device's"}
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
    src, src_mask = b.src, b.src_mask
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
    if device.type == "cuda" and not quick:   # a GPU runs the Transformer far longer in a second
        lengths += [512, 1024]
    rounds = 1 if quick else 3
    max_seconds = 5.0
    models = _recurrence_models(V, d, device)
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}

    def make_step(name, model, b):
        def step():
            logits = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)  # any model
            translation_loss(logits, b.tgt_out, label_smoothing=0.1).backward()
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
