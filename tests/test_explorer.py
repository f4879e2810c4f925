"""The attention explorer's data (python -m attnbook.explorer, book/explorer.md): softmax rows,
shapes that match the pieces, the same bytes twice, no absolute paths; and the committed data."""
from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import attnbook.explorer as explorer
from attnbook import BOS_ID, EOS_ID
from attnbook.recipe import build_model, override, preset
from attnbook.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "_static" / "explorer" / "attention.json"
PAIRS = [("Ein Hund rennt durch den Schnee.", "A dog runs through the snow."),
         ("Zwei Kinder spielen am Strand.", "Two children play on the beach."),
         ("Ein Mann fährt Fahrrad.", "A man rides a bike."),
         ("Eine Frau liest ein Buch im Park.", "A woman reads a book in the park."),
         ("Drei Hunde schlafen.", "Three dogs sleep."),
         ("Ein Junge springt ins Wasser.", "A boy jumps into the water.")]


@pytest.fixture(autouse=True)
def keep_threads():
    """The command sets one thread; the rest of this test process keeps its own."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def make_run(folder: Path, model: str = "transformer") -> Path:
    """A run folder as attnbook.train writes it (checkpoint.pt, tokenizer.model), with an
    untrained smoke-sized model and a tokenizer trained on PAIRS: no data set needed."""
    folder.mkdir(parents=True, exist_ok=True)
    words = [s for pair in PAIRS for s in pair] * 4
    tok = train_tokenizer(words, vocab_size=80, folder=folder / "tok")
    (folder / "tokenizer.model").write_bytes(tok.model_file.read_bytes())
    cfg = override(preset("smoke", model), vocab_size=tok.vocab_size, n_layers=2)
    torch.manual_seed(0)
    net = build_model(cfg)
    torch.save({"model": net.state_dict(), "config": asdict(cfg), "vocab_size": tok.vocab_size},
               folder / "checkpoint.pt")
    return folder


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A hand-made run, the command's working folder, and PAIRS in place of Multi30k."""
    monkeypatch.setattr(explorer, "load_multi30k", lambda split, src, tgt, data_dir=None: PAIRS)
    monkeypatch.chdir(tmp_path)
    return make_run(tmp_path / "runs" / "toy")


