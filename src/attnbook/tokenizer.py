"""A joint sentencepiece BPE tokenizer for source and target sentences.

One vocabulary serves both languages, so that words written alike in German and English ("Hund"
and "hound" aside, names, numbers, punctuation) share pieces, and the Transformer can tie its
embedding matrices (chapter 8). Four ids are reserved, the same everywhere in the book
(book/notation.md): ``PAD_ID=0 <pad>, UNK_ID=1 <unk>, BOS_ID=2 <s>, EOS_ID=3 </s>``.

    >>> tok = multi30k_tokenizer(vocab_size=8000)      # trained once, then loaded from the cache
    >>> tok.pieces("Ein kleines Mädchen klettert.")
    ['▁Ein', '▁kleines', '▁Mädchen', '▁klettert', '.']

Trained models are cached under ``$ATTNBOOK_CACHE/tokenizers``, keyed by a hash of the training
sentences and the settings, so a change of either trains a new model instead of reusing a stale one.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

from . import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from .data import cache_dir, load_multi30k

SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


class TokenizerError(ValueError):
    """Bad input to the tokenizer; the message says what was wrong and how to fix it."""


class Tokenizer:
    """Encode text to ids and decode ids to text with a trained sentencepiece model."""

    def __init__(self, model_file: str | os.PathLike):
        path = Path(model_file)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model {path} not found; train one with "
                                 "train_tokenizer(...) or multi30k_tokenizer(...)")
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.load(str(path))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path} is not a valid sentencepiece model ({e}); delete it "
                                 "and train the tokenizer again") from e
        for i, piece in SPECIAL_PIECES.items():
            if self.sp.id_to_piece(i) != piece:
                raise TokenizerError(f"{path} has {self.sp.id_to_piece(i)!r} at id {i}, not "
                                     f"{piece!r}: it was not trained with the book's special ids; "
                                     "train it with train_tokenizer(...)")
        self.model_file = path

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, bos: bool = False, eos: bool = False,
               max_len: int | None = None) -> list[int]:
        """Token ids of one sentence, optionally wrapped in BOS ... EOS.

        Raises TokenizerError for an empty sentence (also one of invisible characters only,
        such as U+200B, U+FEFF or U+200E, which the tokenizer's normalisation drops), and for a
        sentence longer than ``max_len`` ids (counting BOS and EOS): nothing is truncated silently.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        if not text.strip():
            raise TokenizerError("cannot encode an empty sentence: remove it from the data, "
                                 "or check that the source and target files are aligned")
        ids = self.sp.encode(text)
        if not ids:
            raise TokenizerError(f"cannot encode an empty sentence: {ascii(text)[:60]} holds only "
                                 "invisible characters, which the tokenizer drops; remove it "
                                 "from the data, or fill in the sentence")
        ids = [BOS_ID] * bos + ids + [EOS_ID] * eos
        if max_len is not None and len(ids) > max_len:
            raise TokenizerError(f"sentence has {len(ids)} tokens, more than max_len={max_len}: "
                                 f"{text[:60]!r}{'...' if len(text) > 60 else ''}. Raise max_len, "
                                 "or filter long sentences out explicitly before encoding")
        return ids

    def encode_batch(self, texts: Sequence[str], bos: bool = False, eos: bool = False,
                     max_len: int | None = None) -> list[list[int]]:
        """``encode`` for many sentences; the error names the index of a bad one."""
        out = []
        for i, text in enumerate(texts):
            try:
                out.append(self.encode(text, bos=bos, eos=eos, max_len=max_len))
            except TokenizerError as e:
                raise TokenizerError(f"sentence {i}: {e}") from None
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a list of ids; PAD, BOS and EOS are dropped, decoding stops at the first EOS."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of a sentence, as strings (``▁`` marks the start of a word)."""
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def vocabulary(self) -> list[tuple[str, float]]:
        """Every piece with its score, in id order: two tokenizers with the same vocabulary()
        split every text alike (their model files may differ in the settings they record)."""
        return [(self.sp.id_to_piece(i), self.sp.get_score(i)) for i in range(self.vocab_size)]


def _key(sentences: Sequence[str], settings: dict) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    h.update(repr(sorted(settings.items())).encode())
    h.update(spm.__version__.encode())
    return h.hexdigest()[:16]


def train_tokenizer(sentences: Sequence[str], vocab_size: int = 8000, name: str = "tokenizer",
                    folder: str | os.PathLike | None = None) -> Tokenizer:
    """Train a BPE sentencepiece model on ``sentences``, or load it if it was trained before.

    The model file is ``<folder>/<name>-bpe<vocab_size>-<key>.model`` where ``key`` hashes the
    sentences and settings; ``folder`` defaults to ``$ATTNBOOK_CACHE/tokenizers``.
    """
    sentences = list(sentences)
    if not sentences:
        raise TokenizerError("no sentences to train the tokenizer on")
    empty = [i for i, s in enumerate(sentences) if not s.strip()]
    if empty:
        raise TokenizerError(f"{len(empty)} empty sentence(s) in the training data (first at "
                             f"index {empty[0]}); remove them before training")
    settings = dict(model_type="bpe", vocab_size=vocab_size, character_coverage=1.0,
                    pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    folder = Path(folder) if folder is not None else cache_dir() / "tokenizers"
    path = folder / f"{name}-bpe{vocab_size}-{_key(sentences, settings)}.model"
    if path.is_file():
        return Tokenizer(path)
    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()       # written here, not under a prefix: the file then names no folder,
    with tempfile.TemporaryDirectory(dir=folder) as tmp:     # and is the same on every machine
        prefix = os.path.join(tmp, "spm")
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                           minloglevel=2, **settings)
        except RuntimeError as e:  # "INTERNAL: file(line) [check] Vocabulary size too high ..."
            reason = ". ".join(str(e).split("] ", 1)[-1].split(". ")[:2]).strip(" .")
            way = "larger" if "smaller than" in reason else "smaller"
            raise TokenizerError(f"sentencepiece could not train a {vocab_size}-piece vocabulary "
                                 f"on {len(sentences)} sentences ({reason}); try a {way} "
                                 "vocab_size") from e
        Path(prefix).write_bytes(model.getvalue())
        os.replace(prefix, path)             # atomic: a crash never leaves half a model
    return Tokenizer(path)


def multi30k_tokenizer(vocab_size: int = 8000, langs: tuple[str, str] = ("de", "en"),
                       data_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The joint tokenizer of the book: BPE trained on both sides of Multi30k's training split."""
    pairs = load_multi30k("train", src=langs[0], tgt=langs[1], data_dir=data_dir)
    sentences = [s for pair in pairs for s in pair]
    return train_tokenizer(sentences, vocab_size=vocab_size,
                           name=f"multi30k-{langs[0]}{langs[1]}")
