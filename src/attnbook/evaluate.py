"""Measuring translations with BLEU (Papineni et al., 2002) as sacreBLEU computes it (Post, 2018).

BLEU compares each hypothesis with its reference by counting shared n-grams (n = 1..4), combines
the four precisions by a geometric mean and penalises outputs shorter than the references. We
always report it the way sacreBLEU recommends: detokenised, cased text, its default 13a
tokenisation, and the *signature* that says exactly how the number was computed.

    python -m attnbook.evaluate runs/cpu-tiny                        # BLEU on test_2016_flickr
    python -m attnbook.evaluate runs/cpu-tiny --split val --beam 1   # greedy, on the validation set
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from .batching import pad
from .decoding import beam_search, greedy_decode


MAX_SOURCE_TOKENS = 256  # longer inputs are refused, never cut: Multi30k's longest has ~80


@torch.no_grad()
def translate(model, tokenizer, sentences: list[str], beam_size: int = 4, alpha: float = 0.6,
              batch_size: int = 64, device=None, max_extra: int = 50,
              max_source_tokens: int = MAX_SOURCE_TOKENS) -> list[str]:
    """Translate a list of sentences; the order of the output matches the input.

    Sentences are decoded in batches of similar length; each may produce up to its source
    length + ``max_extra`` tokens. beam_size = 1 is greedy search. An empty sentence, or one of
    more than ``max_source_tokens`` tokens, is an error that names it (nothing is truncated).
    """
    device = device or next(model.parameters()).device
    model.eval()
    ids = tokenizer.encode_batch(sentences, max_len=max_source_tokens)
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


def main(argv: list[str] | None = None) -> int:
    from .data import SPLITS, DataError, load_multi30k
    from .translate import load_run

    p = argparse.ArgumentParser(prog="python -m attnbook.evaluate",
                                description="BLEU (sacreBLEU) of a trained run on a Multi30k split.")
    p.add_argument("run", type=Path, help="run folder (with checkpoint.pt and tokenizer.model)")
    p.add_argument("--split", choices=[s for s in SPLITS if s != "train"], default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's; 1 = greedy)")
    p.add_argument("--sentences", type=int, default=0, help="only the first N sentences (0 = all)")
    p.add_argument("--data-dir", help="folder with the Multi30k files (default: $MULTI30K_DIR or the cache)")
    p.add_argument("--device", default=None)
    p.add_argument("--save", type=Path, help="also write the translations to this file, one per line")
    args = p.parse_args(argv)
    if args.beam is not None and args.beam < 1:
        p.error(f"--beam must be at least 1, got {args.beam}")
    if args.sentences < 0:
        p.error(f"--sentences must be 0 (all) or positive, got {args.sentences}")
    from .utils import get_device
    try:
        model, tok, cfg = load_run(args.run, get_device(args.device))
        pairs = load_multi30k(args.split, cfg.src_lang, cfg.tgt_lang, args.data_dir)
    except (FileNotFoundError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pairs = pairs[:args.sentences] if args.sentences else pairs
    beam = args.beam or cfg.beam_size
    result = bleu_score(model, tok, pairs, beam_size=beam, alpha=cfg.length_alpha)
    if args.save:
        args.save.write_text("\n".join(result["hypotheses"]) + "\n")
    print(json.dumps({"run": str(args.run), "split": args.split, "sentences": len(pairs),
                      "decoding": f"beam {beam}, alpha {cfg.length_alpha}",
                      "bleu": result["bleu"], "signature": result["signature"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