def strings(x):
    """Every string in a JSON value, keys included."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from strings(v)


def check_data(data: dict) -> None:
    """Shapes match the pieces; every row is a softmax (sums to 1 up to rounding to 3 decimals);
    decoder self-attention never looks ahead."""
    assert set(data["kinds"]) == {"enc", "dec", "cross"}
    assert data["layers"] == data["meta"]["config"]["n_layers"]
    assert data["heads"] == data["meta"]["config"]["h"]
    for s in data["sentences"]:
        assert s["tgt"][0] == "<s>" and s["next"][-1] == "</s>" and s["tgt"][1:] == s["next"][:-1]
        for kind, info in data["kinds"].items():
            rows, cols = s[info["rows"]], s[info["columns"]]
            layers = s["weights"][kind]
            assert len(layers) == data["layers"]
            for heads in layers:
                assert len(heads) == data["heads"]
                for w in heads:
                    assert len(w) == len(rows)
                    for t, row in enumerate(w):
                        assert len(row) == len(cols)
                        assert all(0 <= v <= 1 and round(v, 3) == v for v in row)
                        assert abs(sum(row) - 1) <= 0.0005 * len(row) + 1e-9, (kind, t, row)
                        if kind == "dec":
                            assert all(v == 0 for v in row[t + 1:])


def test_command_writes_softmax_rows_that_match_the_pieces(run, capsys):
    assert explorer.main(["runs/toy", "--out", "out/attention.json", "--every", "2",
                          "--count", "3"]) == 0
    assert "wrote out/attention.json" in capsys.readouterr().out
    data = json.loads(Path("out/attention.json").read_text(encoding="utf-8"))
    check_data(data)
    assert [s["index"] for s in data["sentences"]] == [0, 2, 4]
    assert [s["source"] for s in data["sentences"]] == [PAIRS[i][0] for i in (0, 2, 4)]
    assert data["meta"]["run"] == "runs/toy" and data["meta"]["attnbook"]
    assert data["meta"]["sentences"].startswith("one in every 2 sentences")
    s = data["sentences"][0]
    assert s["src"] == explorer.load_run(run, "cpu")[1].pieces(PAIRS[0][0])
    # the .js twin holds the same data; the SVG is the static figure of sentence 0
    js = Path("out/attention.js").read_text(encoding="utf-8")
    body = re.fullmatch(r"//[^\n]*\nwindow\.ATTNBOOK_ATTENTION = (.*);\n", js, re.S)
    assert body and json.loads(body.group(1)) == data
    svg = ET.parse("out/cross_attention.svg").getroot()
    cells = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect")][1:]
    assert len(cells) == len(s["next"]) * len(s["src"])


def test_weights_are_those_of_the_model(run):
    """The recorded cross-attention equals what Transformer.decode returns for the same tokens."""
    model, tok, cfg = explorer.load_run(run, "cpu")
    src, hyp = tok.encode(PAIRS[1][0]), tok.encode(PAIRS[1][1])
    got = explorer.record(model, src, hyp)
    s = torch.tensor([src])
    mask = torch.ones_like(s, dtype=torch.bool)
    with torch.no_grad():
        _, cross = model.decode(torch.tensor([[BOS_ID, *hyp]]), model.encode(s, mask), mask,
                                return_attention=True)
    for layer, w in zip(got["cross"], cross):
        assert torch.allclose(torch.tensor(layer, dtype=torch.float), w[0], atol=5e-4)
    assert len(got["enc"][0][0]) == len(src) and len(got["dec"][0][0]) == len(hyp) + 1
    assert all(not m.record for m in model.modules() if hasattr(m, "record"))
    assert EOS_ID not in hyp


def test_same_run_gives_the_same_bytes_and_no_absolute_path(run, tmp_path):
    outs = []
    for name in ("a", "b"):
        assert explorer.main(["runs/toy", "--out", f"{name}/attention.json", "--count", "2",
                              "--every", "3"]) == 0
        outs.append({p.name: p.read_bytes() for p in sorted(Path(name).iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 3
    # given by its absolute path, the run is named relative to the working folder, or else by
    # its last two parts: never where it lies on this machine
    assert explorer.main([str(run), "--out", "c/attention.json", "--count", "2",
                          "--every", "3"]) == 0
    assert explorer.run_name(Path("/somewhere/else/runs/cpu-base")) == "runs/cpu-base"
    for folder in ("a", "c"):
        for path in Path(folder).iterdir():
            assert str(tmp_path) not in path.read_text(encoding="utf-8")
        data = json.loads((Path(folder) / "attention.json").read_text(encoding="utf-8"))
        assert not [s for s in strings(data) if re.match(r"(/|~|[A-Za-z]:\\)", s)]
    assert json.loads(Path("c/attention.json").read_text())["meta"]["run"] == "runs/toy"


def test_mistakes_are_one_line_errors(run, tmp_path, capsys):
    assert explorer.main(["runs/none", "--out", "x.json"]) == 2
    assert "not a run folder" in capsys.readouterr().err
    make_run(tmp_path / "runs" / "gru", model="gru")
    assert explorer.main(["runs/gru", "--out", "x.json"]) == 2
    err = capsys.readouterr().err
    assert "encoder-decoder Transformer" in err and err.count("\n") == 1
    assert explorer.main(["runs/toy", "--out", "x.json", "--count", "7"]) == 2
    assert "hold only" in capsys.readouterr().err
    assert not Path("x.json").exists()


def test_on_multi30k_with_a_trained_smoke_run(tmp_path, monkeypatch):
    """The book's rule on the real test set: every 50th of test_2016_flickr, 20 sentences."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files (MULTI30K_DIR)")
    from attnbook.train import train
    train(preset("smoke"), tmp_path / "smoke", progress=False)
    monkeypatch.chdir(tmp_path)
    assert explorer.main(["smoke", "--out", "attention.json"]) == 0
    data = json.loads(Path("attention.json").read_text(encoding="utf-8"))
    check_data(data)
    assert [s["index"] for s in data["sentences"]] == list(range(0, 1000, 50))
    assert data["meta"]["test_bleu"] is not None and data["meta"]["steps"] == 20


