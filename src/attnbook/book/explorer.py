"""The data of the book's attention explorers (book/explorer.md, book/explorer_bahdanau.md).

Every attention weight of a trained translator on a fixed set of test sentences, for two kinds
of model: the encoder-decoder Transformer (book/explorer.md) and Part I's GRU encoder-decoder
with attention, whose one attention is Bahdanau's alignment (book/explorer_bahdanau.md; models
``gru-additive`` and ``gru-dot``).

    python -m attnbook explorer --stored cpu-base --bleu --out book/_static/explorer/attention.json
    python -m attnbook explorer --stored gru-additive --bleu --out book/_static/explorer/bahdanau.json

``--stored NAME`` reads a model stored in the package (``attnbook.training.runs.load_stored``),
so both pages regenerate from the repository alone; a run folder (``RUN``, with ``--average K``
for the mean of its last K snapshots) reads a run of your own.

The sentences are every 50th of Multi30k's ``test_2016_flickr`` (numbers 0, 50, ..., 950: twenty,
none skipped). Each is translated by beam search (beam 4, the run's length penalty): the search
and settings of :func:`attnbook.decoding.translate`, keeping the ids it chose. Then the model
reads the source and its own translation once more, teacher-forced, recording its weights
(``record``): in the Transformer every :class:`~attnbook.mha.MultiHeadAttention`; in the GRU
its decoder's attention, which ``Seq2Seq.forward_with_attention`` returns. That pass
computes what the search computed when it chose each token: the same tokens, the same keys and
values (the same states, for the GRU). One sentence at a time, so there is no padding.

Written, deterministic (the same run gives the same bytes) and free of absolute paths:

* ``OUT`` (JSON): ``meta`` (run, configuration, test BLEU, rule, decoding, version), ``kinds``
  (Transformer: ``enc``, ``dec``, ``cross``; GRU: ``cross`` only; each says which pieces label
  the rows, the queries, and the columns, the keys), ``layers``, ``heads`` (both 1 for the GRU)
  and, per sentence, its text and pieces (``src``; ``tgt``, the decoder's input
  ``<s> y_1 ... y_n``; ``next``, what each decoder position predicts, ``y_1 ... y_n </s>``) and
  ``weights[kind][layer][head]``, a (queries, keys) list of rows rounded to 3 decimals; each
  row sums to 1 up to the rounding.
* ``OUT`` with the suffix ``.js``: the same data as ``window.ATTNBOOK_<NAME> = {...};``, NAME
  the file's name in capitals (``attention.json``: ``ATTNBOOK_ATTENTION``). The page loads that
  with a ``<script>`` tag, which also works when the book is opened from disk (``file://``),
  where browsers refuse to fetch a JSON file.
* ``OUT`` with the suffix ``.svg``: the cross-attention of the first sentence, last layer, mean
  of the heads, the figure the page shows to readers without JavaScript.

Nothing in the package imports this module.
"""
from __future__ import annotations

import json
import math
import re
from html import escape
from pathlib import Path

import torch

from .. import BOS_ID, EOS_ID, __version__
from ..batching import pad
from ..bleu import bleu_score
from ..data import load_multi30k
from ..decoding import beam_search
from ..mha import attention_modules, recording
from ..rnn import Seq2Seq
from ..training.runs import STORED_MODELS, RunError, load_run, load_stored
from ..utils import arithmetic

SPLIT, EVERY, COUNT, BEAM = "test_2016_flickr", 50, 20, 4
# id: (name, module name pattern, row labels, column labels). Rows are the queries and columns
# the keys; the rows of the decoder's attention are its positions, labelled in cross-attention by
# the piece each predicts ("next"), in self-attention by its input ("tgt"), as its columns are.
KINDS = {
    "enc": ("encoder self-attention", "encoder.{}.self_attn", "src", "src"),
    "dec": ("decoder self-attention", "decoder.{}.self_attn", "tgt", "tgt"),
    "cross": ("cross-attention", "decoder.{}.cross_attn", "next", "src"),
}
# The GRU encoder-decoders with attention (rnn.Seq2Seq) have one attention, from the decoder's
# state to the encoder's states: one layer, one head. Its name is the score's.
GRU_KINDS = {"cross": ("{} attention", "decoder.attention", "next", "src")}
GRU_MODELS = ("gru-additive", "gru-dot")
# viridis (matplotlib's, at 0, 1/8, ..., 1): colour-blind safe, light where the weight is high.
# explorer.js interpolates the same table.
VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962",
           "#addc30", "#fde725"]
