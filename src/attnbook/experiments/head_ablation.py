"""Do the heads that look interesting matter? Ablating the attention heads of a trained
translator one at a time (the book's attention page, "What the weights do not tell you").

    python -m attnbook head_ablation --run runs/cpu-base/medium --average 5 --out results/cpu/head_ablation.json

A head is *ablated* by zeroing its output before the output projection W_o mixes the heads:
a forward pre-hook on ``W_o`` sets the slice ``[..., i*d_v:(i+1)*d_v]`` of its input, head i's
output, to 0. That is the same as zeroing columns ``i*d_v .. (i+1)*d_v - 1`` of W_o's weight,
and it leaves the other heads, the residual connection and every other layer as they were. The
hook is removed afterwards, whatever happens.

For the intact model, then for each head of each attention module (encoder self-attention,
decoder self-attention, cross-attention; every layer) ablated alone, then for all heads of
one kind (all layers) at once, the command measures

* the validation loss: per-token cross-entropy, teacher-forced, no label smoothing, on all of
  Multi30k's validation set (as ``train.validation_loss``), with the standard error of its
  change over the sentences (the changes of the same sentences, paired);
* validation BLEU of greedy decoding on every ``--every``-th validation sentence (numbers
  0, every, 2 every, ...; sacreBLEU, as ``bleu.bleu``).

From the intact model's weights on the same validation sentences it records, per head, what a
heatmap shows: the mean entropy of its rows (nats; 0 is one-hot, ln n uniform over n keys),
its mean largest weight, the mean weight near the diagonal (keys within one position of
t (S - 1) / (T - 1) for query t of T and S keys: for self-attention the query's own position
and its neighbours, for cross-attention the monotone alignment) and the mean weight on the
first key (the sink: ``<s>`` in the decoder, the first piece in the encoder). Averages are over
real query positions, padding excluded.

Writes ``OUT`` (JSON in :mod:`attnbook.store`'s format: its provenance record has the command,
git commit, hardware, threads, versions, wall and processor time; no absolute paths) and, with ``--figure``, a scatter plot of each head's loss increase against its
entropy (SVG).
"""
from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from .. import __version__
from .. import store
from ..batching import TranslationBatches, translation_loss
from ..bleu import bleu
from ..data import load_multi30k
from ..decoding import translate
from ..mha import MultiHeadAttention, recording, scaling_heads
from ..plotting import OKABE_ITO, use_book_style
from ..training.recipe import forward_logits
from ..training.runs import RunError, load_run

# id: (name, module name pattern; the layer number goes in the braces), as on the attention page
KINDS = {"enc": ("encoder self-attention", "encoder.{}.self_attn"),
         "dec": ("decoder self-attention", "decoder.{}.self_attn"),
         "cross": ("cross-attention", "decoder.{}.cross_attn")}
EVERY = 2       # BLEU on validation sentences 0, 2, 4, ...
STATS = ("entropy", "max_weight", "diagonal", "first_key")


@contextmanager
def ablate(mha: MultiHeadAttention, heads):
    """Inside the ``with`` block, heads ``heads`` (numbers 0 .. h-1) of ``mha`` output zeros
    (``mha.scaling_heads`` with a factor of 0 for each of them), also after an exception."""
    heads = list(heads)
    bad = [i for i in heads if type(i) is not int or not 0 <= i < mha.h]
    if bad:
        raise ValueError(f"no head {bad[0]!r}: this attention has h = {mha.h} heads, numbered "
                         f"0 to {mha.h - 1}")
    scale = torch.ones(mha.h)
    scale[heads] = 0.0
    with scaling_heads(mha, scale):
        yield mha


def attention_modules(model) -> dict:
    """{(kind, layer): MultiHeadAttention} of an encoder-decoder Transformer, in KINDS order."""
    named = dict(model.named_modules())
    return {(kind, layer): named[pattern.format(layer)]
            for kind, (_, pattern) in KINDS.items() for layer in range(len(model.decoder))}


