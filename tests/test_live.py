"""The translator page's model (attnbook.book.live): the ONNX graphs translate as the package
does, switch heads off as the head ablations do, return the attention weights the package
records, and the export's manifest names what it wrote."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbook.batching import pad
from attnbook.book import live
from attnbook.data import load_multi30k
from attnbook.decoding import translate
from attnbook.experiments.head_ablation import ablate
from attnbook.training.runs import RunError, load_stored
from attnbook import store
from attnbook.commands import live as live_command
from twice import merged_again, recording

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"),
                                reason="needs the Multi30k files (MULTI30K_DIR)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The stored cpu-base model as fp32 and fp16 graphs, and the model itself."""
    work = tmp_path_factory.mktemp("live")
    model, tok, _ = load_stored("cpu-base")
    live.export_fp32(model, work / "fp32")
    live.write_form(work / "fp32", "fp16", work / "fp16")
    return work, model, tok


@pytest.fixture(scope="module")
def test_sentences():
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files (MULTI30K_DIR)")
    return [s for s, _ in load_multi30k("test_2016_flickr")[:64]]


@pytest.mark.parametrize("form,beam", [("fp32", 1), ("fp32", 4), ("fp16", 1)])
def test_the_graphs_translate_64_test_sentences_as_the_package_does(exported, test_sentences,
                                                                    form, beam):
    """fp16 too: the stored weights are float16 already, so storing them so loses nothing.
    (The committed live.json compares all 1,000 test sentences: `python -m attnbook run live`.)"""
    work, model, tok = exported
    ours = translate(live.OnnxTranslator(work / form), tok, test_sentences, beam, device="cpu")
    assert ours == translate(model, tok, test_sentences, beam, device="cpu")


def test_the_graphs_return_the_attention_weights_the_package_records(exported):
    work, model, tok = exported
    onnx = live.OnnxTranslator(work / "fp32")
    short = tok.encode("Ein Mann.")
    src, mask = pad([tok.encode("Zwei Hunde spielen im Schnee."), short])   # (2, S), padded
    tgt = torch.tensor([[2, 40, 41, 42], [2, 50, 51, 3]])
    S = src.shape[1]
    memory = onnx.encode(src, mask)
    logits = onnx.decode(tgt, memory, mask)
    with torch.no_grad():
        ref_memory = model.encode(src, mask)
        ref_logits, ref_cross = model.decode_with_attention(tgt, ref_memory, mask)
    assert torch.allclose(memory, ref_memory, atol=1e-4) and torch.allclose(logits, ref_logits, atol=1e-3)
    L, h = len(model.encoder), model.cfg.h
    assert onnx.last["enc"].shape == (2, L, h, S, S) and onnx.last["self"].shape == (2, L, h, 4, 4)
    assert torch.allclose(onnx.last["cross"], torch.stack(ref_cross, 1), atol=1e-5)
    for w in onnx.last.values():                       # each row: a distribution over the keys
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    assert len(short) < S and (onnx.last["enc"][1, ..., len(short):] == 0).all()   # nor padding
    assert (torch.triu(onnx.last["self"][0], diagonal=1) == 0).all()   # nor the future


@pytest.mark.parametrize("kind,layer,head", [("cross", 1, 2), ("self", 0, 0), ("enc", 2, 3)])
def test_a_head_switched_off_in_the_graph_is_the_head_ablation(exported, kind, layer, head):
    work, model, tok = exported
    onnx = live.OnnxTranslator(work / "fp32")
    onnx.heads[kind][layer, head] = 0.0
    module = {"enc": model.encoder[layer].self_attn, "self": model.decoder[layer].self_attn,
              "cross": model.decoder[layer].cross_attn}[kind]
    sentences = ["Ein Mann mit einem roten Hut spielt Gitarre.", "Zwei Kinder laufen am Strand."]
    src = torch.tensor([tok.encode(sentences[0])])
    tgt = torch.tensor([[2] + tok.encode("A man in a red hat plays guitar.")])
    logits = onnx.decode(tgt, onnx.encode(src, src != 0), src != 0)
    with torch.no_grad(), ablate(module, [head]):
        ref = model.decode(tgt, model.encode(src, src != 0), src != 0)
        ref_text = translate(model, tok, sentences, 4, device="cpu")
    with torch.no_grad():
        intact = model.decode(tgt, model.encode(src, src != 0), src != 0)
    assert torch.allclose(logits, ref, atol=1e-3) and not torch.allclose(logits, intact, atol=1e-2)
    assert translate(onnx, tok, sentences, 4, device="cpu") == ref_text


