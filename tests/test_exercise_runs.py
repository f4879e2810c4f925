"""python -m attnbook exercise_runs: every experiment runs (at the tiny scale) and writes the JSON
the solutions load; one seed's numbers repeat; --only replaces one entry; bad options are one
line and exit status 2. About 15 seconds, most of it the two Multi30k experiments."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from attnbook.experiments import exercise_runs
from attnbook.commands import exercise_runs as exercise_runs_command
from attnbook.batching import make_batch
from attnbook.bleu import bleu
from attnbook.lm import DecoderOnlyTranslator
from attnbook.transformer import TransformerConfig

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")
NO_DATA = ["ex-05-heads-width", "ex-06-plain-copy", "ex-06-too-good", "ex-07-rope-length",
           "ex-08-warmup-experiment"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The results folder of one tiny run of every experiment (those without data if the
    Multi30k files are missing)."""
    folder = tmp_path_factory.mktemp("results")
    only = [] if os.environ.get("MULTI30K_DIR") else sum((["--only", n] for n in NO_DATA), [])
    assert exercise_runs_command.main(["--results", str(folder), "--tiny", *only]) == 0
    return folder


def test_the_json_names_every_run_its_spread_and_where_it_ran(written):
    data = json.loads((written / "exercises.json").read_text())
    names = list(exercise_runs.EXPERIMENTS) if os.environ.get("MULTI30K_DIR") else NO_DATA
    assert list(data["exercises"]) == names
    (call,) = data["calls"]                        # its provenance record (attnbook.store)
    assert call["threads"] == 1 and call["rows"] == names and call["date"][:2] == "20"
    assert call["command"].startswith("python -m attnbook exercise_runs --results ")
    assert {"torch", "python", "cpu"} <= set(call["hardware"]) and len(call["git_commit"]) == 40
    for name, ex in data["exercises"].items():
        assert ex["scale"] == "tiny" and ex["wall_time_s"] >= 0 and ex["cpu_time_s"] >= 0
        assert ex["runs"], name
        summaries = ex.get("summary", [])
        for s in summaries.values() if isinstance(summaries, dict) else summaries:
            for spread in s.values():
                if isinstance(spread, dict):
                    assert spread["min"] <= spread["mean"] <= spread["max"], (name, s)
    text = (written / "exercises.json").read_text()
    assert text.count(str(written)) == 1       # no path but the one in the command of its call
    heads = data["exercises"]["ex-05-heads-width"]
    assert [r["seed"] for r in heads["runs"]] == [0, 1, 0, 1]
    assert [s["h"] for s in heads["summary"]] == [h for h, _, _ in heads["settings"]["runs"]]
    copy = data["exercises"]["ex-06-plain-copy"]["summary"]
    assert set(copy) == {"none", "causal"} and set(copy["none"]) == {"loss", "letters", "answers"}
    rope = data["exercises"]["ex-07-rope-length"]
    assert [(r["window"], r["seed"]) for r in rope["runs"]] == [(None, 0), (None, 1), (16, 0), (16, 1)]
    assert rope["lengths"] == [4, 24] and all(len(r["accuracy"]) == 2 for r in rope["runs"])
    assert [(x["window"], x["length"]) for x in rope["summary"]] == [(None, 4), (None, 24),
                                                                    (16, 4), (16, 24)]
    assert [(r["positional"], r["seed"]) for r in rope["chapter"]] == \
        [("none", 0), ("none", 1), ("learned-large", 0), ("learned-large", 1)]
    for r in rope["chapter"]:              # lengths 4 and 24 (not 200), positions 0 to 47
        assert len(r["by_length"]) == 2 and len(r["by_position"]) == 48
        assert ("untouched" in r) == (r["positional"] == "learned-large")
    assert all(r["untouched"] and r["trained"] for r in rope["chapter"] if "untouched" in r)
    warm = data["exercises"]["ex-08-warmup-experiment"]
    assert [(r["n_layers"], r["lr"], r["norm"], r["seed"]) for r in warm["runs"]] == \
        [(1, 1e-2, "post", 0), (1, 1e-2, "pre", 0)]
    assert [(x["norm"], x["last50"]["mean"]) for x in warm["summary"]] == \
        [(r["norm"], round(r["last50"], 4)) for r in warm["runs"]]
    assert [(r["norm"], r["warmup"], r["seed"]) for r in warm["chapter"]] == \
        [("post", 0, 0), ("pre", 0, 0), ("post", 2, 0), ("pre", 2, 0)]
    assert all(len(r["losses"]) == 3 and 0 < r["p_right"] < 1 for r in warm["chapter"])
    # without warm-up the chapter's runs are the exercise's runs at its depth and rate
    assert [round(r["last50"], 6) for r in warm["chapter"][:2]] == \
        [round(r["last50"], 6) for r in warm["runs"]]