CONFIG_KEYS = ("preset", "model", "d_model", "h", "n_layers", "d_ff", "dropout", "norm_first",
               "vocab_size", "max_tokens", "max_steps", "warmup", "peak_lr", "label_smoothing",
               "seed", "length_alpha")
GRU_CONFIG_KEYS = ("preset", "model", "d_model", "vocab_size", "max_tokens", "max_steps",
                   "warmup", "peak_lr", "label_smoothing", "seed", "length_alpha")


def choose(pairs: list, every: int = EVERY, count: int = COUNT) -> list[int]:
    """The numbers of the sentences shown: 0, every, 2 every, ... (``count`` of them)."""
    picks = list(range(0, len(pairs), every))[:count]
    if len(picks) < count:
        raise ValueError(f"{len(pairs)} sentences hold only {len(picks)} at a step of {every}; "
                         "ask for fewer (--count) or a smaller step (--every)")
    return picks


def _rows(w: torch.Tensor) -> list:
    """A (queries, keys) tensor as lists of numbers rounded to 3 decimals (0 and 1 as ints)."""
    return [[int(r) if r in (0.0, 1.0) else r for r in (round(v, 3) for v in row)]
            for row in w.double().tolist()]


@torch.no_grad()
def record(model, src: list[int], hyp: list[int]) -> dict:
    """The attention weights of one teacher-forced pass over (source ids, output ids):
    {kind: [layer][head] rows}; queries and keys as in KINDS, or GRU_KINDS for a GRU
    (one sentence: no padding)."""
    device = next(model.parameters()).device
    s = torch.tensor([src], device=device)                               # (1, S)
    t = torch.tensor([[BOS_ID, *hyp]], device=device)                    # (1, n + 1)
    if isinstance(model, Seq2Seq):
        _, w = model.forward_with_attention(s, torch.ones_like(s, dtype=torch.bool),
                                            t)                           # w: (1, n + 1, S)
        return {"cross": [[_rows(w[0].float().cpu())]]}                  # one layer, one head
    with recording(attention_modules(model)) as mods:
        model(s, torch.ones_like(s, dtype=torch.bool), t, torch.ones_like(t, dtype=torch.bool))
        out = {}
        for kind, (_, pattern, _, _) in KINDS.items():
            layers = []
            for i in range(len(model.encoder if kind == "enc" else model.decoder)):
                w = mods[pattern.format(i)].last[0][0].float().cpu()       # (h, T, S)
                layers.append([_rows(head) for head in w])
            out[kind] = layers
        return out


def build(model, tok, cfg, pairs: list, picks: list[int], beam_size: int = BEAM) -> list[dict]:
    """One entry per picked sentence: its text, pieces, translation and attention weights."""
    model.eval()
    device = next(model.parameters()).device
    srcs = tok.encode_batch([pairs[i][0] for i in picks])
    ids, mask = pad(srcs)
    hyps = beam_search(model, ids.to(device), mask.to(device), beam_size=beam_size,
                       max_len=mask.sum(dim=1).to(device) + 50, alpha=cfg.length_alpha)
    piece = tok.id_to_piece
    out = []
    for i, src, hyp in zip(picks, srcs, hyps):
        out.append({
            "index": i, "source": pairs[i][0], "reference": pairs[i][1],
            "translation": tok.decode(hyp),
            "src": [piece(x) for x in src],
            "tgt": [piece(x) for x in [BOS_ID, *hyp]],
            "next": [piece(x) for x in [*hyp, EOS_ID]],
            "weights": record(model, src, hyp),
        })
    return out


