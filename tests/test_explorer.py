"""The attention explorers' data (python -m attnbook explorer; book/explorer.md for the
Transformer, book/explorer_bahdanau.md for chapter 2's GRU): softmax rows, shapes that match the
pieces, the model's own weights, the same bytes twice, no absolute paths; and the committed data
with the numbers the pages quote."""
from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import attnbook.book.explorer as explorer
from attnbook.commands import explorer as explorer_command
from attnbook import BOS_ID, EOS_ID
from attnbook.decoding import translate
from attnbook.training.recipe import build_model, override, preset
from attnbook.training.runs import STORED_MODELS
from attnbook.utils import arithmetic
from attnbook.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "book" / "_static" / "explorer" / "attention.json"
COMMITTED_GRU = ROOT / "book" / "_static" / "explorer" / "bahdanau.json"
MODELS = ("transformer", "gru-additive")
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
    """A run folder as attnbook.commands.train writes it (checkpoint.pt, tokenizer.model), with an
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
def new_run(tmp_path, monkeypatch):
    """new_run(model) makes a hand-made run runs/MODEL in the command's working folder; PAIRS
    stand in for Multi30k."""
    monkeypatch.setattr(explorer, "load_multi30k", lambda split, src, tgt, data_dir=None: PAIRS)
    monkeypatch.chdir(tmp_path)
    return lambda model: make_run(tmp_path / "runs" / model, model)


@pytest.fixture
def run(new_run):
    """A hand-made Transformer run, runs/transformer."""
    return new_run("transformer")


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
    decoder self-attention never looks ahead. A GRU has one attention: one layer, one head."""
    if data["meta"]["config"]["model"] == "transformer":
        assert set(data["kinds"]) == {"enc", "dec", "cross"}
        assert data["layers"] == data["meta"]["config"]["n_layers"]
        assert data["heads"] == data["meta"]["config"]["h"]
    else:
        assert data["kinds"] == {"cross": {"name": "additive attention", "rows": "next",
                                           "module": "decoder.attention", "columns": "src"}}
        assert data["layers"] == data["heads"] == 1
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


@pytest.mark.parametrize("model,name", [("transformer", "attention"), ("gru-additive", "bahdanau")])
def test_command_writes_softmax_rows_that_match_the_pieces(new_run, model, name, capsys):
    run = new_run(model)
    assert explorer_command.main([f"runs/{model}", "--out", f"out/{name}.json", "--every", "2",
                          "--count", "3"]) == 0
    assert f"wrote out/{name}.json" in capsys.readouterr().out
    data = json.loads(Path(f"out/{name}.json").read_text(encoding="utf-8"))
    check_data(data)
    assert data["meta"]["config"]["model"] == model
    assert [s["index"] for s in data["sentences"]] == [0, 2, 4]
    assert [s["source"] for s in data["sentences"]] == [PAIRS[i][0] for i in (0, 2, 4)]
    assert data["meta"]["run"] == f"runs/{model}" and data["meta"]["attnbook"]
    assert data["meta"]["sentences"].startswith("one in every 2 sentences")
    s = data["sentences"][0]
    assert s["src"] == explorer.load_run(run, "cpu")[1].pieces(PAIRS[0][0])
    # the .js twin holds the same data, in a global named after the file; the SVG is the static
    # figure of sentence 0
    js = Path(f"out/{name}.js").read_text(encoding="utf-8")
    body = re.fullmatch(rf"//[^\n]*\nwindow\.ATTNBOOK_{name.upper()} = (.*);\n", js, re.S)
    assert body and json.loads(body.group(1)) == data
    svg = ET.parse(f"out/{name}.svg").getroot()
    cells = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect")][1:]
    assert len(cells) == len(s["next"]) * len(s["src"])
    assert sorted(p.name for p in Path("out").iterdir()) == [f"{name}.js", f"{name}.json",
                                                            f"{name}.svg"]


