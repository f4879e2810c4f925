"""BLEU as sacreBLEU computes it, overall and by source length."""
import pytest

from attnbook.evaluate import bleu, bleu_by_length

REFS = ["A dog runs in the snow .", "Two children play on the beach with a ball .",
        "A man in a red shirt rides a bicycle down the street .", "A cat sleeps ."]


def test_identical_output_scores_100_and_signature_is_reported():
    r = bleu(REFS, REFS)
    assert r["bleu"] == 100.0 and r["bp"] == 1.0
    assert "tok:13a" in r["signature"] and "case:mixed" in r["signature"]


def test_case_matters_and_short_outputs_are_penalised():
    assert bleu([s.upper() for s in REFS], REFS)["bleu"] < 10
    short = bleu([" ".join(s.split()[:3]) for s in REFS], REFS)
    assert short["bp"] < 0.5


def test_misaligned_inputs_are_an_error():
    with pytest.raises(ValueError, match="3 hypotheses for 4 references"):
        bleu(REFS[:3], REFS)


def test_bleu_by_length_groups_by_source_words():
    pairs = [("ein hund", REFS[0]), ("zwei kinder spielen am strand mit einem ball", REFS[1]),
             ("ein mann in einem roten hemd fährt mit dem fahrrad die straße hinunter", REFS[2]),
             ("eine katze", REFS[3])]
    hyps = [REFS[0], REFS[1], "something else entirely", REFS[3]]
    rows = bleu_by_length(hyps, pairs, edges=(0, 5, 10, 100))
    assert [(r["min_words"], r["max_words"], r["n"]) for r in rows] == [(0, 4, 2), (5, 9, 1), (10, 99, 1)]
    assert rows[0]["bleu"] == 100.0 and rows[1]["bleu"] == 100.0 and rows[2]["bleu"] < 10