@torch.no_grad()
def sentence_losses(model, batches: TranslationBatches, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy (no label smoothing) and target tokens of every validation
    sentence, in the order of ``batches.src``: two (N,) tensors. Their ratio of sums is
    ``train.validation_loss``."""
    model.eval()
    N = len(batches.src)
    loss, tokens = torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    for batch in batches:
        b = batch.to(device)
        logits = forward_logits(model, b)                                     # (B, T, V)
        n = b.tgt_mask.sum(1)                                                 # (B,) real tokens
        for i, j in enumerate(batch.index.tolist()):                          # one sentence each
            loss[j] = translation_loss(logits[i:i + 1], b.tgt_out[i:i + 1]).item() * n[i].item()
            tokens[j] = n[i].item()
    return loss, tokens


@torch.no_grad()
def greedy_bleu(model, tok, pairs: list, device, batch_size: int = 128) -> float:
    """BLEU of the greedy translations (``decoding.translate`` with beam 1: sources sorted by
    length into batches, each up to its source length + 50 tokens) of ``pairs``."""
    hyps = translate(model, tok, [s for s, _ in pairs], beam_size=1, batch_size=batch_size,
                     device=device)
    return bleu(hyps, [t for _, t in pairs])["bleu"]


@torch.no_grad()
def heatmap_stats(model, batches: TranslationBatches, device) -> dict:
    """{(kind, layer): {stat: [one number per head]}} of the intact model's attention on all
    ``batches`` (STATS; see the module's docstring), averaged over real query positions."""
    mods = attention_modules(model)
    sums = {key: torch.zeros(len(STATS), m.h, dtype=torch.float64) for key, m in mods.items()}
    rows = {key: 0 for key in mods}
    model.eval()
    with recording(mods):
        for batch in batches:
            b = batch.to(device)
            forward_logits(model, b)
            for (kind, layer), m in mods.items():
                w = m.last[0].double()                                        # (B, h, T, S)
                q_mask = b.src_mask if kind == "enc" else b.tgt_mask          # (B, T)
                k_mask = b.tgt_mask if kind == "dec" else b.src_mask          # (B, S)
                T, S = w.shape[-2:]
                tq = q_mask.sum(1).double()[:, None, None]                    # (B, 1, 1)
                sk = k_mask.sum(1).double()[:, None, None]
                t = torch.arange(T, device=w.device, dtype=w.dtype)[None, :, None]  # (1, T, 1)
                j = torch.arange(S, device=w.device, dtype=w.dtype)[None, None, :]  # (1, 1, S)
                near = ((j - t * (sk - 1) / (tq - 1).clamp(min=1)).abs() <= 1) & k_mask[:, None, :]
                per_row = torch.stack([
                    -torch.special.xlogy(w, w).sum(-1),                       # entropy
                    w.max(-1).values,                                         # largest weight
                    (w * near[:, None]).sum(-1),                              # near the diagonal
                    w[..., 0],                                                # the first key
                ])                                                            # (4, B, h, T)
                real = q_mask[:, None, :].to(w.dtype)                         # (B, 1, T)
                sums[kind, layer] += (per_row * real).sum((1, 3)).cpu()
                rows[kind, layer] += int(q_mask.sum())
    return {key: {s: [round(float(v), 4) for v in sums[key][i] / rows[key]]
                  for i, s in enumerate(STATS)} for key in mods}


def measure(model, tok, val: TranslationBatches, device, mods: dict,
            heads: dict, base: tuple | None = None, bleu_pairs=None) -> tuple[dict, tuple]:
    """Loss (and BLEU on ``bleu_pairs``) with ``heads`` ({(kind, layer): [head, ...]}) ablated;
    with ``base`` = the intact (losses, tokens), also the change and its standard error.
    Returns (result, (per-sentence losses, tokens))."""
    with ExitStack() as stack:
        for key, hs in heads.items():
            stack.enter_context(ablate(mods[key], hs))
        loss, tokens = sentence_losses(model, val, device)
        score = None if bleu_pairs is None else greedy_bleu(model, tok, bleu_pairs, device)
    out = {"val_loss": round(float(loss.sum() / tokens.sum()), 4)}
    if base is not None:
        d = loss - base[0]                                   # (N,): each sentence's change
        delta = d.sum() / tokens.sum()                       # per token: a ratio of sums
        # its standard error over the N sentences (the delta method for a ratio of means)
        se = (d - delta * tokens).std() * math.sqrt(len(d)) / tokens.sum()
        out["delta_loss"], out["delta_loss_se"] = round(float(delta), 4), round(float(se), 4)
    if score is not None:
        out["val_bleu"] = score
    return out, (loss, tokens)


def ablation_study(run: Path, average: int = 1, every: int = EVERY, data_dir=None,
                   device="cpu", progress=lambda line: print(line, flush=True)) -> dict:
    """Every head ablated alone, then every kind; the heads' heatmap statistics. See the
    module's docstring; ``every`` = 0 skips BLEU."""
    model, tok, cfg = load_run(run, device, average=average)
    if cfg.model != "transformer":
        raise RunError(f"{run} holds a {cfg.model} model; head ablation needs the "
                       "encoder-decoder Transformer: give a run trained with --model transformer")
    pairs = load_multi30k("val", cfg.src_lang, cfg.tgt_lang, data_dir)
    val = TranslationBatches(tok.encode_batch([s for s, _ in pairs]),
                             tok.encode_batch([t for _, t in pairs]), cfg.max_tokens,
                             shuffle=False)
    bleu_pairs = pairs[::every] if every else None
    mods = attention_modules(model)
    intact, base_loss = measure(model, tok, val, device, mods, {}, None, bleu_pairs)
    progress(f"intact: {intact}")
    stats = heatmap_stats(model, val, device)
    heads = []
    for (kind, layer), m in mods.items():
        for head in range(m.h):
            r = measure(model, tok, val, device, mods, {(kind, layer): [head]},
                        base_loss, bleu_pairs)[0]
            r = {"kind": kind, "layer": layer + 1, "head": head + 1, **r,
                 **{s: stats[kind, layer][s][head] for s in STATS}}
            if "val_bleu" in r:
                r["delta_bleu"] = round(r["val_bleu"] - intact["val_bleu"], 2)
            progress(f"{kind} layer {layer + 1} head {head + 1}: {r['delta_loss']:+.4f}")
            heads.append(r)
    kinds = []
    for kind in KINDS:
        r = measure(model, tok, val, device, mods,
                    {key: range(m.h) for key, m in mods.items() if key[0] == kind},
                    base_loss, bleu_pairs)[0]
        if "val_bleu" in r:
            r["delta_bleu"] = round(r["val_bleu"] - intact["val_bleu"], 2)
        progress(f"all {kind}: {r['delta_loss']:+.4f}")
        kinds.append({"kind": kind, **r})
    return {
        "run": run.as_posix(),
        "weights_of": "the last checkpoint" if average == 1 else
                      f"the mean of the last {average} snapshots (checkpoint averaging)",
        "layers": cfg.arch.n_layers, "heads_per_layer": cfg.arch.h,
        "d_k": cfg.arch.d_model // cfg.arch.h,
        "kinds": {k: {"name": name, "module": pattern.format("L")}
                  for k, (name, pattern) in KINDS.items()},
        "ablation": "the head's output set to zero before W_o (a forward pre-hook on W_o); "
                    "every other head, the residual connections and the feed-forward layers "
                    "unchanged; layers and heads numbered from 1",
        "loss": f"per-token cross-entropy in nats, teacher forced, no label smoothing, on all "
                f"{len(pairs)} sentences of Multi30k val ({cfg.src_lang}->{cfg.tgt_lang}); "
                "delta_loss_se: the standard error of the change over the sentences (paired)",
        "bleu": None if not every else
                f"sacreBLEU of greedy decoding (at most source length + 50 tokens) on validation "
                f"sentences 0, {every}, {2 * every}, ... ({len(bleu_pairs)} sentences: one in "
                f"every {every}, fixed in advance)",
        "statistics": "of the intact model on the same validation sentences, per head, mean "
                      "over real query positions: entropy of the row (nats), largest weight, "
                      "weight on keys within 1 of the diagonal t (S-1)/(T-1), weight on the "
                      "first key",
        "intact": intact, "per_head": heads, "per_kind": kinds, "attnbook": __version__,
    }


def figure(result: dict, path: Path) -> Path:
    """Each head's loss increase when ablated (with its standard error) against the mean
    entropy of its attention rows; one colour and marker per kind, the layer written beside
    each head. A reproducible SVG (fixed ids, no date); pyplot's state is left alone."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    with mpl.rc_context():
        use_book_style()
        mpl.rcParams.update({"svg.hashsalt": "attnbook", "svg.fonttype": "none"})
        fig = Figure(figsize=(7.2, 4.6))
        ax = fig.subplots()
        markers = {"enc": "o", "dec": "s", "cross": "^"}
        for colour, kind in zip(OKABE_ITO, KINDS):
            rs = [r for r in result["per_head"] if r["kind"] == kind]
            ax.errorbar([r["entropy"] for r in rs], [r["delta_loss"] for r in rs],
                        yerr=[r["delta_loss_se"] for r in rs], fmt=markers[kind], color=colour,
                        ms=7, capsize=2, label=KINDS[kind][0])
            for r in rs:
                ax.annotate(str(r["layer"]), (r["entropy"], r["delta_loss"]), xytext=(5, -3),
                            textcoords="offset points", fontsize=8, color="#333333")
        ax.axhline(0, color="#555555", lw=0.8)
        ax.set_xlabel("mean entropy of the head's attention rows (nats; low = a sharp heatmap)")
        ax.set_ylabel("validation loss increase (nats)")
        ax.set_title(f"One head ablated at a time: {result['run']} (digits: its layer)")
        ax.legend(loc="upper right")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="svg", metadata={"Date": None, **store.figure_metadata(result)})
    return path