def test_weights_are_those_of_the_model(run):
    """The recorded cross-attention equals what Transformer.decode returns for the same tokens."""
    model, tok, cfg = explorer.load_run(run, "cpu")
    src, hyp = tok.encode(PAIRS[1][0]), tok.encode(PAIRS[1][1])
    got = explorer.record(model, src, hyp)
    s = torch.tensor([src])
    mask = torch.ones_like(s, dtype=torch.bool)
    with torch.no_grad():
        _, cross = model.decode_with_attention(torch.tensor([[BOS_ID, *hyp]]),
                                               model.encode(s, mask), mask)
    for layer, w in zip(got["cross"], cross):
        assert torch.allclose(torch.tensor(layer, dtype=torch.float), w[0], atol=5e-4)
    assert len(got["enc"][0][0]) == len(src) and len(got["dec"][0][0]) == len(hyp) + 1
    assert all(not m.record for m in model.modules() if hasattr(m, "record"))
    assert EOS_ID not in hyp


def test_gru_weights_are_those_of_the_model_and_of_its_search(new_run):
    """The GRU's recorded weights (one layer, one head) equal Seq2Seq's own attention for the
    same tokens, and the weights its decoder computes step by step, as the search does, feeding
    its own previous token (what decoding.beam_search calls through Seq2Seq.decode's cache)."""
    model, tok, cfg = explorer.load_run(new_run("gru-additive"), "cpu")
    src, hyp = tok.encode(PAIRS[3][0]), tok.encode(PAIRS[3][1])
    got = explorer.record(model, src, hyp)
    assert list(got) == ["cross"] and len(got["cross"]) == 1 and len(got["cross"][0]) == 1
    w = torch.tensor(got["cross"][0][0], dtype=torch.float)             # (n + 1, S)
    assert w.shape == (len(hyp) + 1, len(src))
    s = torch.tensor([src])
    mask = torch.ones_like(s, dtype=torch.bool)
    with torch.no_grad():
        _, alpha = model.forward_with_attention(s, mask, torch.tensor([[BOS_ID, *hyp]]))
        H, h_last = model.encode(s, mask)
        state, memory, steps = h_last, model.decoder.prepare(H, h_last, mask), []
        for y in [BOS_ID, *hyp]:                                        # one step per token
            _, state, a = model.decoder.step(torch.tensor([y]), state, memory)
            steps.append(a[0])                                          # (S,)
    assert torch.allclose(w, alpha[0], atol=5e-4)
    assert torch.allclose(w, torch.stack(steps), atol=5e-4)
    assert (w.sum(1) - 1).abs().max() <= 0.0005 * len(src)
    assert len(set(map(tuple, got["cross"][0][0]))) > 1     # not one row repeated: it reads