def test_the_forms_shrink_and_int8_stays_close(exported, tmp_path):
    work, model, tok = exported
    live.write_form(work / "fp32", "int8", tmp_path / "int8")
    size = {f: sum((d / f"{g}.onnx").stat().st_size for g in live.GRAPHS)
            for f, d in (("fp32", work / "fp32"), ("fp16", work / "fp16"), ("int8", tmp_path / "int8"))}
    assert size["int8"] < 0.6 * size["fp16"] < 0.6 * size["fp32"]
    sentences = ["Ein Hund rennt über eine grüne Wiese.", "Eine Frau liest ein Buch im Park."]
    assert translate(live.OnnxTranslator(tmp_path / "int8"), tok, sentences, 1, device="cpu") == \
        translate(model, tok, sentences, 1, device="cpu")        # these two, at least
    with pytest.raises(ValueError, match="unknown form 'int4'"):
        live.write_form(work / "fp32", "int4", tmp_path / "x")


def test_int8_weights_round_each_matrix_and_compute_in_float32(exported, tmp_path):
    """The page's form: every matrix stored as int8 with a scale per row, within half a step of
    the float32 weight, turned back into float32 in the graph; no integer arithmetic."""
    import onnx
    from onnx import numpy_helper
    work, model, tok = exported
    live.write_form(work / "fp32", "int8-weights", tmp_path / "w8")
    for g in live.GRAPHS:
        before = {i.name: numpy_helper.to_array(i) for i in onnx.load(work / "fp32" / f"{g}.onnx").graph.initializer}
        graph = onnx.load(tmp_path / "w8" / f"{g}.onnx").graph
        after = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        matrices = [n for n, w in before.items() if w.ndim == 2 and w.dtype == np.float32]
        assert matrices and all(n not in after for n in matrices)
        for n in matrices:
            q, scale = after[n + "_int8"], after[n + "_scale"]
            assert q.dtype == np.int8 and scale.shape == (before[n].shape[0],)
            assert np.abs(q * scale[:, None] - before[n]).max() <= scale.max() / 2 + 1e-7
        ops = {node.op_type for node in graph.node}
        assert "DequantizeLinear" in ops and not ops & {"MatMulInteger", "DynamicQuantizeLinear"}
    assert sum((tmp_path / "w8" / f"{g}.onnx").stat().st_size for g in live.GRAPHS) < \
        0.3 * sum((work / "fp32" / f"{g}.onnx").stat().st_size for g in live.GRAPHS)
    sentences = ["Ein Hund rennt über eine grüne Wiese.", "Eine Frau liest ein Buch im Park."]
    assert translate(live.OnnxTranslator(tmp_path / "w8"), tok, sentences, 1, device="cpu") == \
        translate(model, tok, sentences, 1, device="cpu")


def test_with_no_cross_attention_every_source_gets_the_same_translation(exported):
    """What the page says: with every cross-attention head off the decoder cannot read the
    source, so two different sentences get the same English one."""
    work, model, tok = exported
    onnx = live.OnnxTranslator(work / "fp32")
    sentences = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                 "Zwei Kinder spielen im Schnee, während ihr Hund über die Wiese läuft."]
    intact = translate(onnx, tok, sentences, 1, device="cpu")
    onnx.heads["cross"][:] = 0.0
    blind = translate(onnx, tok, sentences, 1, device="cpu")
    assert intact[0] != intact[1] and blind[0] == blind[1] and blind[0] not in intact