def test_the_library_does_not_import_the_explorer():
    for path in (ROOT / "src" / "attnbook").rglob("*.py"):
        if path.name != "explorer.py":
            assert not re.search(r"\bexplorer\b", path.read_text(encoding="utf-8")), path


# ---- The committed data of book/explorer.md ------------------------------------------------------

def test_committed_data_is_consistent():
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert COMMITTED.stat().st_size < 1_500_000
    check_data(data)
    meta = data["meta"]
    assert [s["index"] for s in data["sentences"]] == list(range(0, 1000, 50))
    assert meta["sentences"].startswith("one in every 50 sentences of Multi30k test_2016_flickr")
    assert meta["config"]["model"] == "transformer" and not meta["run"].startswith("/")
    assert data["layers"] >= 1 and data["heads"] >= 1
    js = (COMMITTED.parent / "attention.js").read_text(encoding="utf-8")
    assert json.loads(js.split(" = ", 1)[1].rstrip().removesuffix(";")) == data
    assert (COMMITTED.parent / "cross_attention.svg").read_text(encoding="utf-8") \
        == explorer.svg_figure(data)
    assert str(ROOT) not in COMMITTED.read_text(encoding="utf-8")


def test_the_pages_numbers_are_the_committed_datas():
    """book/explorer.md quotes the committed data: each number it quotes is recomputed here."""
    import numpy as np
    data = json.loads((ROOT / "book" / "_static" / "explorer" / "attention.json").read_text())
    page = (ROOT / "book" / "explorer.md").read_text()
    S, H = data["sentences"], data["heads"]
    by = {s["index"]: s for s in S}

    def W(s, kind, layer, head):
        return np.array(s["weights"][kind][layer][head])

    def mean_cell(i, kind, layer, query, key):          # mean of the heads, first matches
        s = by[i]
        rows = s["next"] if kind == "cross" else s["src"]
        m = np.mean([W(s, kind, layer, h) for h in range(H)], 0)
        q = next(j for j, p in enumerate(rows) if p.strip("\u2581") == query)
        k = next(j for j, p in enumerate(s["src"]) if p.strip("\u2581") == key)
        return f"{m[q, k]:.2f}"

    sharp = [np.mean(np.concatenate([W(s, "cross", 1, h).max(1) for s in S])) for h in range(H)]
    assert f"{min(sharp):.2f} to {max(sharp):.2f} on average in its heads" in page
    assert f"*orangefarbenen* ({mean_cell(0, 'cross', 1, 'orange', 'orangefarbenen')} in the mean" in page
    assert f"*Hut* ({mean_cell(0, 'cross', 1, 'hat', 'Hut')})" in page
    assert f"(mouth, {mean_cell(600, 'cross', 1, 'its', 'Mund')})" in page
    assert f"*A* ({mean_cell(200, 'cross', 1, 'can', 'A')})" in page
    assert f"*Kan* ({mean_cell(200, 'cross', 1, 'can', 'Kan')})" in page
    prev = [np.mean(np.concatenate([np.diag(W(s, "enc", 1, h), -1) for s in S])) for h in range(H)]
    assert f"head 3 of layer 2 puts {prev[2]:.2f}" in page and f"same layer {prev[1]:.2f}" in page
    top = sum(int(np.argmax(W(s, "dec", l, h).sum(0)) == 0)
              for s in S for l in range(data["layers"]) for h in range(H))
    assert f"most-read column in {top} of the {len(S) * data['layers'] * H}" in page
