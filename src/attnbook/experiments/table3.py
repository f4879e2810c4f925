"""The paper's Table 3 in miniature, as the book reads it: the variants of the ``cpu-tiny``
Transformer, the paper's numbers for the corresponding rows, and the reading of a result
(``results/cpu/ablations.json``): each variant's change from the base, whether its seeds lie
outside the base's, and the Markdown table chapters 5, 7 and 9 and the ablations appendix show.

The runs themselves are made by ``python -m attnbook ablations`` (``attnbook.experiments.ablations``).
"""
from __future__ import annotations

from .. import tables

# Each variant: (Table 3's row, what changes, the overrides of cpu-tiny's Transformer, by field
# name: recipe.override). results/cpu/ablations.json records them as they are written here.
VARIANTS = {
    "base": ("base", "cpu-tiny's Transformer: h = 4 (d_k = 32), dropout 0, label smoothing 0.1, "
             "sinusoidal positions", {}),
    "heads-1": ("A", "1 head, d_k = 128", dict(h=1)),
    "heads-8": ("A", "8 heads, d_k = 16", dict(h=8)),
    "heads-16": ("A", "16 heads, d_k = 8", dict(h=16)),
    "d-k-16": ("B", "d_k = 16 instead of 32 (4 heads; values keep 32)", dict(d_k=16)),
    "d-k-8": ("B", "d_k = 8 instead of 32 (4 heads; values keep 32)", dict(d_k=8)),
    "layers-1": ("C", "1 + 1 layers instead of 2 + 2", dict(n_layers=1)),
    "d-ff-512": ("C", "feed-forward width 512 instead of 256", dict(d_ff=512)),
    "dropout-0.1": ("D", "dropout 0.1", dict(dropout=0.1)),
    "no-label-smoothing": ("D", "label smoothing 0", dict(label_smoothing=0.0)),
    "label-smoothing-0.2": ("D", "label smoothing 0.2", dict(label_smoothing=0.2)),
    "learned-positions": ("E", "learned positional embeddings instead of sinusoids",
                          dict(positional="learned")),
    "learned-positions-large": ("E", "the same, the table started at the sinusoids' scale "
                                "(std 1/sqrt(2) instead of 0.02)",
                                dict(positional="learned", learned_std=2 ** -0.5)),
}
# The variants results/cpu/ablations.json holds (the default); the others are there to be run
# (the appendix's homework): a run of cpu-tiny took 3.3 minutes at 2 threads on a quiet 2-core
# machine (results/cpu/cpu_tiny_transformer_2threads.json).
MEASURED = ("base", "heads-1", "heads-8", "d-k-16", "d-k-8", "layers-1", "d-ff-512", "dropout-0.1",
            "no-label-smoothing", "learned-positions", "learned-positions-large")


# Vaswani et al. (2017), Table 3 (newstest2013, the development set): for each variant, the
# paper's corresponding change, and (BLEU, perplexity) of the changed model and of the model it
# is compared with. Rows correspond by what they do: "8 heads" doubles our 4 as the paper's 16
# doubles its 8; the paper's base has dropout and ours has none, so its dropout row is read the
# other way round (its base against its row without dropout).
PAPER_BASE = (25.8, 4.92)
PAPER = {
    "heads-1": ("h = 1 (d_k = 512)", (24.9, 5.29), PAPER_BASE),
    "heads-8": ("h = 16 (d_k = 32), twice the base's heads", (25.8, 4.91), PAPER_BASE),
    "heads-16": ("h = 32 (d_k = 16), four times", (25.4, 5.01), PAPER_BASE),
    "d-k-16": ("d_k = 32 instead of 64, half the base's", (25.4, 5.01), PAPER_BASE),
    "d-k-8": ("d_k = 16 instead of 64, a quarter", (25.1, 5.16), PAPER_BASE),
    "layers-1": ("N = 2 instead of 6", (23.7, 6.11), PAPER_BASE),
    "d-ff-512": ("d_ff = 4096, twice the base's", (26.2, 4.75), PAPER_BASE),
    "dropout-0.1": ("dropout 0.1 (its base) against 0.0", PAPER_BASE, (24.6, 5.77)),
    "no-label-smoothing": ("label smoothing 0", (25.3, 4.67), PAPER_BASE),
    "label-smoothing-0.2": ("label smoothing 0.2", (25.7, 5.47), PAPER_BASE),
    "learned-positions": ("learned positional embedding", (25.7, 4.92), PAPER_BASE),
    "learned-positions-large": ("learned positional embedding", (25.7, 4.92), PAPER_BASE),
}


def change(res: dict, name: str, key: str) -> float:
    """Mean of ``key`` ("test_bleu" or "val_perplexity") over the variant's seeds, minus the
    base's mean."""
    v = {x["variant"]: x for x in res["variants"]}
    return v[name][key]["mean"] - v["base"][key]["mean"]


def markdown_table(res: dict, names=None) -> str:
    """The variants ``names`` (default: all) of ``res`` as a Markdown table (attnbook.tables):
    each variant with the paper's row, its change, test BLEU and validation perplexity, mean ±
    std (min–max) over the seeds, the change from the base, and the paper's change for the
    corresponding row (BLEU, perplexity)."""
    spread = lambda s: f"{s['mean']:.2f} ± {s['std']:.2f} ({s['min']:.2f}–{s['max']:.2f})"  # noqa: E731
    rows = []
    for v in res["variants"]:
        name = v["variant"]
        if names is not None and name not in names:
            continue
        ours = ("", "") if name == "base" else (f"{change(res, name, 'test_bleu'):+.2f}",
                                                f"{change(res, name, 'val_perplexity'):+.2f}")
        what, (b1, p1), (b0, p0) = PAPER.get(name, ("", (0, 0), (0, 0)))
        theirs = f"{b1 - b0:+.1f}, {p1 - p0:+.2f}" if what else ""
        rows.append([name if v["row"] == name else f"{name} ({v['row']})", v["change"], spread(v["test_bleu"]), ours[0],
                     spread(v["val_perplexity"]), ours[1], theirs])
    return tables.markdown_table(["variant (row)", "change", "test BLEU", "ΔBLEU",
                                  "validation perplexity", "Δppl", "the paper: ΔBLEU, Δppl"],
                                 rows, align="llrrrrr")


def outside_base_range(res: dict, name: str, key: str) -> bool:
    """Whether all of the variant's seeds lie on one side of all of the base's seeds: a change
    that three seeds of each can tell apart from chance."""
    v = {x["variant"]: x for x in res["variants"]}
    a, b = v[name][key], v["base"][key]
    return a["min"] > b["max"] or a["max"] < b["min"]