# How far a constant of a fresh export may be from the committed one. The graphs' constants are
# the stored weights (copied, or rounded to int8 the same way everywhere) and the sinusoidal
# position table, which positional.py computes in float32 with the processor's exp and sin: their
# last bits differ between processors (an Intel Xeon's AVX-512 against the AMD EPYC that made the
# files: 2,717 of the 512 x 192 entries, by up to 1.5e-5, where position x frequency carries exp's
# last bit into sin's argument). A real change (another model, a wrong export, another rounding)
# moves constants by far more than 1e-4.
CONSTANT_TOL = 1e-4


def _constants(graph) -> dict:
    """{name: array} of a graph's initializers and of its nodes' tensor attributes."""
    from onnx import AttributeProto, numpy_helper
    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                out[f"{node.output[0]}.{a.name}"] = numpy_helper.to_array(a.t)
    return out


def _structure(graph) -> list:
    """A graph without its tensors' values: inputs, outputs, and every node's operator, inputs,
    outputs and attributes (a tensor attribute as its type and shape)."""
    from onnx import AttributeProto, helper

    def attribute(a):
        return (a.name, (a.t.data_type, tuple(a.t.dims)) if a.type == AttributeProto.TENSOR
                else helper.get_attribute_value(a))
    return [[str(v) for v in graph.input], [str(v) for v in graph.output],
            [(n.op_type, list(n.input), list(n.output), [attribute(a) for a in n.attribute])
             for n in graph.node]]


def graph_difference(committed: Path, fresh: Path, tol: float = CONSTANT_TOL) -> str:
    """'' when the ONNX files are the same model: the same structure, the same constants (names,
    types, shapes), integers equal and floats within ``tol``; else the first difference."""
    import onnx
    a, b = onnx.load(committed).graph, onnx.load(fresh).graph
    if _structure(a) != _structure(b):
        return "the graphs' nodes, inputs or outputs differ"
    ca, cb = _constants(a), _constants(b)
    if list(ca) != list(cb):
        return f"the constants differ: {sorted(set(ca) ^ set(cb))[:3]}"
    for name, x in ca.items():
        y = cb[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{name}: {x.dtype}{x.shape} committed, {y.dtype}{y.shape} fresh"
        floating = np.issubdtype(x.dtype, np.floating)
        if np.array_equal(x, y, equal_nan=floating):
            continue
        finite = np.isfinite(x)
        if not floating or not np.array_equal(finite, np.isfinite(y)) \
                or not np.array_equal(x[~finite], y[~finite], equal_nan=True):
            return f"{name}: differs where it must be equal (integers, infinities, NaN)"
        gap = float(np.max(np.abs(x[finite].astype(np.float64) - y[finite])))
        if gap > tol:
            return f"{name}: differs by {gap:.3g} (allowed: {tol:g})"
    return ""


@needs_data
def test_the_committed_page_model_is_what_export_writes(tmp_path):
    """book/_static/translator/model is the export of the form live.json chose: its files are
    those its manifest names, byte for byte; a fresh export writes the same manifest, the same
    tokenizer and extras, and graphs that are the same model (their float32 constants within
    CONSTANT_TOL: another processor's exp and sin)."""
    committed = live.ROOT_MODEL
    manifest = json.loads((committed / "manifest.json").read_text())
    chosen = json.loads((live.RESULTS / "live.json").read_text())["chosen"]
    assert manifest["form"] == chosen
    for name, info in manifest["files"].items():
        assert live.sha256(committed / name) == info["sha256"], name
    fresh = live.export(tmp_path / "page", chosen)
    graphs = [f"{g}.onnx" for g in live.GRAPHS]
    text_only = lambda m: {**m, "files": {k: v for k, v in m["files"].items() if k not in graphs}}  # noqa: E731
    assert text_only(fresh) == text_only(manifest)
    for name in graphs:
        assert graph_difference(committed / name, tmp_path / "page" / name) == "", name


def test_graph_difference_finds_a_changed_constant_and_a_changed_node(exported, tmp_path):
    """The comparison by meaning fails where the model is not the same: a weight moved by 1e-3,
    an operator replaced; it passes a position table moved by 1e-5 (another processor)."""
    import onnx
    from onnx import numpy_helper
    work = exported[0]
    fp32 = work / "fp32" / "encoder.onnx"
    assert graph_difference(fp32, fp32) == ""

    def changed(edit, name):
        model = onnx.load(fp32)
        edit(model.graph)
        onnx.save(model, tmp_path / name)
        return graph_difference(fp32, tmp_path / name)

    def nudge(by):
        def edit(graph):
            t = max(graph.initializer, key=lambda t: np.prod(t.dims))      # the largest constant
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + np.float32(by), t.name))
        return edit
    assert changed(nudge(1e-5), "near.onnx") == ""
    assert "differs by 0.001" in changed(nudge(1e-3), "far.onnx")

    def swap_op(graph):
        node = next(n for n in graph.node if n.op_type == "Relu")
        node.op_type = "Sigmoid"
    assert changed(swap_op, "op.onnx") == "the graphs' nodes, inputs or outputs differ"