@pytest.mark.parametrize("model", MODELS)
def test_same_run_gives_the_same_bytes_and_no_absolute_path(new_run, model, tmp_path):
    run = new_run(model)
    outs = []
    for name in ("a", "b"):
        assert explorer_command.main([f"runs/{model}", "--out", f"{name}/attention.json", "--count", "2",
                              "--every", "3"]) == 0
        outs.append({p.name: p.read_bytes() for p in sorted(Path(name).iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 3
    # given by its absolute path, the run is named relative to the working folder, or else by
    # its last two parts: never where it lies on this machine
    assert explorer_command.main([str(run), "--out", "c/attention.json", "--count", "2",
                          "--every", "3"]) == 0
    assert explorer.run_name(Path("/somewhere/else/runs/cpu-base")) == "runs/cpu-base"
    for folder in ("a", "c"):
        for path in Path(folder).iterdir():
            assert str(tmp_path) not in path.read_text(encoding="utf-8")
        data = json.loads((Path(folder) / "attention.json").read_text(encoding="utf-8"))
        assert not [s for s in strings(data) if re.match(r"(/|~|[A-Za-z]:\\)", s)]
    assert json.loads(Path("c/attention.json").read_text())["meta"]["run"] == f"runs/{model}"


def test_mistakes_are_one_line_errors(new_run, capsys):
    assert explorer_command.main(["runs/none", "--out", "x.json"]) == 2
    assert "not a run folder" in capsys.readouterr().err
    for model in ("gru", "decoder-only"):    # no attention to read, or not encoder-decoder
        new_run(model)
        assert explorer_command.main([f"runs/{model}", "--out", "x.json"]) == 2
        err = capsys.readouterr().err
        assert f"holds a {model} model" in err and "--model transformer, gru-additive or " \
            "gru-dot" in err and err.count("\n") == 1
    new_run("transformer")
    assert explorer_command.main(["runs/transformer", "--out", "x.json", "--count", "7"]) == 2
    assert "hold only" in capsys.readouterr().err
    assert explorer_command.main(["runs/transformer", "--out", "x.js"]) == 2
    assert "ending in .json" in capsys.readouterr().err
    assert not Path("x.json").exists() and not Path("x.js").exists()


@pytest.mark.parametrize("model", MODELS)
def test_on_multi30k_with_a_trained_smoke_run(tmp_path, monkeypatch, model):
    """The book's rule on the real test set: every 50th of test_2016_flickr, 20 sentences."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files (MULTI30K_DIR)")
    from attnbook.commands.train import train
    train(preset("smoke", model), tmp_path / "smoke", progress=False)
    monkeypatch.chdir(tmp_path)
    assert explorer_command.main(["smoke", "--out", "attention.json"]) == 0
    data = json.loads(Path("attention.json").read_text(encoding="utf-8"))
    check_data(data)
    assert data["meta"]["config"]["model"] == model
    assert [s["index"] for s in data["sentences"]] == list(range(0, 1000, 50))
    assert data["meta"]["test_bleu"] is not None and data["meta"]["steps"] == 20
    # the translations are those of the book's one translate() with the run's settings
    model_, tok, cfg = explorer.load_run(Path("smoke"), "cpu")
    sources = [s["source"] for s in data["sentences"][:6]]
    assert [s["translation"] for s in data["sentences"][:6]] == translate(
        model_, tok, sources, beam_size=explorer.BEAM, alpha=cfg.length_alpha)


def test_the_library_does_not_import_the_explorer():
    """No module names the explorer but itself, its package and the table of commands (which
    names its module as a string, to run it by name)."""
    src = ROOT / "src" / "attnbook"
    for path in src.rglob("*.py"):
        if path.name != "explorer.py" and path not in (src / "book" / "__init__.py",
                                                       src / "commands" / "__init__.py"):
            assert not re.search(r"\bexplorer\b", path.read_text(encoding="utf-8")), path


# ---- The committed data of book/explorer.md ------------------------------------------------------

@pytest.mark.parametrize("path,model",
                         [(COMMITTED, "transformer"), (COMMITTED_GRU, "gru-additive")],
                         ids=["transformer", "gru"])
def test_committed_data_is_consistent(path, model):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert path.stat().st_size < 1_500_000
    check_data(data)
    meta = data["meta"]
    assert [s["index"] for s in data["sentences"]] == list(range(0, 1000, 50))
    assert meta["sentences"].startswith("one in every 50 sentences of Multi30k test_2016_flickr")
    assert meta["config"]["model"] == model and not meta["run"].startswith("/")
    assert data["layers"] >= 1 and data["heads"] >= 1
    js = path.with_suffix(".js").read_text(encoding="utf-8")
    assert js.split(" = ", 1)[0].endswith(f"window.{explorer.js_variable(path)}")
    assert json.loads(js.split(" = ", 1)[1].rstrip().removesuffix(";")) == data
    assert path.with_suffix(".svg").read_text(encoding="utf-8") == explorer.svg_figure(data)
    for p in (path, path.with_suffix(".js"), path.with_suffix(".svg")):
        assert str(ROOT) not in p.read_text(encoding="utf-8")
    assert not [s for s in strings(data) if re.match(r"(/|~|[A-Za-z]:\\)", s)]


# On another arithmetic than the one that wrote the explorers' data, the stored model's last bits
# differ: a beam search with two hypotheses within those bits of each other may pick the other
# (1 of the 20 sentences with PyTorch's AVX2 kernels, and 1 with its plain ones), and a weight
# rounded to 3 decimals may round the other way. At most 3 of 20 sentences may translate
# otherwise, and the weights of the others may move by 0.002 (two rounding steps).
OTHER_TRANSLATIONS, WEIGHT_SLACK = 3, 0.002


def largest_weight_difference(a: dict, b: dict) -> float:
    """The largest difference between two sentences' attention weights (the same shapes)."""
    flat = lambda w: [x for v in w.values() for layer in v for head in layer for row in head  # noqa: E731
                      for x in row]
    return max(abs(x - y) for x, y in zip(flat(a["weights"]), flat(b["weights"])))


@pytest.mark.parametrize("name,path", [("cpu-base", "COMMITTED"), ("gru-additive", "COMMITTED_GRU")])
def test_the_committed_data_regenerate_from_the_stored_model(name, path):
    """Both explorers regenerate from the repository alone: the stored model, read again by the
    command's code (one thread, on the CPU), gives the committed translations and weights, bit
    for bit with the arithmetic that wrote them (meta.made_with), and elsewhere all but a few
    translations and weights within two rounding steps."""
    committed = json.loads(globals()[path].read_text(encoding="utf-8"))
    torch.set_num_threads(1)                        # as the command runs (keep_threads restores)
    data = json.loads(json.dumps(explorer.explore(None, stored=name)))        # as written
    assert data["meta"]["run"] == committed["meta"]["run"] == f"stored model {name}"
    assert data["meta"]["made_with"] == arithmetic()
    assert data["meta"]["weights_of"] == committed["meta"]["weights_of"]     # the page says which
    if committed["meta"]["made_with"] == arithmetic():
        assert data["sentences"] == committed["sentences"]
        return
    same = [(a, b) for a, b in zip(data["sentences"], committed["sentences"])
            if a["translation"] == b["translation"]]
    assert len(committed["sentences"]) - len(same) <= OTHER_TRANSLATIONS, \
        [a["index"] for a, b in zip(data["sentences"], committed["sentences"]) if a != b]
    assert max(largest_weight_difference(a, b) for a, b in same) <= WEIGHT_SLACK


def test_committed_gru_data_is_the_leaderboards_run():
    """bahdanau.json comes from the stored copy (float16) of chapter 10's leaderboard run
    gru-additive, seed 0, trained to the end: its configuration is the board's, its test BLEU the
    board's within 0.1."""
    data = json.loads(COMMITTED_GRU.read_text(encoding="utf-8"))
    meta = data["meta"]
    board = json.loads((ROOT / "results" / "cpu" / "board.json").read_text(encoding="utf-8"))
    entry = next(r for r in board["runs"] if r["model"] == "gru-additive" and r["seed"] == 0)
    assert meta["run"] == "stored model gru-additive"
    assert meta["config"]["preset"] == board["preset"] == "cpu-tiny"
    assert meta["config"]["peak_lr"] == entry["peak_lr"] and meta["config"]["seed"] == 0
    assert meta["steps"] == meta["config"]["max_steps"] == 1200
    assert meta["weights_of"] == STORED_MODELS["gru-additive"][0]
    assert abs(meta["test_bleu"] - entry["test_bleu"]) <= 0.1


def transformer_page_numbers() -> dict:
    """The numbers book/explorer.md quotes from attention.json, by name, recomputed (what
    its numbers-from comment names for tests/drift.py; the test below finds each in its phrase)."""
    import numpy as np
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    S, H, L = data["sentences"], data["heads"], data["layers"]
    by = {s["index"]: s for s in S}

    def W(s, kind, layer, head):
        return np.array(s["weights"][kind][layer][head])

    def mean_cell(i, kind, layer, query, key):          # mean of the heads, first matches
        s = by[i]
        rows = s["next"] if kind == "cross" else s["src"]
        m = np.mean([W(s, kind, layer, h) for h in range(H)], 0)
        q = next(j for j, p in enumerate(rows) if p.strip("\u2581") == query)
        k = next(j for j, p in enumerate(s["src"]) if p.strip("\u2581") == key)
        return float(m[q, k])

    def per_head(f, kind, layer):                        # the mean of f over all rows of a head
        return [float(np.mean(np.concatenate([f(W(s, kind, layer, h)) for s in S])))
                for h in range(H)]

    indices = [s["index"] for s in S]
    sharp = {layer: per_head(lambda w: w.max(1), "cross", layer) for layer in range(L)}
    own = [x for layer in range(L) for x in per_head(np.diag, "enc", layer)]
    prev = per_head(lambda w: np.diag(w, -1), "enc", 1)
    sink = [x for layer in range(L) for x in per_head(lambda w: w[:, 0], "dec", layer)]
    first = per_head(lambda w: w[:, 0], "enc", 0)
    assert all(s["src"][-1] == "." for s in S)           # every source ends in a full stop
    stop = np.mean([W(s, "enc", layer, h)[:, -1].mean() for s in S for layer in range(L)
                    for h in range(H)])
    top = sum(int(np.argmax(W(s, "dec", layer, h).sum(0)) == 0)
              for s in S for layer in range(L) for h in range(H))
    return {
        "steps": data["meta"]["steps"], "sentences": len(S), "every": indices[1] - indices[0],
        "last": indices[-1],
        "cross_sharp_layer1": [min(sharp[0]), max(sharp[0])],
        "cross_sharp_layer2": [min(sharp[1]), max(sharp[1])],
        "orange": mean_cell(0, "cross", 1, "orange", "orangefarbenen"),
        "hat": mean_cell(0, "cross", 1, "hat", "Hut"),
        "its": mean_cell(600, "cross", 1, "its", "Mund"),
        "can_A": mean_cell(200, "cross", 1, "can", "A"),
        "can_Kan": mean_cell(200, "cross", 1, "can", "Kan"),
        "enc_own_position_max": max(own),
        "enc_previous_piece_layer2": [prev[2], prev[1]],          # heads 3 and 2
        "dec_sink": [min(sink), max(sink)], "enc_first_piece_layer1": [min(first), max(first)],
        "sink_most_read": [top, len(S) * L * H],
        "full_stop": float(stop), "even_share": float(np.mean([1 / len(s["src"]) for s in S])),
    }


def test_the_pages_numbers_are_the_committed_datas():
    """book/explorer.md quotes the committed data: each number it quotes is recomputed here."""
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    page = " ".join((ROOT / "book" / "explorer.md").read_text(encoding="utf-8").split())
    n = transformer_page_numbers()
    assert data["meta"]["config"]["preset"] == "cpu-base"
    assert f"{n['steps']:,} steps, about" in page
    assert f"on {n['sentences']} sentences of the Multi30k test set, one in every {n['every']} " \
        f"(numbers 0, {n['every']}, ..., {n['last']};" in page
    (a, b), (c, d) = n["cross_sharp_layer2"], n["cross_sharp_layer1"]
    assert f"{a:.2f} to {b:.2f} on average in its heads, against {c:.2f} to {d:.2f} in layer 1, " \
        f"on this page's {n['sentences']} test sentences" in page
    assert f"*orangefarbenen* ({n['orange']:.2f} in the mean" in page
    assert f"*Hut* ({n['hat']:.2f})" in page
    assert f"(mouth, {n['its']:.2f})" in page
    assert f"*A* ({n['can_A']:.2f})" in page
    assert f"*Kan* ({n['can_Kan']:.2f})" in page
    assert f"no encoder head puts more than {100 * n['enc_own_position_max']:.1f}% of its weight " \
        "on the query's own position" in page
    p3, p2 = n["enc_previous_piece_layer2"]
    assert f"head 3 of layer 2 puts {p3:.2f}" in page and f"same layer {p2:.2f}" in page
    assert 1 / 5 <= n["dec_sink"][0] and n["dec_sink"][1] <= 2 / 5
    assert "between a fifth and two fifths of every head's weight on average" in page
    assert all(abs(x - 1 / 5) < 0.04 for x in n["enc_first_piece_layer1"])
    assert "the first piece (*Ein*, *Eine*), with about a fifth" in page
    top, pairs = n["sink_most_read"]
    assert f"most-read column in {top} of the {pairs}" in page
    assert n["full_stop"] < n["even_share"]
    assert f"it gets {100 * n['full_stop']:.0f}% of the weight on average, less than an even " \
        f"share ({100 * n['even_share']:.0f}%)" in page


def bahdanau_page_numbers() -> dict:
    """The numbers book/explorer_bahdanau.md quotes from bahdanau.json (and, once, from
    attention.json), by name, recomputed (what its numbers-from comment names for
    tests/drift.py; the test below finds each in its phrase)."""
    import numpy as np
    data = json.loads(COMMITTED_GRU.read_text(encoding="utf-8"))
    transformer = json.loads(COMMITTED.read_text(encoding="utf-8"))
    meta, S = data["meta"], data["sentences"]
    by = {s["index"]: s for s in S}
    W = {s["index"]: np.array(s["weights"]["cross"][0][0]) for s in S}     # (rows, columns)

    def find(pieces, word, nth=0):
        return [j for j, p in enumerate(pieces) if p.strip("\u2581") == word][nth]

    def cell(i, query, key, nth=0):      # the nth row labelled ``query``, first column ``key``
        return float(W[i][find(by[i]["next"], query, nth), find(by[i]["src"], key)])

    tops = {i: w[:-1].argmax(1) for i, w in W.items()}                 # without the </s> row
    rows = [r for w in W.values() for r in w]
    sharp = [np.mean(np.concatenate([np.array(s["weights"]["cross"][1][h]).max(1)
                                     for s in transformer["sentences"]]))
             for h in range(transformer["heads"])]
    t0 = transformer["sentences"][0]
    looking = np.mean([np.array(h) for h in t0["weights"]["cross"][-1]], 0)[
        t0["next"].index("\u2581looking")]
    indices = [s["index"] for s in S]
    return {
        "steps": meta["steps"], "test_bleu": meta["test_bleu"], "sentences": len(S),
        "every": indices[1] - indices[0], "last": indices[-1],
        "diagonal_750": [cell(750, q, k) for q, k in DIAGONAL_750],
        "forward": sum(int((np.diff(a) >= 0).sum()) for a in tops.values()),
        "steps_between_rows": sum(len(a) - 1 for a in tops.values()),
        "first_row_not_first": sum(int(w[0].argmax() != 0) for w in W.values()),
        "schreibt": [cell(950, "is", "schreibt"), cell(950, "writing", "schreibt")],
        "Polizist": [cell(550, q, "Polizist") for q in ("pol", "ic", "eman")],
        "Fussballer": [cell(900, "soccer", "Fußball"), cell(900, "players", "Fußball"),
                       cell(900, "players", "er")],
        "largest_weight": float(np.mean([r.max() for r in rows])),
        "band": float(np.mean([r[max(r.argmax() - 1, 0):r.argmax() + 2].sum() for r in rows])),
        "transformer_cross_sharp_layer2": [float(min(sharp)), float(max(sharp))],
        "anstarrt": [cell(0, "fixing", "etwas"), cell(0, "some", "etwas"), cell(0, "k", "ar")],
        "transformer_looking": float(looking.max()),
        "Fahrrad": [cell(800, "bicycle", "Fahrrad", 0), cell(800, "bicycle", "Fahrrad", 1)],
    }


DIAGONAL_750 = [("man", "Mann"), ("sits", "sitzt"), ("bench", "Bank"), ("under", "unter"),
                ("large", "großen"), ("tree", "Baum")]


def test_the_bahdanau_pages_numbers_are_the_committed_datas():
    """book/explorer_bahdanau.md quotes bahdanau.json (and, once, attention.json): each number
    and each "X reads Y" it states is recomputed here."""
    import numpy as np
    data = json.loads(COMMITTED_GRU.read_text(encoding="utf-8"))
    page = " ".join((ROOT / "book" / "explorer_bahdanau.md").read_text(encoding="utf-8").split())
    meta, S = data["meta"], data["sentences"]
    n = bahdanau_page_numbers()
    by = {s["index"]: s for s in S}
    W = {s["index"]: np.array(s["weights"]["cross"][0][0]) for s in S}     # (rows, columns)

    def find(pieces, word, nth=0):
        return [j for j, p in enumerate(pieces) if p.strip("\u2581") == word][nth]

    def cell(i, query, key, nth=0):      # the nth row labelled ``query``, first column ``key``
        return f"{W[i][find(by[i]['next'], query, nth), find(by[i]['src'], key)]:.2f}"

    def brightest(i, query, nth=0):      # the piece of the brightest column of a row
        return by[i]["src"][W[i][find(by[i]["next"], query, nth)].argmax()].strip("\u2581")

    # the model and the sentences
    transformer = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert [s["index"] for s in S] == [s["index"] for s in transformer["sentences"]]
    assert meta["config"]["d_model"] == 128 and meta["steps"] == 1200
    assert f"$d_\\text{{model}} = {meta['config']['d_model']}$, 1,200 training steps" in page
    assert f"a test BLEU of {meta['test_bleu']:.2f} (all 1,000 test sentences, beam search with " \
        "beam 4)" in page
    assert meta["test_bleu_of"].startswith("measured by this command on all 1000 sentences")
    assert meta["decoding"].startswith("beam search, beam 4,")

    # a diagonal
    for (q, k), x in zip(DIAGONAL_750, n["diagonal_750"]):
        assert brightest(750, q) == k
        assert f"*{q}* reads *{k}* ({x:.2f})" in page, (q, k)
    tops = {i: w[:-1].argmax(1) for i, w in W.items()}                 # without the </s> row
    assert f"further right in {n['forward']} of the {n['steps_between_rows']} steps" in page
    assert f"in {n['first_row_not_first']} of the {n['sentences']} sentences its brightest cell " \
        "is not the first" in page
    assert f"one in every {n['every']} of the Multi30k test set (numbers 0, {n['every']}, ..., " \
        f"{n['last']})" in page
    first_a = {i: by[i]["src"][w[0].argmax()] for i, w in W.items()
               if by[i]["next"][0] == "\u2581A"}                      # first rows that write A
    assert [i for i, p in first_a.items() if p == "\u2581Mann"] == [0, 200, 750, 800]
    assert [i for i, p in first_a.items() if p == "\u2581Junge"] == [250, 450]
    assert "*A* reads *Mann* in sentences 0, 200, 750 and 800, and *Junge* in sentences 250 and 450" in page

    # one word, several pieces
    assert brightest(950, "is") == brightest(950, "writing") == "schreibt"
    assert f"*schreibt* ({cell(950, 'is', 'schreibt')} and " \
        f"{cell(950, 'writing', 'schreibt')})" in page
    assert all(brightest(550, q) == "Polizist" for q in ("pol", "ic", "eman"))
    assert "all read *Polizist* ({}, {}, {})".format(
        *(cell(550, q, "Polizist") for q in ("pol", "ic", "eman"))) in page
    assert brightest(900, "soccer") == brightest(900, "players") == "Fußball"
    assert f"*Fußball* ({cell(900, 'soccer', 'Fußball')})" in page
    assert f"the same piece ({cell(900, 'players', 'Fußball')}) and the next one, *er* " \
        f"({cell(900, 'players', 'er')})" in page

    # a blurred band
    assert f"The largest weight of a row is {n['largest_weight']:.2f} on average" in page
    assert f"its two neighbours hold {n['band']:.2f} of a row's weight" in page
    assert "the largest weight of a row is {:.2f} to {:.2f} on average".format(
        *n["transformer_cross_sharp_layer2"]) in page

    # the verb last: sentence 0
    assert by[0]["src"][9:13] == ["\u2581an", "st", "ar", "rt"]
    assert brightest(0, "fixing") == brightest(0, "some") == "etwas"
    assert f"*fixing*, its brightest cell is *etwas* ({cell(0, 'fixing', 'etwas')})" in page
    assert f"*some* reads *etwas* again ({cell(0, 'some', 'etwas')})" in page
    k = find(by[0]["next"], "k")
    assert all(not 9 <= a <= 12 for a in tops[0][:k]) and brightest(0, "k") == "ar"
    assert f"*k* reads *ar* ({cell(0, 'k', 'ar')})" in page
    assert by[0]["translation"].endswith("is fixing some kind.")
    assert 'ends "is fixing some kind"' in page
    t0 = transformer["sentences"][0]
    mean = np.mean([np.array(h) for h in t0["weights"]["cross"][-1]], 0)
    row = mean[t0["next"].index("\u2581looking")]
    assert t0["translation"].endswith("looking at something.") and t0["src"][row.argmax()] == "rt"
    assert f"the last piece of *anstarrt* ({row.max():.2f} in the mean of its heads)" in page

    # read twice, never read: sentences 800 and 900
    assert by[800]["translation"] == "A man rides a bicycle through a bicycle."
    assert brightest(800, "bicycle", 0) == brightest(800, "bicycle", 1) == "Fahrrad"
    assert f"*Fahrrad* ({cell(800, 'bicycle', 'Fahrrad', 0)} and " \
        f"{cell(800, 'bicycle', 'Fahrrad', 1)})" in page
    assert by[800]["src"][8:11] == ["\u2581T", "orb", "ogen"]
    assert all(a not in (8, 9, 10) for a in tops[800][:-1])               # rows writing words
    assert brightest(800, ".") == brightest(800, "</s>") == "orb"
    assert brightest(900, "field", 0) == brightest(900, "field", 1) == "Feld"
