"""BLEU as sacreBLEU computes it, overall and by source length, and the evaluation command."""
import gzip
import json
import os
import subprocess
import sys

import pytest

import attnbook.commands.evaluate as evaluate_module
from attnbook.commands.evaluate import bleu, bleu_by_length, main

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


# ---- python -m attnbook evaluate RUN --src FILE --ref FILE ---------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny trained run (the smoke preset: seconds), shared by the tests of this module."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files")
    from attnbook.training.recipe import preset
    from attnbook.commands.train import train
    out = tmp_path_factory.mktemp("run")
    train(preset("smoke"), out, progress=False)
    return out


@pytest.fixture(scope="module")
def val_pairs(run):
    from attnbook.data import load_multi30k
    return load_multi30k("val", "de", "en")[:6]


def write(path, lines, newline_at_end=True, compress=None):
    """Write lines to ``path`` (UTF-8; gzip when compress, default: when the name ends in .gz)."""
    data = ("\n".join(lines) + ("\n" if newline_at_end else "")).encode("utf-8")
    if compress if compress is not None else str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def evaluate(capsys, run, *args):
    """Run the command in this process: (exit status, JSON report or None, stderr)."""
    rc = main([str(run), "--device", "cpu", "--beam", "1", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else out), err


def test_own_test_set_in_plain_files(run, val_pairs, tmp_path, capsys):
    src = write(tmp_path / "my.de", [s for s, _ in val_pairs])
    ref = write(tmp_path / "my.en", [t for _, t in val_pairs])
    rc, report, err = evaluate(capsys, run, "--src", src, "--ref", ref, "--beam", "2")
    assert rc == 0, err
    assert report["run"] == str(run) and report["sentences"] == 6 and report["split"] is None
    assert report["test_set"] == f"{src} -> {ref} (6 of 6 sentences)"
    assert report["decoding"].startswith("beam 2,") and 0 <= report["bleu"] <= 100
    assert "tok:13a" in report["signature"] and "case:mixed" in report["signature"]
    # --sentences and --save work with them too
    rc, part, err = evaluate(capsys, run, "--src", src, "--ref", ref, "--sentences", "4",
                             "--save", str(tmp_path / "hyps.txt"))
    assert rc == 0, err
    assert part["sentences"] == 4 and part["test_set"].endswith("(4 of 6 sentences)")
    assert len((tmp_path / "hyps.txt").read_text(encoding="utf-8").splitlines()) == 4


def test_gzip_files_windows_line_ends_and_no_final_newline_read_the_same(run, val_pairs, tmp_path,
                                                                         capsys):
    plain = [write(tmp_path / "a.de", [s for s, _ in val_pairs]),
             write(tmp_path / "a.en", [t for _, t in val_pairs])]
    zipped = [write(tmp_path / "b.de.gz", [s for s, _ in val_pairs], newline_at_end=False),
              write(tmp_path / "b.en.gz", [t for _, t in val_pairs])]
    crlf = [write(tmp_path / "c.de", [s + "\r" for s, _ in val_pairs]),
            write(tmp_path / "c.en.gz", [t + "\r" for _, t in val_pairs])]
    reports = []
    for src, ref in (plain, zipped, crlf):
        rc, report, err = evaluate(capsys, run, "--src", src, "--ref", ref)
        assert rc == 0, err
        assert report.pop("test_set") == f"{src} -> {ref} (6 of 6 sentences)"
        reports.append(report)
    assert reports[0] == reports[1] == reports[2]


def test_bleu_is_exactly_sacrebleus(run, val_pairs, tmp_path, capsys):
    from sacrebleu.metrics import BLEU
    src = write(tmp_path / "t.de.gz", [s for s, _ in val_pairs])
    ref = write(tmp_path / "t.en.gz", [t for _, t in val_pairs])
    hyps_file = tmp_path / "hyps.txt"
    rc, report, err = evaluate(capsys, run, "--src", src, "--ref", ref, "--save", str(hyps_file))
    assert rc == 0, err
    hyps = hyps_file.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == 6 and all(h.strip() for h in hyps)
    metric = BLEU()
    expected = metric.corpus_score(hyps, [[t for _, t in val_pairs]])
    assert report["bleu"] == round(expected.score, 2)
    assert report["signature"] == str(metric.get_signature())
    # the translations as their own references: the score sacreBLEU gives them (100)
    own = write(tmp_path / "own.en", hyps)
    rc, report, err = evaluate(capsys, run, "--src", src, "--ref", own,
                               "--save", str(tmp_path / "again.txt"))
    assert rc == 0, err
    assert (tmp_path / "again.txt").read_text(encoding="utf-8").split("\n")[:-1] == hyps
    assert report["bleu"] == round(BLEU().corpus_score(hyps, [hyps]).score, 2) == 100.0


GOOD_DE = ["Ein Hund rennt durch den Schnee.", "Zwei Kinder spielen am Strand.",
           "Eine Katze schläft."]
GOOD_EN = ["A dog runs through the snow.", "Two children play on the beach.", "A cat sleeps."]


def _bad_files(case, d):
    """(extra arguments, substrings the error must contain) for one kind of bad input."""
    src, ref = write(d / "s.de", GOOD_DE), write(d / "r.en", GOOD_EN)
    if case == "missing src":
        return ["--src", str(d / "nope.de"), "--ref", ref], [f"--src {d / 'nope.de'} not found"]
    if case == "missing ref":
        missing = d / "nope.en.gz"
        return ["--src", src, "--ref", str(missing)], [f"--ref {missing} not found"]
    if case == "not gzip":
        bad = write(d / "plain.en.gz", GOOD_EN, compress=False)
        return ["--src", src, "--ref", bad], [f"--ref {bad} is not valid gzip", "without the .gz"]
    if case == "truncated gzip":
        bad = d / "cut.de.gz"
        bad.write_bytes(gzip.compress("\n".join(GOOD_DE * 50).encode())[:-12])
        return ["--src", str(bad), "--ref", ref], [f"--src {bad} is not valid gzip"]
    if case == "gzip without .gz":
        bad = write(d / "zipped.de", GOOD_DE, compress=True)
        return ["--src", bad, "--ref", ref], [f"--src {bad} looks gzip-compressed", "rename"]
    if case == "not utf-8":
        bad = d / "latin1.en"
        lines = GOOD_EN[:1] + ["Über the bridge."] + GOOD_EN[2:]
        bad.write_bytes("\n".join(lines).encode("latin-1"))
        return ["--src", src, "--ref", str(bad)], [f"--ref {bad} is not UTF-8", "line 2", "iconv"]
    if case == "not utf-8 in gzip":
        bad = d / "latin1.de.gz"
        bad.write_bytes(gzip.compress("\n".join(GOOD_DE).encode("latin-1")))
        return ["--src", str(bad), "--ref", ref], [f"--src {bad} is not UTF-8", "line 3"]
    if case == "misaligned":
        short = write(d / "short.en", GOOD_EN[:2])
        return ["--src", src, "--ref", short], [f"--src {src} has 3 lines", f"--ref {short} has 2",
                                                "aligned"]
    if case == "empty line":
        bad = write(d / "gap.en", [GOOD_EN[0], "", GOOD_EN[1], GOOD_EN[2]])
        return ["--src", src, "--ref", bad], [f"--ref {bad}: line 2 is empty", "both files"]
    if case == "whitespace-only line":
        bad = write(d / "blank.de.gz", GOOD_DE[:2] + [" \t "])
        return ["--src", bad, "--ref", ref], [f"--src {bad}: line 3 is empty or whitespace-only"]
    if case == "two newlines at the end":
        bad = write(d / "extra.de", GOOD_DE + [""])
        return ["--src", bad, "--ref", ref], [f"--src {bad}: line 4 is empty"]
    if case == "several empty lines":
        bad = write(d / "gaps.en", ["", GOOD_EN[0], "", GOOD_EN[1], " "])
        return ["--src", src, "--ref", bad], [f"--ref {bad}: lines 1, 3, 5 are empty"]
    if case == "empty file":
        (d / "empty.de").write_bytes(b"")
        return ["--src", str(d / "empty.de"), "--ref", ref], [f"--src {d / 'empty.de'} is empty"]
    if case == "empty gzip file":
        bad = d / "empty.en.gz"
        bad.write_bytes(gzip.compress(b""))
        return ["--src", src, "--ref", str(bad)], [f"--ref {bad} is empty"]
    if case == "src without ref":
        return ["--src", src], ["--src needs --ref"]
    if case == "ref without src":
        return ["--ref", ref], ["--ref needs --src"]
    if case == "src with split":
        return ["--src", src, "--ref", ref, "--split", "val"], ["--split val cannot be combined"]
    if case == "invisible line":
        bad = write(d / "zwsp.de", GOOD_DE[:1] + ["\u200b\u200e"] + GOOD_DE[2:])
        return ["--src", bad, "--ref", ref], [f"--src {bad}: line 2 holds only invisible characters",
                                              "remove it from both files"]
    if case == "too long":
        bad = write(d / "long.de", GOOD_DE[:1] + ["Ein Hund rennt. " * 200] + GOOD_DE[2:])
        return ["--src", bad, "--ref", ref], [f"--src {bad}: line 2 has more than 256 tokens"]
    raise AssertionError(case)


BAD_CASES = ["missing src", "missing ref", "not gzip", "truncated gzip", "gzip without .gz",
             "not utf-8", "not utf-8 in gzip", "misaligned", "empty line", "whitespace-only line",
             "two newlines at the end", "several empty lines", "empty file", "empty gzip file",
             "src without ref", "ref without src", "src with split", "too long", "invisible line"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_error_with_exit_status_2(case, run, tmp_path, capsys):
    args, messages = _bad_files(case, tmp_path)
    save = tmp_path / "hyps.txt"
    rc, out, err = evaluate(capsys, run, *args, "--save", str(save))
    assert rc == 2 and out == "" and not save.exists()
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for m in messages:
        assert m in err, (m, err)


def test_sentences_limits_what_is_checked_for_length(run, tmp_path, capsys):
    src = write(tmp_path / "s.de", GOOD_DE[:1] + ["Ein Hund rennt. " * 200])
    ref = write(tmp_path / "r.en", GOOD_EN[:2])
    rc, report, err = evaluate(capsys, run, "--src", src, "--ref", ref, "--sentences", "1")
    assert rc == 0 and report["test_set"].endswith("(1 of 2 sentences)"), err


def test_a_tokenizer_error_during_translation_names_the_input_line(run, tmp_path, capsys,
                                                                   monkeypatch):
    # were the length check to miss a sentence, translate's own error is still reported as one
    # line naming the 1-based input line (the tokenizer counts sentences from 0)
    monkeypatch.setattr(evaluate_module, "too_long", lambda tok, sentences: [])
    src = write(tmp_path / "s.de", GOOD_DE[:1] + ["Ein Hund rennt. " * 200] + GOOD_DE[2:])
    ref = write(tmp_path / "r.en", GOOD_EN)
    rc, out, err = evaluate(capsys, run, "--src", src, "--ref", ref)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: --src {src}: line 2: sentence has ") and "max_len=256" in err


def test_the_command_line(run, tmp_path):
    src = write(tmp_path / "s.de.gz", GOOD_DE)
    ref = write(tmp_path / "r.en.gz", GOOD_EN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnbook.commands.evaluate", str(run), "--device", "cpu", "--beam", "1"]
    ok = subprocess.run(cmd + ["--src", src, "--ref", ref], capture_output=True, text=True,
                        env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    report = json.loads(ok.stdout)
    assert report["sentences"] == 3 and report["test_set"] == f"{src} -> {ref} (3 of 3 sentences)"
    short = write(tmp_path / "short.en.gz", GOOD_EN[:2])
    bad = subprocess.run(cmd + ["--src", src, "--ref", short], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (f"error: --src {src} has 3 lines but --ref {short} has 2: the files must "
                          "be aligned, one reference line per source line\n")
