"""The book's translator as ONNX graphs, for the page that runs it in the reader's browser
(book/translator.md): an encoder graph and a decoder graph that return every layer's attention
weights and take a factor per head, so that the page can switch heads off.

    python -m attnbook live export --out book/_static/translator/model   # the page's model
    python -m attnbook live score --out runs/live --results results/cpu  # every form's BLEU

The graphs (``encoder.onnx``, ``decoder.onnx``; FORMS: fp32, and smaller forms of the same
weights) have these inputs and outputs, with the book's names (book/notation.md; L layers, h
heads; a mask is True at real tokens):

* encoder: ``src`` (B, S) int64, ``src_mask`` (B, S) bool, ``enc_heads`` (L, h) float
  -> ``memory`` (B, S, d_model), ``enc_attention`` (B, L, h, S, S);
* decoder: ``tgt`` (B, T) int64 (BOS first), ``memory``, ``src_mask``, ``self_heads`` and
  ``cross_heads`` (L, h) float -> ``logits`` (B, T, V), ``self_attention`` (B, L, h, T, T),
  ``cross_attention`` (B, L, h, T, S).

A head factor multiplies that head's output before W_o mixes the heads (``mha.scaling_heads``):
1 keeps it, 0 switches it off. The decoder reads the whole prefix at every step (no key/value
cache): for a sentence of 20 tokens that costs little, and the graph stays the model's own
forward pass. :class:`OnnxTranslator` puts the graphs behind the package's decoding
(``attnbook.decoding.translate``), so Python and the page decode the same graphs.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn

from .. import __version__
from ..bleu import bleu
from ..data import load_multi30k
from ..decoding import translate
from ..mha import recording, scaling_heads
from ..training.runs import RunError, load_stored

FORMS = ("fp32", "fp16", "int8-weights", "int8")   # int8: dynamic quantisation (onnxruntime)
# The forms whose products and sums are float32 (their weights are stored smaller and turned back
# into float32), smallest first: the page may use these only. Dynamic int8 rounds the activations
# to 8 bits too, in integer kernels that differ between x86 and WebAssembly, and the page and
# Python then translate some sentences differently.
FLOAT_ARITHMETIC = ("int8-weights", "fp16", "fp32")
OPSET = 17
GRAPHS = ("encoder", "decoder")
RESULTS = Path(__file__).resolve().parents[3] / "results" / "cpu"
ROOT_MODEL = Path(__file__).resolve().parents[3] / "book" / "_static" / "translator" / "model"


class _Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, src_mask, enc_heads):
        mods = [b.self_attn for b in self.model.encoder]
        with ExitStack() as stack:
            for i, m in enumerate(mods):
                stack.enter_context(scaling_heads(m, enc_heads[i]))
            with recording(mods):
                memory = self.model.encode(src, src_mask)                  # (B, S, d_model)
                weights = torch.stack([m.last[0] for m in mods], dim=1)    # (B, L, h, S, S)
        return memory, weights


class _Decoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tgt, memory, src_mask, self_heads, cross_heads):
        own = [b.self_attn for b in self.model.decoder]
        cross = [b.cross_attn for b in self.model.decoder]
        with ExitStack() as stack:
            for i, (a, c) in enumerate(zip(own, cross)):
                stack.enter_context(scaling_heads(a, self_heads[i]))
                stack.enter_context(scaling_heads(c, cross_heads[i]))
            with recording(own + cross):
                logits = self.model.decode(tgt, memory, src_mask)          # (B, T, V)
                w_self = torch.stack([m.last[0] for m in own], dim=1)      # (B, L, h, T, T)
                w_cross = torch.stack([m.last[0] for m in cross], dim=1)   # (B, L, h, T, S)
        return logits, w_self, w_cross


def export_fp32(model, folder: Path) -> None:
    """encoder.onnx and decoder.onnx of ``model`` (an encoder-decoder Transformer) in ``folder``,
    with dynamic batch and lengths (traced on a short example)."""
    import warnings
    model = model.eval()
    L, h = len(model.encoder), model.cfg.h
    src, tgt = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[2, 9, 10]])
    mask, heads = src != 0, torch.ones(L, h)
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")      # the tracer's notes on the shape checks it freezes
        memory = model.encode(src, mask)
        torch.onnx.export(_Encoder(model).eval(), (src, mask, heads), folder / "encoder.onnx",
                          input_names=["src", "src_mask", "enc_heads"],
                          output_names=["memory", "enc_attention"], opset_version=OPSET,
                          dynamic_axes={"src": {0: "B", 1: "S"}, "src_mask": {0: "B", 1: "S"},
                                        "memory": {0: "B", 1: "S"},
                                        "enc_attention": {0: "B", 3: "S", 4: "S"}}, dynamo=False)
        torch.onnx.export(_Decoder(model).eval(), (tgt, memory, mask, heads, heads),
                          folder / "decoder.onnx",
                          input_names=["tgt", "memory", "src_mask", "self_heads", "cross_heads"],
                          output_names=["logits", "self_attention", "cross_attention"],
                          opset_version=OPSET,
                          dynamic_axes={"tgt": {0: "B", 1: "T"}, "memory": {0: "B", 1: "S"},
                                        "src_mask": {0: "B", 1: "S"}, "logits": {0: "B", 1: "T"},
                                        "self_attention": {0: "B", 3: "T", 4: "T"},
                                        "cross_attention": {0: "B", 3: "T", 4: "S"}}, dynamo=False)
    model.eval()                     # the exporter restores the wrappers' (training) mode


def fp16_weights(src: Path, dest: Path) -> None:
    """The graph at ``src`` with its large float32 weights stored as float16 and cast back to
    float32 when the graph runs: half the bytes, the same arithmetic on the weights' values."""
    import onnx
    from onnx import helper, numpy_helper
    graph_model = onnx.load(src)
    graph = graph_model.graph
    casts = []
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) >= 2:
            half = numpy_helper.from_array(numpy_helper.to_array(init).astype("float16"),
                                           init.name + "_fp16")
            init.CopyFrom(half)
            casts.append(helper.make_node("Cast", [init.name], [init.name[:-5]],
                                          to=onnx.TensorProto.FLOAT))
    for node in reversed(casts):
        graph.node.insert(0, node)
    onnx.save(graph_model, dest)


