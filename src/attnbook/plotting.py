"""The book's plotting style and the figures more than one chapter draws.

Colours come from the Okabe-Ito palette, readable with every common colour-vision deficiency;
heatmaps use the perceptually uniform, colour-blind-safe ``viridis`` (``cividis`` for signed data).
"""
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

# Okabe & Ito (2008), "Color Universal Design": black omitted, it is kept for text.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442"]
SEQUENTIAL_CMAP = "viridis"
DIVERGING_CMAP = "cividis"
# The widest figure, in inches at the style's 100 dpi. The book's text column is about 740 px
# wide at a 1280-px window, so a figure is shrunk by 740 / (100 * width): at 10.8 in, the
# 10-pt tick labels still show at 9.5 px. Panels side by side share this width (or stack).
# tests/test_notebook_hygiene.py fails on a committed figure wider than this.
PAGE_WIDTH = 10.8


def use_book_style() -> None:
    """Apply the book's figure style: readable fonts, a grid, colour-blind-safe colours."""
    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 4.0),
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "axes.prop_cycle": mpl.cycler(color=OKABE_ITO),
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "legend.frameon": False,
            "image.cmap": SEQUENTIAL_CMAP,
            "font.size": 10,
        }
    )


def attention_heatmap(weights, queries=None, keys=None, ax=None, title="Attention weights",
                      xlabel="key position (source)", ylabel="query position (target)",
                      colorbar=True):
    """Draw an attention matrix: one row per query, one column per key.

    weights: array-like of shape (T, S); row t holds how much query t attends to each key.
    queries, keys: optional token labels for the rows (T) and the columns (S).
    Returns the matplotlib Axes.
    """
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap expects a 2-D (T, S) matrix, got shape {w.shape}")
    if queries is not None and len(queries) != w.shape[0]:
        raise ValueError(f"{len(queries)} query labels for {w.shape[0]} rows")
    if keys is not None and len(keys) != w.shape[1]:
        raise ValueError(f"{len(keys)} key labels for {w.shape[1]} columns")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.35 * w.shape[1] + 2.5, 0.35 * w.shape[0] + 1.5))
    im = ax.imshow(w, cmap=SEQUENTIAL_CMAP, vmin=0.0, vmax=max(1e-9, float(w.max())), aspect="auto")
    ax.grid(False)
    if keys is not None:
        ax.set_xticks(range(len(keys)), [str(k) for k in keys], rotation=90)
    if queries is not None:
        ax.set_yticks(range(len(queries)), [str(q) for q in queries])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def _metric_styles(metrics, **overrides) -> tuple[dict, dict]:
    """The names and line styles of the accuracy curves ("exact": solid, "token": dashed) that
    the accuracy plots draw; an unknown metric is a ValueError."""
    for m in metrics:
        if m not in ("exact", "token"):
            raise ValueError(f"unknown metric {m!r}; use 'exact' and/or 'token'")
    names = {"exact": "exact match", "token": "per-token"}
    styles = {"exact": dict(linestyle="-", marker="o"),
              "token": dict(linestyle="--", marker="s", markersize=4)}
    return names, {m: {**style, **overrides} for m, style in styles.items()}