@needs_data
def test_export_writes_the_page_files_and_a_manifest_of_their_sums(tmp_path):
    manifest = live.export(tmp_path / "page", "fp16")
    files = sorted(p.name for p in (tmp_path / "page").iterdir())
    assert files == ["decoder.onnx", "encoder.onnx", "extras.json", "manifest.json", "tokenizer.json"]
    assert json.loads((tmp_path / "page" / "manifest.json").read_text()) == manifest
    assert (manifest["form"], manifest["n_layers"], manifest["h"]) == ("fp16", 3, 4)
    for name, info in manifest["files"].items():
        assert info == {"bytes": (tmp_path / "page" / name).stat().st_size,
                        "sha256": live.sha256(tmp_path / "page" / name)}
    model, tok, _ = load_stored("cpu-base")
    vocab = json.loads((tmp_path / "page" / "tokenizer.json").read_text())
    assert [p[0] for p in vocab["pieces"]] == [tok.sp.id_to_piece(i) for i in range(len(tok))]
    assert vocab["unk_id"] == 1 and vocab["model_sha256"] == live.sha256(tok.model_file)


def test_a_folder_without_the_graphs_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match="no encoder.onnx; export the model first"):
        live.OnnxTranslator(tmp_path)


@needs_data
def test_score_compares_every_form_with_pytorch(tmp_path, monkeypatch):
    """`python -m attnbook live score`, tiny: every form against PyTorch, written as a result
    (a second identical call leaves the file as it was)."""
    saves = recording(monkeypatch)
    assert live_command.main(["score", "--out", str(tmp_path / "work"), "--results", str(tmp_path),
                              "--sentences", "8"]) == 0
    assert merged_again(saves) == ["live"]
    result = store.read(tmp_path / "live.json")
    assert set(result["forms"]) == {"pytorch", *live.FORMS}
    torch_bleu = result["forms"]["pytorch"]["beam 4, alpha 0.6"]["bleu"]
    for form in ("fp32", "fp16"):
        for key in ("beam 4, alpha 0.6", "greedy"):
            row = result["forms"][form][key]
            assert row["same_as_pytorch"] == 8 and row["bleu"] == result["forms"]["pytorch"][key]["bleu"]
    assert result["chosen"] in live.FORMS
    chosen = result["forms"][result["chosen"]]
    assert abs(chosen["beam 4, alpha 0.6"]["bleu"] - torch_bleu) <= 0.5
    assert np.all([result["forms"][f]["gzip_bytes"] < result["forms"][f]["bytes"] for f in live.FORMS])