def int8_weights(src: Path, dest: Path) -> None:
    """The graph at ``src`` with its large float32 weights stored as int8, one scale per row
    (symmetric, scale = max |w| / 127), and turned back into float32 by DequantizeLinear when
    the graph runs: a quarter of the bytes, and every product and sum still in float32, so that
    Python's onnxruntime and the page's WebAssembly build compute the same numbers (dynamic
    quantisation, the ``int8`` form, also rounds the activations, in integer kernels that
    differ between the two)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    graph_model = onnx.load(src)
    graph = graph_model.graph
    nodes = []
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2:
            w = numpy_helper.to_array(init)                                   # (rows, cols)
            scale = np.abs(w).max(axis=1) / 127
            scale[scale == 0] = 1
            q = np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8)
            name = init.name
            init.CopyFrom(numpy_helper.from_array(q, name + "_int8"))
            graph.initializer.extend([
                numpy_helper.from_array(scale.astype(np.float32), name + "_scale"),
                numpy_helper.from_array(np.zeros(len(scale), np.int8), name + "_zero")])
            nodes.append(helper.make_node("DequantizeLinear",
                                          [name + "_int8", name + "_scale", name + "_zero"],
                                          [name], axis=0))
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.save(graph_model, dest)


def write_form(fp32: Path, form: str, dest: Path) -> None:
    """``form`` of the fp32 graphs in folder ``fp32`` into folder ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for g in GRAPHS:
        if form == "fp32":
            (dest / f"{g}.onnx").write_bytes((fp32 / f"{g}.onnx").read_bytes())
        elif form == "fp16":
            fp16_weights(fp32 / f"{g}.onnx", dest / f"{g}.onnx")
        elif form == "int8-weights":
            int8_weights(fp32 / f"{g}.onnx", dest / f"{g}.onnx")
        elif form == "int8":
            import logging
            from onnxruntime.quantization import QuantType, quantize_dynamic
            logging.getLogger().setLevel(logging.ERROR)   # its advice to pre-process: a CNN's
            quantize_dynamic(fp32 / f"{g}.onnx", dest / f"{g}.onnx", weight_type=QuantType.QInt8)
        else:
            raise ValueError(f"unknown form {form!r}; choose one of {', '.join(FORMS)}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class OnnxTranslator(nn.Module):
    """The exported graphs in folder ``folder`` with the interface of the book's Transformer that
    ``attnbook.decoding`` uses: ``encode(src, src_mask)`` and ``decode(tgt_in, memory, src_mask,
    cache=None)`` -> logits (B, T, V). With a cache (incremental decoding) it keeps the prefix
    in ``cache["ids"]`` and runs the decoder on all of it. ``heads``: {"enc"|"self"|"cross":
    (L, h) factors}, all 1 unless set. Decode on the CPU (``device="cpu"``)."""

    def __init__(self, folder: Path, threads: int = 1):
        super().__init__()
        import onnxruntime as ort
        folder = Path(folder)
        missing = [g for g in GRAPHS if not (folder / f"{g}.onnx").is_file()]
        if missing:
            raise RunError(f"{folder} has no {missing[0]}.onnx; export the model first "
                           "(python -m attnbook live export --out FOLDER)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
        self.sessions = {g: ort.InferenceSession(str(folder / f"{g}.onnx"), opts,
                                                 providers=["CPUExecutionProvider"])
                         for g in GRAPHS}
        shape = self.sessions["encoder"].get_inputs()[2].shape           # (L, h)
        self.heads = {k: torch.ones(*shape) for k in ("enc", "self", "cross")}
        self.last = {}                  # the attention weights of the latest call of each graph

    def encode(self, src, src_mask):
        memory, w = self.sessions["encoder"].run(None, {
            "src": src.numpy(), "src_mask": src_mask.numpy(),
            "enc_heads": self.heads["enc"].numpy()})
        self.last["enc"] = torch.from_numpy(w)
        return torch.from_numpy(memory)                                  # (B, S, d_model)

    def decode(self, tgt_in, memory, src_mask, cache=None):
        if cache is not None:
            cache["ids"] = tgt_in if "ids" not in cache else torch.cat([cache["ids"], tgt_in], 1)
        ids = tgt_in if cache is None else cache["ids"]                  # (B, t)
        logits, w_self, w_cross = self.sessions["decoder"].run(None, {
            "tgt": ids.numpy(), "memory": memory.numpy(), "src_mask": src_mask.numpy(),
            "self_heads": self.heads["self"].numpy(), "cross_heads": self.heads["cross"].numpy()})
        self.last.update(self=torch.from_numpy(w_self), cross=torch.from_numpy(w_cross))
        return torch.from_numpy(logits)[:, -tgt_in.shape[1]:]            # (B, T, V)


def vocabulary(model_file: Path) -> dict:
    """What the page's tokenizer (book/_static/translator/tokenizer.js) reads from a
    sentencepiece model: every piece with its score and type (1 normal, 2 unknown, 3 control),
    the unknown id, and the model's sha256."""
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    spec = proto.normalizer_spec
    if (proto.trainer_spec.model_type, spec.name, spec.add_dummy_prefix,
            spec.remove_extra_whitespaces, proto.trainer_spec.byte_fallback) != \
            (2, "nmt_nfkc", True, True, False):
        raise ValueError(f"{model_file} is not a sentencepiece model with the book's settings "
                         "(BPE, nmt_nfkc, a dummy prefix, no byte fallback): the page's tokenizer "
                         "implements those only")
    return {"pieces": [[p.piece, p.score, p.type] for p in proto.pieces],
            "unk_id": proto.trainer_spec.unk_id, "model_sha256": sha256(Path(model_file))}


EXAMPLES = range(0, 1000, 50)     # test sentences 0, 50, ..., 950: the attention page's rule


def page_extras() -> dict:
    """What the page shows beside the model: its example sentences (test_2016_flickr, EXAMPLES)
    and the committed head ablation of each head (results/cpu/head_ablation.json)."""
    test = load_multi30k("test_2016_flickr")
    ablation = json.loads((RESULTS / "head_ablation.json").read_text())
    keep = ("kind", "layer", "head", "delta_loss", "delta_bleu")
    return {"examples": [{"index": i, "source": test[i][0], "reference": test[i][1]} for i in EXAMPLES],
            "examples_rule": "test_2016_flickr sentences 0, 50, ..., 950, as on the attention page",
            "ablation": {"of": "results/cpu/head_ablation.json: " + ablation["ablation"],
                         "loss": ablation["loss"], "bleu": ablation["bleu"],
                         "per_head": [{k: r[k] for k in keep} for r in ablation["per_head"]]}}


def export(out: Path, form: str = "fp32", stored: str = "cpu-base") -> dict:
    """The stored model ``stored`` as ``form`` graphs in ``out``, with its tokenizer
    (tokenizer.json), the page's extras (extras.json) and a manifest (manifest.json: the form,
    the model's shape, every file's bytes and sha256). Returns the manifest."""
    model, tok, _ = load_stored(stored)
    with tempfile.TemporaryDirectory() as tmp:
        export_fp32(model, Path(tmp))
        write_form(Path(tmp), form, out)
    (out / "tokenizer.json").write_text(json.dumps(vocabulary(tok.model_file), ensure_ascii=False))
    (out / "extras.json").write_text(json.dumps(page_extras(), ensure_ascii=False, indent=1) + "\n")
    files = {f: {"bytes": (out / f).stat().st_size, "sha256": sha256(out / f)}
             for f in ("encoder.onnx", "decoder.onnx", "tokenizer.json", "extras.json")}
    manifest = {"model": stored, "form": form, "n_layers": len(model.encoder), "h": model.cfg.h,
                "d_model": model.cfg.d_model, "vocab_size": model.cfg.vocab_size,
                "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3}, "opset": OPSET,
                "attnbook": __version__, "files": files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def gzip_bytes(path: Path) -> int:
    """What a server's gzip sends for the file (level 6): the page weight of a cold visit."""
    import gzip
    return len(gzip.compress(path.read_bytes(), compresslevel=6))


def score_forms(work: Path, sentences: int = 0, beam: int = 4, stored: str = "cpu-base") -> dict:
    """Every form of ``stored``'s graphs scored on test_2016_flickr (its first ``sentences``;
    0: all) with beam search and greedily, beside the PyTorch model: BLEU, translations equal
    to PyTorch's, seconds, bytes; and the chosen form, the smallest of FLOAT_ARITHMETIC whose
    beam BLEU is within 0.5 of PyTorch's."""
    model, tok, _ = load_stored(stored)
    pairs = load_multi30k("test_2016_flickr")[:sentences or None]
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    keys = {beam: f"beam {beam}, alpha 0.6", 1: "greedy"}
    rows, reference = {"pytorch": {}}, {}
    for b, key in keys.items():
        start = time.perf_counter()
        reference[b] = translate(model, tok, srcs, b, device="cpu")
        rows["pytorch"][key] = {"bleu": bleu(reference[b], refs)["bleu"],
                                "seconds": round(time.perf_counter() - start, 1)}
    export_fp32(model, work / "fp32")
    for form in FORMS:
        write_form(work / "fp32", form, work / form)
        onnx, rows[form] = OnnxTranslator(work / form), {}
        for b, key in keys.items():
            start = time.perf_counter()
            hyps = translate(onnx, tok, srcs, b, device="cpu")
            rows[form][key] = {"bleu": bleu(hyps, refs)["bleu"],
                               "same_as_pytorch": sum(h == r for h, r in zip(hyps, reference[b])),
                               "seconds": round(time.perf_counter() - start, 1)}
        rows[form]["bytes"] = sum((work / form / f"{g}.onnx").stat().st_size for g in GRAPHS)
        rows[form]["gzip_bytes"] = sum(gzip_bytes(work / form / f"{g}.onnx") for g in GRAPHS)
    best = rows["pytorch"][keys[beam]]["bleu"]
    chosen = next(f for f in FLOAT_ARITHMETIC
                  if abs(rows[f][keys[beam]]["bleu"] - best) <= 0.5)
    return {"model": stored, "test_set": f"test_2016_flickr ({len(pairs)} of 1000 sentences)",
            "rule": "the smallest form that computes in float32 (so that the page and Python "
                    "translate alike) whose beam-search BLEU is within 0.5 of PyTorch's",
            "signature": bleu(reference[beam], refs)["signature"], "forms": rows, "chosen": chosen}