@needs_data
def test_the_translation_experiments_record_what_the_solutions_quote(written):
    ex = json.loads((written / "exercises.json").read_text())["exercises"]
    beam = ex["ex-09-beam-width"]
    assert beam["models"][0]["steps"] == 3 and "test_bleu" in beam["models"][0]
    assert [(r["alpha"], r["beam"]) for r in beam["runs"]] == [(0.0, 1), (0.0, 2), (0.6, 1), (0.6, 2)]
    assert [(s["alpha"], s["beam"]) for s in beam["summary"]] == [(0.0, 1), (0.0, 2), (0.6, 1), (0.6, 2)]
    assert beam["runs"][0]["bleu"] == beam["runs"][2]["bleu"]            # greedy: alpha plays no part
    whole = ex["ex-12-whole-sequence-loss"]
    assert [(r["loss"], r["seed"]) for r in whole["runs"]] == [("target", 0), ("whole", 0)]
    assert set(whole["summary"]["whole"]) == {"val_loss", "bleu"}
    scored = beam["models"] + beam["runs"] + whole["runs"]        # every BLEU with its signature
    assert {r["bleu_signature"] for r in scored} == {bleu(["a"], ["a"])["signature"]}


def test_the_same_seed_gives_the_same_numbers(written):
    data = json.loads((written / "exercises.json").read_text())["exercises"]
    for name in ("ex-05-heads-width", "ex-06-too-good", "ex-07-rope-length",
                 "ex-08-warmup-experiment"):
        assert exercise_runs.run(name, tiny=True)["runs"] == data[name]["runs"]


def test_only_replaces_the_named_entry_and_keeps_the_others(written, tmp_path):
    (tmp_path / "exercises.json").write_text((written / "exercises.json").read_text())
    before = json.loads((tmp_path / "exercises.json").read_text())["exercises"]
    assert exercise_runs_command.main(["--results", str(tmp_path), "--tiny", "--only", "ex-06-too-good"]) == 0
    merged = json.loads((tmp_path / "exercises.json").read_text())
    after = merged["exercises"]
    assert list(after) == list(before) and len(merged["calls"]) == 2
    assert merged["calls"][1]["command"].endswith("--tiny --only ex-06-too-good")
    assert merged["calls"][1]["rows"] == ["ex-06-too-good"]
    assert after["ex-06-too-good"]["runs"] == before["ex-06-too-good"]["runs"]
    assert all(after[n] == before[n] for n in after if n != "ex-06-too-good")


