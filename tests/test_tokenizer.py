"""The joint BPE tokenizer: special ids, round trips, caching and bad input."""
import os

import pytest
import sentencepiece as spm

from attnbook import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnbook.tokenizer import Tokenizer, TokenizerError, multi30k_tokenizer, train_tokenizer

SENTENCES = [f"{a} {b} {c}." for a in ("Ein Hund", "Eine Katze", "A dog", "A cat", "Zwei Kinder")
             for b in ("läuft", "springt", "runs", "jumps", "spielt")
             for c in ("im Park", "on the grass", "am Strand", "in the snow")]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(SENTENCES, vocab_size=120, name="toy",
                           folder=tmp_path_factory.mktemp("tok"))


def test_special_ids_are_the_books(tok):
    assert [tok.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == \
        ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.vocab_size == 120


def test_round_trip_and_bos_eos(tok):
    ids = tok.encode("Ein Hund springt am Strand.", bos=True, eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and PAD_ID not in ids
    assert tok.decode(ids) == "Ein Hund springt am Strand."
    assert tok.decode(ids + [PAD_ID, PAD_ID]) == "Ein Hund springt am Strand."
    assert tok.decode([BOS_ID, *tok.encode("A cat."), EOS_ID, *tok.encode("junk")]) == "A cat."


def test_unknown_characters_map_to_unk(tok):
    assert UNK_ID in tok.encode("€€€")


def test_pieces_mark_word_starts(tok):
    pieces = tok.pieces("A dog runs.")
    assert pieces[0].startswith("▁") and "".join(pieces).replace("▁", " ").strip() == "A dog runs."


def test_empty_and_overlong_sentences_are_errors(tok):
    with pytest.raises(TokenizerError, match="empty sentence"):
        tok.encode("   ")
    n = len(tok.encode("Zwei Kinder spielen im Park.", bos=True, eos=True))
    with pytest.raises(TokenizerError, match=f"has {n} tokens, more than max_len={n - 1}"):
        tok.encode("Zwei Kinder spielen im Park.", bos=True, eos=True, max_len=n - 1)
    with pytest.raises(TokenizerError, match="sentence 1: cannot encode an empty"):
        tok.encode_batch(["A dog.", ""])
    with pytest.raises(TokenizerError, match="expects a str"):
        tok.encode(["A", "dog"])


def test_decode_rejects_ids_outside_the_vocabulary(tok):
    with pytest.raises(TokenizerError, match=r"outside the vocabulary \[0, 120\)"):
        tok.decode([5, 120])


def test_cache_reuses_the_model_and_retrains_when_data_change(tmp_path):
    a = train_tokenizer(SENTENCES, vocab_size=100, folder=tmp_path)
    mtime = os.path.getmtime(a.model_file)
    b = train_tokenizer(SENTENCES, vocab_size=100, folder=tmp_path)
    assert b.model_file == a.model_file and os.path.getmtime(b.model_file) == mtime
    c = train_tokenizer(SENTENCES[:-1], vocab_size=100, folder=tmp_path)
    d = train_tokenizer(SENTENCES, vocab_size=110, folder=tmp_path)
    assert len({a.model_file, c.model_file, d.model_file}) == 3


def test_training_is_deterministic(tmp_path):
    a = train_tokenizer(SENTENCES, vocab_size=100, folder=tmp_path / "a")
    b = train_tokenizer(SENTENCES, vocab_size=100, folder=tmp_path / "b")
    assert [a.id_to_piece(i) for i in range(100)] == [b.id_to_piece(i) for i in range(100)]
    assert a.vocabulary() == b.vocabulary() and len(a.vocabulary()) == 100
    # the same file, byte for byte, naming no folder of the machine that trained it
    assert a.model_file.read_bytes() == b.model_file.read_bytes()
    assert str(tmp_path).encode() not in a.model_file.read_bytes()


def test_bad_training_input(tmp_path):
    with pytest.raises(TokenizerError, match="no sentences"):
        train_tokenizer([], folder=tmp_path)
    with pytest.raises(TokenizerError, match="empty sentence"):
        train_tokenizer(["a b", " "], folder=tmp_path)
    with pytest.raises(TokenizerError, match="smaller vocab_size"):
        train_tokenizer(["a b c"], vocab_size=5000, folder=tmp_path)


def test_missing_corrupt_and_foreign_models(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer(tmp_path / "nope.model")
    (tmp_path / "bad.model").write_bytes(b"garbage")
    with pytest.raises(TokenizerError, match="not a valid sentencepiece model"):
        Tokenizer(tmp_path / "bad.model")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_prefix=str(tmp_path / "x"),
                                   vocab_size=40, minloglevel=2)  # default ids: unk=0, bos=1, eos=2
    with pytest.raises(TokenizerError, match="special ids"):
        Tokenizer(tmp_path / "x.model")


@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")
def test_multi30k_tokenizer_splits_german_and_english():
    tok = multi30k_tokenizer(vocab_size=8000)
    assert tok.vocab_size == 8000
    for s in ("Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
              "A little girl climbing into a wooden playhouse."):
        ids = tok.encode(s)
        assert UNK_ID not in ids and tok.decode(ids) == s
        assert len(ids) < len(s.split()) * 2


@pytest.mark.parametrize("invisible", ["\u200b", "\ufeff", "\u200e", " \u200b\ufeff "])
def test_a_sentence_of_invisible_characters_is_empty(tok, invisible):
    # sentencepiece's normalisation drops these characters: no ids, so an error as for ""
    with pytest.raises(TokenizerError, match="empty sentence: .* holds only invisible characters"):
        tok.encode(invisible)
    with pytest.raises(TokenizerError, match="^sentence 2: cannot encode an empty sentence"):
        tok.encode_batch(["A dog.", "A cat.", invisible])
    assert tok.encode("A dog.\u200b") == tok.encode("A dog.")


def test_a_vocabulary_too_small_or_too_large_says_which(tmp_path):
    with pytest.raises(TokenizerError, match=r"smaller than required_chars.*try a larger vocab_size"):
        train_tokenizer(SENTENCES, vocab_size=8, folder=tmp_path)
    with pytest.raises(TokenizerError, match=r"too high.*try a smaller vocab_size"):
        train_tokenizer(SENTENCES, vocab_size=5000, folder=tmp_path)
