"""Translate sentences with a trained run: one sentence per line on stdin, translations on stdout.

    echo "Ein Hund rennt durch den Schnee." | python -m attnbook.translate runs/cpu-tiny
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .decoding import MAX_SOURCE_TOKENS, translate
from .runs import load_run
from .utils import get_device


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnbook.translate", description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="run folder (with checkpoint.pt and tokenizer.model)")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's; 1 = greedy)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    if args.beam is not None and args.beam < 1:
        p.error(f"--beam must be at least 1, got {args.beam}")
    try:
        model, tok, cfg = load_run(args.run, get_device(args.device))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = [line.rstrip("\n") for line in sys.stdin]
    if not lines:
        print("error: no input; give one sentence per line on standard input", file=sys.stderr)
        return 2
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        print(f"error: input line(s) {empty[:5]} are empty; give one sentence per line",
              file=sys.stderr)
        return 2
    long = [i + 1 for i, line in enumerate(lines) if len(tok.encode(line)) > MAX_SOURCE_TOKENS]
    if long:
        print(f"error: input line(s) {long[:5]} have more than {MAX_SOURCE_TOKENS} tokens; the "
              "model was trained on single captions: split long text into sentences",
              file=sys.stderr)
        return 2
    beam = args.beam or cfg.beam_size
    for hyp in translate(model, tok, lines, beam_size=beam, alpha=cfg.length_alpha):
        print(hyp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
