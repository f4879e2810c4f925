"""Measuring translations with BLEU (Papineni et al., 2002) as sacreBLEU computes it (Post, 2018).

BLEU compares each hypothesis with its reference by counting shared n-grams (n = 1..4), combines
the four precisions by a geometric mean and penalises outputs shorter than the references. We
always report it the way sacreBLEU recommends: detokenised, cased text, its default 13a
tokenisation, and the *signature* that says exactly how the number was computed.

Translations come from :func:`attnbook.decoding.translate`; ``python -m attnbook evaluate``
scores a trained run with these functions.
"""
from __future__ import annotations

from sacrebleu.metrics import BLEU

from .decoding import translate


def bleu(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU of detokenised hypotheses against one reference each, with its signature."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    metric = BLEU()
    score = metric.corpus_score(hypotheses, [references])
    return {"bleu": round(score.score, 2), "signature": str(metric.get_signature()),
            "precisions": [round(p, 1) for p in score.precisions], "bp": round(score.bp, 3)}


def bleu_score(model, tokenizer, pairs: list[tuple[str, str]], beam_size: int = 4,
               alpha: float = 0.6, device=None) -> dict:
    """Translate the sources of ``pairs`` and score them against the targets."""
    hyps = translate(model, tokenizer, [s for s, _ in pairs], beam_size, alpha, device=device)
    result = bleu(hyps, [t for _, t in pairs])
    result["hypotheses"] = hyps
    return result


def bleu_by_length(hypotheses: list[str], pairs: list[tuple[str, str]],
                   edges=(0, 8, 11, 14, 17, 20, 100)) -> list[dict]:
    """BLEU of groups of sentences by source length in words: [lo, hi) for consecutive edges."""
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        idx = [i for i, (s, _) in enumerate(pairs) if lo <= len(s.split()) < hi]
        if idx:
            r = bleu([hypotheses[i] for i in idx], [pairs[i][1] for i in idx])
            rows.append({"min_words": lo, "max_words": hi - 1, "n": len(idx), "bleu": r["bleu"]})
    return rows