@pytest.mark.parametrize("args,message", [
    (["--results", "x", "--only", "ex-99-nope"], "argument --only: invalid choice: 'ex-99-nope'"),
    ([], "the following arguments are required: --results"),
    (["--results", "x", "--steps", "3"], "unrecognized arguments: --steps 3"),
])
def test_bad_options_are_one_line_and_exit_status_2(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        exercise_runs_command.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "see `python -m attnbook exercise_runs --help`" in err


def test_another_scale_is_refused_in_one_line_before_it_runs(written, tmp_path, capsys):
    (tmp_path / "exercises.json").write_text((written / "exercises.json").read_text())
    before = (tmp_path / "exercises.json").read_text()
    assert exercise_runs_command.main(["--results", str(tmp_path), "--only", "ex-06-too-good"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "tiny-scale entries" in err
    assert (tmp_path / "exercises.json").read_text() == before


def test_a_damaged_results_file_is_one_line_and_exit_status_2(capsys, tmp_path):
    (tmp_path / "exercises.json").write_text("{not json")
    assert exercise_runs_command.main(["--results", str(tmp_path), "--only", "ex-06-too-good"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "is not a JSON result" in err


def test_whole_sequence_loss_is_the_next_token_loss_of_each_sequence_alone():
    torch.manual_seed(0)
    model = DecoderOnlyTranslator(TransformerConfig(vocab_size=20, d_model=16, h=2, d_ff=32,
                                                    n_layers=2, dropout=0.0, max_len=64)).eval()
    src, tgt = [[5, 6, 7], [8, 9, 10, 11, 12]], [[13, 14], [15, 16, 17, 18]]
    total, n = 0.0, 0
    for s, t in zip(src, tgt):                        # BOS src EOS tgt EOS, no padding anywhere
        seq = torch.tensor([[2, *s, 3, *t, 3]])
        total += F.cross_entropy(model.stack(seq)[0, :-1], seq[0, 1:], reduction="sum").item()
        n += seq.shape[1] - 1
    loss = exercise_runs.whole_sequence_loss(model, make_batch(src, tgt))
    assert loss.item() == pytest.approx(total / n, rel=1e-5)


def test_the_off_by_one_mask_shows_each_position_the_next_token_and_no_further():
    s = exercise_runs.CAESAR
    model = exercise_runs.caesar_model(s, 13, "off-by-one", seed=0).eval()
    ids = torch.randint(4, 12, (2, 8), generator=torch.Generator().manual_seed(0))
    out = model(ids)
    for t in range(6):
        next_changed, later_changed = ids.clone(), ids.clone()
        next_changed[:, t + 1] = (ids[:, t + 1] - 3) % 8 + 4
        later_changed[:, t + 2:] = (ids[:, t + 2:] - 3) % 8 + 4
        assert not torch.allclose(model(next_changed)[:, t], out[:, t])     # sees t + 1 ...
        torch.testing.assert_close(model(later_changed)[:, :t + 1], out[:, :t + 1])  # ... no more


def test_rope_is_the_graders_rotation_and_the_window_hides_far_keys():
    from attnbook.graders.ch07_positional_encoding import _ch07_rope

    x = torch.randn(2, 3, 10, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(exercise_runs.rope(x, torch.arange(10)), _ch07_rope(x, torch.arange(10)))
    torch.manual_seed(0)
    attn = exercise_runs.RotaryAttention(8, 2, window=3).eval()
    x, mask = torch.randn(1, 12, 8), torch.ones(1, 12, dtype=torch.bool)
    out = attn(x, key_mask=mask)[0]
    far = x.clone()
    far[:, 9:] += 1.0                                      # keys 9.. are 3 or more from query 6
    torch.testing.assert_close(attn(far, key_mask=mask)[0][:, :7], out[:, :7])
    assert not torch.allclose(attn(far, key_mask=mask)[0][:, 7], out[:, 7])
    # the score of a query and a key depends on their distance only (no window)
    plain = exercise_runs.RotaryAttention(8, 2).eval()
    q = exercise_runs.rope(torch.ones(1, 1, 20, 4), torch.arange(20))
    scores = q @ q.transpose(-1, -2)                       # (1, 1, 20, 20)
    torch.testing.assert_close(torch.diagonal(scores, 3, -2, -1),
                               torch.full((17,), scores[0, 0, 0, 3].item())[None, None])
    assert plain(x, key_mask=mask)[0].shape == (1, 12, 8)


@pytest.mark.parametrize("warmup", [0, 3])
def test_train_reversal_is_chapter_8s_loop(warmup):
    """The chapter's train_reversal, written out: a LambdaLR whose factor is 1 without warm-up
    (the same updates as plain Adam) and min(1, (i + 1) / warmup) with it; the command's losses
    and model are the chapter's."""
    s = exercise_runs.WARMUP | {"steps": 4}
    model_, ours = exercise_runs.train_reversal(s, norm_first=False, seed=1, lr=1e-2, n_layers=1,
                                                warmup=warmup)
    torch.manual_seed(1)
    cfg = TransformerConfig(vocab_size=14, **(s["model"] | {"n_layers": 1}))
    model = exercise_runs.Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    gen, losses = torch.Generator().manual_seed(1), []
    model.train()
    for _ in range(4):
        b = exercise_runs.make_reverse_batch(32, 4, 8, 10, generator=gen)
        loss = exercise_runs.translation_loss(model(b.src, b.src_mask, b.tgt_in, b.tgt_mask),
                                              b.tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    assert ours == losses and not model_.training
    assert all(torch.equal(a, b) for a, b in zip(model_.state_dict().values(),
                                                 model.state_dict().values()))
    assert 0 < exercise_runs.p_right(model_, s) < 1