def _accuracy_axes(ax, lengths, title, legend_loc="best"):
    """The accuracy plots' axes: a tick at every length (up to 12), labels, limits, title, legend."""
    lengths = sorted(lengths)
    if len(lengths) <= 12:
        ax.set_xticks(lengths)
    ax.set_xlabel("input length (symbols)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(title)
    ax.legend(loc=legend_loc)
    return ax


def plot_accuracy_by_length(results, ax=None, title="Accuracy against input length",
                            metrics=("exact", "token")):
    """Accuracy of one or more models against the input length (chapters 1 and 2).

    results: a dict {model label: accuracy dict}, each accuracy dict as returned by
    ``attnbook.toy.accuracy_by_length`` (keys "length", "exact", "token").
    metrics: which curves to draw: "exact" (exact match, solid line) and/or "token" (per-token
    accuracy, dashed line). Each model keeps one colour for both of its curves.
    Returns the matplotlib Axes.
    """
    names, styles = _metric_styles(metrics)
    if ax is None:
        _, ax = plt.subplots()
    for k, (label, res) in enumerate(results.items()):
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        for m in metrics:
            ax.plot(res["length"], res[m], color=colour, label=f"{label}: {names[m]}", **styles[m])
    return _accuracy_axes(ax, {L for res in results.values() for L in res["length"]}, title)


def plot_accuracy_spread(results, ax=None, title="Accuracy against input length, several seeds",
                         metrics=("exact",), legend_loc="best"):
    """Accuracy against input length for several seeds of each model: a band from the lowest to
    the highest seed at each length, and each seed's own curve as a thin line.

    results: a dict {model label: list of accuracy dicts, one per seed}, each with the keys of
    ``attnbook.toy.accuracy_by_length`` ("length", "exact", "token"), as the runs of
    ``python -m attnbook toy_seeds`` have them. metrics: "exact" (solid) and/or "token" (dashed).
    Each model keeps one colour (in the order of ``plot_accuracy_by_length``). ``legend_loc``:
    where the legend goes, matplotlib's ``loc`` ("lower left", or (x, y) of its lower left corner
    in axes coordinates). Returns the Axes.
    """
    names, styles = _metric_styles(metrics, markersize=3)
    if ax is None:
        _, ax = plt.subplots()
    for k, (label, runs) in enumerate(results.items()):
        if not runs:
            raise ValueError(f"no runs for {label!r}")
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        lengths = runs[0]["length"]
        for m in metrics:
            columns = list(zip(*(r[m] for r in runs)))                 # one tuple per length
            ax.fill_between(lengths, [min(c) for c in columns], [max(c) for c in columns],
                            color=colour, alpha=0.2, linewidth=0)
            for i, r in enumerate(runs):
                ax.plot(lengths, r[m], color=colour, linewidth=1, alpha=0.9, **styles[m],
                        label=f"{label}: {names[m]}, {len(runs)} seeds" if i == 0 else None)
    return _accuracy_axes(ax, {L for runs in results.values() for r in runs for L in r["length"]},
                          title, legend_loc)


MODEL_LABELS = {"gru": "GRU, no attention", "gru-additive": "GRU + additive attention",
                "gru-dot": "GRU + dot-product attention", "transformer": "Transformer",
                "decoder-only": "decoder-only Transformer", "conv": "ConvS2S (convolutions)",
                "gru-additive-wide": "GRU + additive, wide"}


def plot_bleu_by_length(entries, ax=None, title="BLEU against source length"):
    """BLEU of each model on groups of test sentences by source length (chapter 9).

    entries: a list of dicts with "model" (a key of ``MODEL_LABELS`` or any label) and
    "bleu_by_length" (rows as returned by ``attnbook.bleu.bleu_by_length``). The x axis marks
    each group by its range of source words; the number of sentences is in the tick label.
    Returns the matplotlib Axes.
    """
    if ax is None:
        _, ax = plt.subplots()
    rows = entries[0]["bleu_by_length"]
    ticks = [f"{r['min_words']}-{r['max_words']}\n(n={r['n']})" if r["max_words"] < 99 else
             f"{r['min_words']}+\n(n={r['n']})" for r in rows]
    markers = "osD^vPX"
    for k, e in enumerate(entries):
        bleus = [r["bleu"] for r in e["bleu_by_length"]]
        ax.plot(range(len(bleus)), bleus, marker=markers[k % len(markers)],
                color=OKABE_ITO[k % len(OKABE_ITO)], label=MODEL_LABELS.get(e["model"], e["model"]))
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel("BLEU")
    ax.set_title(title)
    ax.legend()
    return ax