def run_name(run: Path) -> str:
    """The run folder as given, relative to here; an absolute path outside: its last two parts."""
    if not run.is_absolute():
        return run.as_posix()
    try:
        return run.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return Path(*run.parts[-2:]).as_posix()


def run_bleu(model, tok, cfg, pairs: list, metrics: dict, average: int, measure: bool):
    """(test BLEU of the weights shown, where it comes from): measured on all ``pairs`` with the
    explorer's decoding if ``measure``, as ``python -m attnbook evaluate`` does; else the run's
    metrics.json's, which scored the last checkpoint (a leaderboard run's has none)."""
    if measure:
        result = bleu_score(model, tok, pairs, beam_size=BEAM, alpha=cfg.length_alpha)
        return result["bleu"], (f"measured by this command on all {len(pairs)} sentences of "
                                f"{SPLIT}, decoded as the sentences shown; sacreBLEU "
                                f"{result['signature']}")
    if average == 1 and metrics.get("test_bleu") is not None:
        return metrics["test_bleu"], "the run's metrics.json"
    return None, "not measured (--bleu measures it)"


def explore(run: Path | None, every: int = EVERY, count: int = COUNT, data_dir=None,
            device="cpu", average: int = 1, measure_bleu: bool = False,
            stored: str | None = None) -> dict:
    """The explorer's data for run folder ``run`` or for the model the package stores under the
    name ``stored`` (see the module's docstring); ``average``: the weights are the mean of the
    run's last ``average`` snapshots (``runs.load_run``); ``measure_bleu``: measure the test BLEU
    of those weights instead of reading the run's."""
    if (run is None) == (stored is None):
        raise ValueError("give a run folder or --stored NAME, not both")
    if stored is not None:
        if average != 1:
            raise ValueError(f"--average {average}: a stored model is already one set of weights "
                             f"({STORED_MODELS.get(stored, ('',))[0] or stored})")
        model, tok, cfg = load_stored(stored, device)
    else:
        model, tok, cfg = load_run(run, device, average=average)
    gru = cfg.model in GRU_MODELS
    if cfg.model != "transformer" and not gru:
        raise RunError(f"{run} holds a {cfg.model} model; the explorer reads the attention of "
                       "the encoder-decoder Transformer and of the GRUs with attention: give a "
                       "run trained with --model transformer, gru-additive or gru-dot")
    pairs = load_multi30k(SPLIT, cfg.src_lang, cfg.tgt_lang, data_dir)
    picks = choose(pairs, every, count)
    metrics = {}
    if run is not None and (run / "metrics.json").is_file():
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    bleu, bleu_of = run_bleu(model, tok, cfg, pairs, metrics, average, measure_bleu)
    meta = {
        "run": run_name(run) if run is not None else f"stored model {stored}",
        "config": {k: getattr(cfg.arch if hasattr(cfg.arch, k) else cfg, k)
                   for k in (GRU_CONFIG_KEYS if gru else CONFIG_KEYS)},
        "steps": metrics.get("steps", cfg.max_steps if stored is not None else None),
        "val_loss": None if "val_loss" not in metrics or average > 1
                    else round(metrics["val_loss"], 4),
        "test_bleu": bleu,
        "test_bleu_of": bleu_of,
        "weights_of": STORED_MODELS[stored][0] if stored is not None else
                      "the last checkpoint" if average == 1 else
                      f"the mean of the last {average} snapshots (checkpoint averaging)",
        "sentences": f"one in every {every} sentences of Multi30k {SPLIT} ({cfg.src_lang}->"
                     f"{cfg.tgt_lang}), numbers 0, {every}, ..., {picks[-1]}: {count} sentences, "
                     "none skipped",
        "decoding": f"beam search, beam {BEAM}, length penalty alpha {cfg.length_alpha}, at "
                    "most source length + 50 tokens; the weights come from one teacher-forced "
                    "pass over the source and that translation",
        "weights": "rows are queries and columns keys, real tokens only (no padding), rounded "
                   "to 3 decimals: each row sums to 1 up to the rounding",
        "attnbook": __version__,
        "made_with": arithmetic(),     # where these bytes regenerate exactly (attnbook.reproduce)
    }
    if gru:
        kinds = {k: {"name": name.format(model.score), "module": module, "rows": rows,
                     "columns": cols} for k, (name, module, rows, cols) in GRU_KINDS.items()}
        layers, heads = 1, 1
    else:
        kinds = {k: {"name": name, "module": pattern.format("L"), "rows": rows, "columns": cols}
                 for k, (name, pattern, rows, cols) in KINDS.items()}
        layers, heads = cfg.arch.n_layers, cfg.arch.h
    return {"meta": meta, "kinds": kinds, "layers": layers, "heads": heads,
            "sentences": build(model, tok, cfg, pairs, picks)}


