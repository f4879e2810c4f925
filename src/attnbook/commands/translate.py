"""Translate sentences with a trained run: one sentence per line on stdin, translations on stdout.

    echo "Ein Hund rennt durch den Schnee." | python -m attnbook translate runs/cpu-tiny
    echo "Ein Hund rennt durch den Schnee." | python -m attnbook translate --stored cpu-base

Standard input is read as UTF-8 (a byte-order mark and Windows line ends are dropped). A missing
or damaged run folder, an empty input, input that is not UTF-8, an empty line (or one of
invisible characters only, such as U+200B) and a line too long for the model are one-line errors
that name the input line (exit status 2): nothing is dropped or cut.
"""
from __future__ import annotations

import sys

from ..cli import Parser, UsageError, fail
from ..training.options import add_common, add_model, apply_common, load_model
from ..decoding import MAX_SOURCE_TOKENS, translate
from ..training.runs import RunError
from ..tokenizer import TokenizerError


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook translate", description=__doc__.split("\n")[0])
    add_model(p)
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's; 1 = greedy)")
    add_common(p, "average", "device", "threads")
    args = p.parse_args(argv)
    try:
        if args.beam is not None and args.beam < 1:
            raise UsageError(f"--beam must be at least 1, got {args.beam}")
        model, tok, cfg = load_model(args, apply_common(args))
    except (UsageError, RunError) as e:
        return fail(e)
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")     # a byte-order mark is no text
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return fail(f"input line {line} is not UTF-8 text; convert the input to UTF-8, e.g. with "
                    "iconv -t UTF-8")
    lines = text.removesuffix("\n").split("\n") if text else []
    lines = [line.removesuffix("\r") for line in lines]     # Windows line ends
    if not lines:
        return fail("no input; give one sentence per line on standard input")
    empty, long = [], []
    for n, line in enumerate(lines, 1):      # n: the line number of the input
        try:
            if len(tok.encode(line)) > MAX_SOURCE_TOKENS:
                long.append(n)
        except TokenizerError:                # empty, or only invisible characters (U+200B...)
            empty.append(n)
    if empty:
        return fail(f"input line(s) {empty[:5]} are empty or hold only invisible characters "
                    "(such as U+200B); give one sentence per line")
    if long:
        return fail(f"input line(s) {long[:5]} have more than {MAX_SOURCE_TOKENS} tokens; the "
                    "model was trained on single captions: split long text into sentences")
    beam = args.beam or cfg.beam_size
    for hyp in translate(model, tok, lines, beam_size=beam, alpha=cfg.length_alpha):
        print(hyp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