# --- the page's tokenizer (book/_static/translator/tokenizer.js), run by node -----------------

TOKENIZER_JS = Path(__file__).resolve().parents[1] / "book" / "_static" / "translator" / "tokenizer.js"
HARD = ["Straße über Öl, Ärger und Übermut: 1234,56 € (zwölf %)!", "  viel   Leerraum\tund\nZeilen  ",
        "Emoji 🙂 und 漢字 und ½ und ﬁ Ligatur", "ÀÉÎÕÜ ñ ç ß ẞ", "x", "–—…·•", "",
        "(Klammern) [eckig] {geschweift} «Anführung» „deutsch“ 'einfach' \"doppelt\"",
        "Ein Mann\u00a0mit\u2003Hut", "e\u0301 (e und ein Akzent für sich)", "<s> </s> <pad> <unk>"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (Debian: apt-get install nodejs)")
def test_the_pages_tokenizer_encodes_as_sentencepiece_does(tmp_path):
    """1,000 test sentences and 1,000 training sentences, and text made to be hard: the same ids."""
    _, tok, _ = load_stored("cpu-base")
    if os.environ.get("MULTI30K_DIR"):
        sentences = [s for s, _ in load_multi30k("test_2016_flickr")]
        sentences += [s for s, _ in load_multi30k("train")[::29][:1000]]
    else:
        sentences = []
    sentences += HARD
    (tmp_path / "vocab.json").write_text(json.dumps(live.vocabulary(tok.model_file), ensure_ascii=False))
    (tmp_path / "in.json").write_text(json.dumps(sentences, ensure_ascii=False))
    script = (f"const {{BookTokenizer}} = require({json.dumps(str(TOKENIZER_JS))});"
              "const fs = require('fs'); const d = process.argv[1];"
              "const t = new BookTokenizer(JSON.parse(fs.readFileSync(d + '/vocab.json', 'utf8')));"
              "const s = JSON.parse(fs.readFileSync(d + '/in.json', 'utf8'));"
              "fs.writeFileSync(d + '/out.json', JSON.stringify(s.map((x) => [t.encode(x), "
              "t.decode(t.encode(x))])));")
    subprocess.run(["node", "-e", script, str(tmp_path)], check=True, timeout=120)
    got = json.loads((tmp_path / "out.json").read_text())
    wrong = [(s, ids) for s, (ids, _) in zip(sentences, got) if ids != tok.sp.encode(s)]
    assert not wrong, wrong[:3]
    undecoded = [(text, tok.decode(ids)) for ids, text in got if text != tok.decode(ids)]
    assert not undecoded, undecoded[:5]                             # and decodes as the package
    assert len(sentences) >= (2000 if os.environ.get("MULTI30K_DIR") else 1) + len(HARD) - 1


def test_the_committed_scores_say_what_the_page_says():
    """book/translator.md: float32 and float16 translate all 1,000 test sentences as PyTorch;
    both int8 forms are about a quarter of float32's size; the rule chose int8 weights."""
    result = json.loads((live.RESULTS / "live.json").read_text())
    forms, beam = result["forms"], "beam 4, alpha 0.6"
    assert result["test_set"] == "test_2016_flickr (1000 of 1000 sentences)"
    for form in ("fp32", "fp16"):
        assert all(forms[form][k]["same_as_pytorch"] == 1000 for k in (beam, "greedy"))
    for form in ("int8-weights", "int8"):
        assert 0.25 < forms[form]["bytes"] / forms["fp32"]["bytes"] < 0.3
    assert result["chosen"] == "int8-weights"
    assert abs(forms["int8-weights"][beam]["bleu"] - forms["pytorch"][beam]["bleu"]) <= 0.5