def colour(w: float) -> str:
    """The viridis colour of a weight in [0, 1], interpolated linearly in VIRIDIS."""
    x = min(max(w, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(x), len(VIRIDIS) - 2)
    a, b, f = VIRIDIS[i], VIRIDIS[i + 1], x - i
    # as explorer.js computes it (Math.round rounds halves up), so the two agree to the digit
    mix = [math.floor(int(a[j:j + 2], 16) * (1 - f) + int(b[j:j + 2], 16) * f + 0.5)
           for j in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def svg_figure(data: dict, sentence: int = 0) -> str:
    """The cross-attention of one sentence, last layer, mean of the heads, as an SVG heatmap
    (rows: the predicted target pieces, columns: the source pieces)."""
    s = data["sentences"][sentence]
    heads = s["weights"]["cross"][-1]
    rows, cols = s["next"], s["src"]
    mean = [[sum(h[t][j] for h in heads) / len(heads) for j in range(len(cols))]
            for t in range(len(rows))]
    cell, left, top = 22, 8 + 7 * max(map(len, rows)), 12 + 6 * max(map(len, cols))
    width = max(left + cell * j + cell // 2 + 10 + 4 * len(p) for j, p in enumerate(cols))
    width, height = max(width, left + cell * len(cols) + 10), top + cell * len(rows) + 10
    font = 'font-family="sans-serif" font-size="12" fill="#222"'
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>']
    for j, p in enumerate(cols):
        x = left + cell * j + cell / 2 + 4
        parts.append(f'<text {font} transform="translate({x:g},{top - 6}) rotate(-60)">'
                     f'{escape(p)}</text>')
    for t, p in enumerate(rows):
        y = top + cell * t + cell / 2 + 4
        parts.append(f'<text {font} x="{left - 6}" y="{y:g}" text-anchor="end">{escape(p)}</text>')
        for j in range(len(cols)):
            parts.append(f'<rect x="{left + cell * j}" y="{top + cell * t}" width="{cell}" '
                         f'height="{cell}" fill="{colour(mean[t][j])}"/>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def js_variable(out: Path) -> str:
    """The global that OUT's .js twin sets: attention.json -> ATTNBOOK_ATTENTION (the page names
    it in the explorer's data-source)."""
    return "ATTNBOOK_" + re.sub(r"[^A-Z0-9]", "_", out.stem.upper())


def write(data: dict, out: Path) -> list[Path]:
    """Write the JSON, its .js twin and the static SVG (OUT with .js, .svg); returns their paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    js, svg = out.with_suffix(".js"), out.with_suffix(".svg")
    out.write_text(text + "\n", encoding="utf-8")
    js.write_text("// Written by `python -m attnbook explorer`; the same data as "
                  f"{out.name}.\nwindow.{js_variable(out)} = {text};\n", encoding="utf-8")
    svg.write_text(svg_figure(data), encoding="utf-8")
    return [out, js, svg]
