"""Measuring translations with BLEU (Papineni et al., 2002) as sacreBLEU computes it (Post, 2018).

BLEU compares each hypothesis with its reference by counting shared n-grams (n = 1..4), combines
the four precisions by a geometric mean and penalises outputs shorter than the references. We
always report it the way sacreBLEU recommends: detokenised, cased text, its default 13a
tokenisation, and the *signature* that says exactly how the number was computed.
"""
from __future__ import annotations

import torch
from sacrebleu.metrics import BLEU

from .batching import pad
from .decoding import beam_search, greedy_decode


@torch.no_grad()
def translate(model, tokenizer, sentences: list[str], beam_size: int = 4, alpha: float = 0.6,
              batch_size: int = 64, device=None, max_extra: int = 50) -> list[str]:
    """Translate a list of sentences; the order of the output matches the input.

    Sentences are decoded in batches of similar length; each may produce up to its source
    length + ``max_extra`` tokens. beam_size = 1 is greedy search.
    """
    device = device or next(model.parameters()).device
    model.eval()
    ids = tokenizer.encode_batch(sentences)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src, mask = pad([ids[i] for i in idx])
        src, mask = src.to(device), mask.to(device)
        max_len = src.shape[1] + max_extra
        if beam_size == 1:
            hyps = greedy_decode(model, src, mask, max_len=max_len)
        else:
            hyps = beam_search(model, src, mask, beam_size=beam_size, max_len=max_len, alpha=alpha)
        for i, h in zip(idx, hyps):
            out[i] = tokenizer.decode(h)
    return out


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
