"""BLEU of a trained run, on a Multi30k split or on any aligned test set (the command line).

The metric is :mod:`attnbook.bleu` (sacreBLEU, with its signature), the translations come from
:func:`attnbook.decoding.translate`; both are imported here too, so that
``from attnbook.commands.evaluate import bleu, translate`` keeps working.

    python -m attnbook evaluate runs/cpu-tiny                        # BLEU on test_2016_flickr
    python -m attnbook evaluate --stored cpu-base                    # a model the package stores
    python -m attnbook evaluate runs/cpu-tiny --split val --beam 1   # greedy, on the validation set
    python -m attnbook evaluate runs/cpu-tiny --src my.de.gz --ref my.en.gz --save hyps.txt

``--src``/``--ref`` evaluate on any test set: two aligned files, plain UTF-8 text or gzip
(``.gz``), one sentence per line, the source in the run's source language. A file that is
missing, empty, not UTF-8 or not valid gzip, files of different lengths, an empty line (or a
source line of invisible characters only, such as U+200B), a source sentence too long for the
model, or a run folder that is missing or damaged is a one-line error that names it and its line
(exit status 2): nothing is dropped or cut.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from pathlib import Path

from ..bleu import bleu, bleu_by_length, bleu_score  # noqa: F401 (re-exported)
from ..cli import Parser, UsageError, fail
from ..training.options import add_common, add_model, apply_common, load_model
from ..data import SPLITS, DataError, load_multi30k
from ..decoding import MAX_SOURCE_TOKENS, translate  # noqa: F401 (re-exported)
from ..training.runs import RunError


def _lines(numbers: list[int]) -> str:
    """'line 3', or 'lines 3, 7, 9' (at most five numbers, then how many more)."""
    shown = ", ".join(str(n) for n in numbers[:5])
    more = f" and {len(numbers) - 5} more" if len(numbers) > 5 else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


def read_sentences(path: str | Path, option: str = "file") -> list[str]:
    """The lines of a UTF-8 text file (gzip if its name ends in .gz), one sentence per line.

    A final newline ends the last line; it is not an empty line. Windows line ends (CR LF) and a
    byte-order mark are line ends and encoding, not text, and are removed. Raises ValueError, with a
    one-line message naming ``option`` and ``path`` and the fix, for a missing file, a file that
    is not valid gzip or not UTF-8, an empty file and an empty or whitespace-only line.
    """
    where, path = f"{option} {path}", Path(path)
    if not path.exists():
        raise ValueError(f"{where} not found: check the path")
    if path.is_dir():
        raise ValueError(f"{where} is a folder: give a file with one sentence per line")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{where} cannot be read ({e.strerror or e}): check its permissions")
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{where} is not valid gzip ({' '.join(str(e).split())}): give a "
                             "gzip file, or plain text without the .gz suffix") from None
    elif data[:2] == b"\x1f\x8b":
        raise ValueError(f"{where} looks gzip-compressed but its name does not end in .gz: "
                         "rename it to end in .gz, or decompress it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{where} is not UTF-8 text (byte {e.start}, line {line}): convert it "
                         "to UTF-8, e.g. with iconv -t UTF-8") from None
    text = text.removeprefix("\ufeff")               # a byte-order mark is not part of line 1
    if not text:
        raise ValueError(f"{where} is empty: give one sentence per line")
    lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise ValueError(f"{where}: {_lines(empty)} {'is' if len(empty) == 1 else 'are'} "
                         f"empty or whitespace-only: remove {'it' if len(empty) == 1 else 'them'} "
                         "from both files (keeping them aligned), or fill in the sentence")
    return lines


def read_test_set(src: str | Path, ref: str | Path) -> list[tuple[str, str]]:
    """(source, reference) pairs from two aligned files; ValueError says what is wrong."""
    sources, references = read_sentences(src, "--src"), read_sentences(ref, "--ref")
    if len(sources) != len(references):
        raise ValueError(f"--src {src} has {len(sources)} lines but --ref {ref} has "
                         f"{len(references)}: the files must be aligned, one reference line per "
                         "source line")
    return list(zip(sources, references))


def invisible(tokenizer, sentences: list[str]) -> list[int]:
    """1-based numbers of the sentences the tokenizer reads as empty: invisible characters only
    (such as U+200B, U+FEFF, U+200E), which its normalisation drops."""
    return [i + 1 for i, s in enumerate(sentences) if not tokenizer.pieces(s)]


def too_long(tokenizer, sentences: list[str], max_tokens: int = MAX_SOURCE_TOKENS) -> list[int]:
    """1-based numbers of the sentences of more than ``max_tokens`` tokens (as translate counts)."""
    return [i + 1 for i, s in enumerate(sentences) if len(tokenizer.encode(s)) > max_tokens]


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook evaluate",
               description="BLEU (sacreBLEU) of a trained run on a Multi30k split "
                           "or on a test set of your own (--src and --ref).")
    add_model(p)
    p.add_argument("--split", choices=[s for s in SPLITS if s != "train"], default=None,
                   help="Multi30k split (default: test_2016_flickr)")
    p.add_argument("--src", help="source sentences, one per line (UTF-8, or gzip if .gz)")
    p.add_argument("--ref", help="reference translations, aligned with --src")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's; 1 = greedy)")
    p.add_argument("--sentences", type=int, default=0, help="only the first N sentences (0 = all)")
    add_common(p, "average", "device", "threads", "data-dir")
    p.add_argument("--save", type=Path, help="also write the translations to this file, one per line")
    args = p.parse_args(argv)
    if args.beam is not None and args.beam < 1:
        p.error(f"--beam must be at least 1, got {args.beam}")
    if args.sentences < 0:
        p.error(f"--sentences must be 0 (all) or positive, got {args.sentences}")
    own = args.src is not None or args.ref is not None
    if own and (args.src is None or args.ref is None):
        given, missing = ("--src", "--ref") if args.src is not None else ("--ref", "--src")
        return fail(f"{given} needs {missing}: give both --src FILE and --ref FILE "
                    "(or neither, for a Multi30k --split)")
    if own and args.split is not None:
        return fail(f"--split {args.split} cannot be combined with --src/--ref: give either a "
                    "Multi30k --split or your own --src and --ref files")
    if own:
        try:
            pairs = read_test_set(args.src, args.ref)
        except ValueError as e:
            return fail(e)
        name, lines_of = f"{args.src} -> {args.ref}", f"--src {args.src}"
    try:
        model, tok, cfg = load_model(args, apply_common(args))
        if not own:
            args.split = args.split or "test_2016_flickr"
            pairs = load_multi30k(args.split, cfg.src_lang, cfg.tgt_lang, args.data_dir)
            name, lines_of = args.split, f"--split {args.split}"
    except (UsageError, RunError, DataError) as e:
        return fail(e)
    total = len(pairs)
    pairs = pairs[:args.sentences] if args.sentences else pairs
    blank = invisible(tok, [s for s, _ in pairs])
    if blank:
        one = len(blank) == 1
        return fail(f"{lines_of}: {_lines(blank)} {'holds' if one else 'hold'} only invisible "
                    "characters (such as U+200B, U+FEFF, U+200E), which the tokenizer drops: "
                    f"remove {'it' if one else 'them'} from both files (keeping them aligned), "
                    "or fill in the sentence")
    long = too_long(tok, [s for s, _ in pairs])
    if long:
        return fail(f"{lines_of}: {_lines(long)} {'has' if len(long) == 1 else 'have'} "
                    f"more than {MAX_SOURCE_TOKENS} tokens; the model was trained on single "
                    "captions: split long text into sentences, or leave those lines out of "
                    "both files")
    beam = args.beam or cfg.beam_size
    try:
        result = bleu_score(model, tok, pairs, beam_size=beam, alpha=cfg.length_alpha)
    except ValueError as e:             # the tokenizer's "sentence i: ..." counts from 0
        m = re.match(r"sentence (\d+): (.*)", str(e), re.S)
        return fail(f"{lines_of}: line {int(m[1]) + 1}: {m[2]}" if m else e)
    if args.save:
        try:
            args.save.write_text("\n".join(result["hypotheses"]) + "\n", encoding="utf-8")
        except OSError as e:
            return fail(f"--save {args.save} cannot be written ({e.strerror or e}): check that "
                        "its folder exists and is writable")
    print(json.dumps({"run": str(args.run), "split": None if own else args.split,
                      "test_set": f"{name} ({len(pairs)} of {total} sentences)",
                      "sentences": len(pairs),
                      "decoding": f"beam {beam}, alpha {cfg.length_alpha}",
                      "bleu": result["bleu"], "signature": result["signature"]},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
