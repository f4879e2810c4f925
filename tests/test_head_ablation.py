"""Head ablation (python -m attnbook head_ablation, book/explorer.md): zeroing a head's slice
before W_o is zeroing W_o's columns of that head, the hooks go away, bad heads are refused, the
losses are the book's validation loss; and the numbers the page quotes are the committed data's."""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import attnbook.experiments.head_ablation as ha
from attnbook.commands import head_ablation as head_ablation_command
from attnbook.batching import TranslationBatches
from attnbook.mha import MultiHeadAttention
from attnbook.training.recipe import preset
from attnbook.commands.train import attention_entropy, validation_loss
from attnbook.transformer import Transformer, TransformerConfig
from test_explorer import PAIRS, make_run

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "cpu" / "head_ablation.json"
TINY = ROOT / "results" / "cpu" / "head_ablation_cpu_tiny"         # seeds 0, 1, 2 of cpu-tiny


@pytest.fixture(autouse=True)
def keep_threads():
    """The command sets one thread; the rest of this test process keeps its own."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def tiny(seed: int = 0) -> Transformer:
    """A random 2-layer Transformer, d_model 16, 4 heads (d_k 4), in eval mode."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=30, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0)
    return Transformer(cfg).eval()


def inputs():
    """Two source and two target sentences with padding: (src, src_mask, tgt, tgt_mask)."""
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 30, (2, 7), generator=g), torch.randint(4, 30, (2, 5), generator=g)
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    tgt_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    return src, src_mask, tgt, tgt_mask


def batches() -> TranslationBatches:
    g = torch.Generator().manual_seed(2)
    lens = [(5, 4), (3, 6), (7, 2), (4, 4), (6, 5)]
    src = [torch.randint(4, 30, (s,), generator=g).tolist() for s, _ in lens]
    tgt = [torch.randint(4, 30, (t,), generator=g).tolist() for _, t in lens]
    return TranslationBatches(src, tgt, max_tokens=16, shuffle=False)


@torch.no_grad()
@pytest.mark.parametrize("name", ["encoder.1.self_attn", "decoder.0.self_attn",
                                  "decoder.1.cross_attn"])
def test_ablating_a_head_is_zeroing_its_columns_of_W_o(name):
    model, x = tiny(), inputs()
    intact = model(*x)
    mha = dict(model.named_modules())[name]
    with ha.ablate(mha, [2]):
        ablated = model(*x)
    zeroed = copy.deepcopy(model)
    dict(zeroed.named_modules())[name].W_o.weight[:, 2 * 4:3 * 4] = 0   # head 2: columns 8..11
    assert torch.allclose(ablated, zeroed(*x), atol=1e-6)
    assert not torch.allclose(ablated, intact, atol=1e-3)               # it did change something
    with ha.ablate(mha, [1]):                                           # another head: another model
        assert not torch.allclose(model(*x), ablated, atol=1e-3)


@torch.no_grad()
def test_the_hook_sees_only_that_heads_slice():
    """Inside the block W_o receives the concatenated heads with head 1's d_k dimensions zero
    and every other dimension as before."""
    model, x = tiny(), inputs()
    mha = model.decoder[1].cross_attn
    seen = []
    grab = mha.W_o.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        model(*x)
        with ha.ablate(mha, [1]):
            model(*x)
    finally:
        grab.remove()
    before, after = seen
    assert torch.equal(after[..., 4:8], torch.zeros_like(after[..., 4:8]))
    keep = [i for i in range(16) if not 4 <= i < 8]
    assert torch.equal(after[..., keep], before[..., keep])
    assert before[..., 4:8].abs().sum() > 0


@torch.no_grad()
def test_hooks_are_removed_afterwards_even_after_an_error():
    model, x = tiny(), inputs()
    before = model(*x)
    mods = ha.attention_modules(model)
    assert len(mods) == 3 * 2 and all(isinstance(m, MultiHeadAttention) for m in mods.values())
    with ha.ablate(mods["enc", 0], [0, 3]), ha.ablate(mods["cross", 1], range(4)):
        assert not torch.allclose(model(*x), before, atol=1e-3)
    with pytest.raises(RuntimeError, match="boom"):
        with ha.ablate(mods["dec", 1], [2]):
            raise RuntimeError("boom")
    assert all(not m.W_o._forward_pre_hooks for m in mods.values())
    assert torch.equal(model(*x), before)


@pytest.mark.parametrize("bad", [4, -1, 1.0, "0"])
def test_a_head_that_does_not_exist_is_a_clear_error(bad):
    model = tiny()
    with pytest.raises(ValueError, match=r"no head .*h = 4 heads, numbered 0 to 3"):
        with ha.ablate(model.encoder[0].self_attn, [0, bad]):
            pass
    assert not model.encoder[0].self_attn.W_o._forward_pre_hooks


def test_sentence_losses_are_the_books_validation_loss():
    model, val = tiny(), batches()
    loss, tokens = ha.sentence_losses(model, val, "cpu")
    assert tokens.tolist() == [5, 7, 3, 5, 6]                          # target + EOS
    assert float(loss.sum() / tokens.sum()) == pytest.approx(validation_loss(model, val, "cpu"),
                                                             rel=1e-5)
    res, base = ha.measure(model, None, val, "cpu", ha.attention_modules(model), {})
    with ha.ablate(model.decoder[0].cross_attn, [3]):
        worse = validation_loss(model, val, "cpu")
    res, _ = ha.measure(model, None, val, "cpu", ha.attention_modules(model),
                        {("cross", 0): [3]}, base)
    assert res["val_loss"] == round(worse, 4)
    assert res["delta_loss"] == pytest.approx(worse - float(base[0].sum() / base[1].sum()),
                                              abs=1e-4)
    assert res["delta_loss_se"] > 0


def test_heatmap_statistics():
    """Entropy per head averages to train.attention_entropy's per-module number (one batch);
    every statistic lies where it must."""
    model = tiny()
    val = TranslationBatches(*([list(range(4, 4 + n)) for n in (5, 3)] for _ in range(2)),
                             max_tokens=64, shuffle=False)
    stats = ha.heatmap_stats(model, val, "cpu")
    want = attention_entropy(model, next(iter(val)))
    for (kind, layer), s in stats.items():
        name = ha.KINDS[kind][1].format(layer)
        assert np.mean(s["entropy"]) == pytest.approx(want[name], abs=2e-4)
        assert all(0 <= e <= math.log(5) + 1e-6 for e in s["entropy"])
        for key in ("max_weight", "diagonal", "first_key"):
            assert all(0 <= v <= 1 for v in s[key])
    # the decoder's first query sees only <s>: at least its share of the first-key weight
    assert all(v >= 1 / 6 - 1e-4 for v in stats["dec", 0]["first_key"])
    assert all(not m.record and m.last is None for m in ha.attention_modules(model).values())


def test_command_on_a_hand_made_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ha, "load_multi30k", lambda split, src, tgt, data_dir=None: PAIRS)
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "runs" / "toy")
    assert head_ablation_command.main(["--run", "runs/toy", "--out", "out/h.json", "--every", "2",
                    "--figure", "out/h.svg"]) == 0
    data = json.loads(Path("out/h.json").read_text(encoding="utf-8"))
    (call,) = data["calls"]                        # its provenance record (attnbook.store)
    assert data["run"] == "runs/toy" and call["command"].endswith("--figure out/h.svg")
    assert len(data["per_head"]) == 3 * data["layers"] * data["heads_per_layer"]
    assert [r["kind"] for r in data["per_kind"]] == ["enc", "dec", "cross"]
    assert "sentences 0, 2, 4, ... (3 sentences" in data["bleu"]
    assert call["hardware"]["cpu_threads"] == 1 and call["threads"] == 1 and call["wall_s"] >= 0
    assert str(tmp_path) not in Path("out/h.json").read_text(encoding="utf-8")
    assert Path("out/h.svg").read_text().lstrip().startswith("<?xml")
    assert head_ablation_command.main(["--run", "runs/none", "--out", "x.json"]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert head_ablation_command.main(["--run", str(tmp_path / "runs/toy"), "--out", "x.json"]) == 2
    assert "relative to the repository" in capsys.readouterr().err
    assert not Path("x.json").exists()


# ---- The committed result of book/explorer.md ----------------------------------------------------

def ranks(x) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


def test_committed_figure_is_the_committed_results(tmp_path):
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert data["calls"][0]["command"].endswith("--figure results/cpu/head_ablation.svg")
    ha.figure(data, tmp_path / "h.svg")
    assert (tmp_path / "h.svg").read_bytes() == COMMITTED.with_suffix(".svg").read_bytes(), \
        "results/cpu/head_ablation.svg is not the figure of head_ablation.json: run the command"


def test_committed_result_is_complete():
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert data["run"] == "runs/cpu-base/medium" and "last 5 snapshots" in data["weights_of"]
    (call,) = data["calls"]
    assert call["command"].startswith("python -m attnbook.head_ablation --run runs/cpu-base/medium")   # as made
    assert len(data["per_head"]) == 3 * data["layers"] * data["heads_per_layer"] == 36
    assert call["hardware"]["cpu_threads"] == 1 and call["wall_s"] > 0
    assert not re.search(r'"(/|~)', COMMITTED.read_text(encoding="utf-8"))
    for r in data["per_head"]:
        assert r["val_loss"] == pytest.approx(data["intact"]["val_loss"] + r["delta_loss"],
                                              abs=2e-4)


def num(x: float, digits: int = 2, sign: bool = False) -> str:
    """A number as the page prints it: a true minus sign, no negative zero."""
    text = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return text.replace("-0." + "0" * digits, "0." + "0" * digits).replace("-", "\u2212")


def span(xs, digits: int = 3, sign: bool = False) -> str:
    return f"{num(min(xs), digits, sign)} to {num(max(xs), digits, sign)}"


def page_numbers(data: dict, tiny: list[dict]) -> dict:
    """Every number book/explorer.md quotes from the committed results, by name; asserts the
    claims the page makes in words."""
    heads, intact = data["per_head"], data["intact"]
    kinds = {r["kind"]: r for r in data["per_kind"]}
    pick = {(r["kind"], r["layer"], r["head"]): r for r in heads}

    def of(kind, layer=None, key="delta_loss", rs=heads):
        return [r[key] for r in rs if r["kind"] == kind and layer in (None, r["layer"])]

    def rho(rs, kind=None):
        rs = [r for r in rs if kind in (None, r["kind"])]
        return np.corrcoef(ranks([r["entropy"] for r in rs]), ranks([r["delta_loss"] for r in rs]))[0, 1]

    d = [r["delta_loss"] for r in heads]
    top2 = sorted(heads, key=lambda r: -r["delta_loss"])[:2]
    assert {(r["kind"], r["layer"], r["head"]) for r in top2} == {("enc", 2, 2), ("enc", 2, 3)}
    sharpest = min(heads, key=lambda r: r["entropy"])
    assert (sharpest["kind"], sharpest["layer"], sharpest["head"]) == ("dec", 1, 2)
    # cross layer 2 is the sharpest cross-attention layer; layer 3 costs more than twice as much
    assert max(of("cross", 2, "entropy")) < min(of("cross", 1, "entropy") + of("cross", 3, "entropy"))
    assert min(of("cross", 3)) > 2 * max(of("cross", 2))
    # in every model, the last layer's cross-attention heads are its costliest cross heads
    for res in [data, *tiny]:
        last = res["layers"]
        assert min(of("cross", last, rs=res["per_head"])) > max(
            r["delta_loss"] for r in res["per_head"] if r["kind"] == "cross" and r["layer"] < last)
    t_last = [x for t in tiny for x in of("cross", t["layers"], rs=t["per_head"])]
    t_first = [x for t in tiny for x in of("cross", 1, rs=t["per_head"])]
    assert min(t_last) >= 5 * max(t_first)
    assert all(len(t["per_head"]) == 24 for t in tiny)
    assert all(rho(t["per_head"], "enc") > 0.5 for t in tiny)
    ratio = lambda res: sum(of("cross", rs=res["per_head"])) / next(  # noqa: E731
        r["delta_loss"] for r in res["per_kind"] if r["kind"] == "cross")
    return {
        "SINGLE_RANGE": span(d, 3, sign=True),
        "SINGLE_PERCENT": f"{100 * max(d) / intact['val_loss']:.1f}%",
        "BLEU_RANGE": span([r["delta_bleu"] for r in heads], 1, sign=True),
        "INTACT_BLEU": num(intact["val_bleu"], 1),
        "ALL_CROSS": num(kinds["cross"]["delta_loss"]),
        "ALL_CROSS_BLEU": num(kinds["cross"]["val_bleu"], 1),
        "ALL_DEC": num(kinds["dec"]["delta_loss"]), "ALL_DEC_BLEU": num(kinds["dec"]["val_bleu"], 1),
        "ALL_ENC": num(kinds["enc"]["delta_loss"]), "ALL_ENC_BLEU": num(kinds["enc"]["val_bleu"], 1),
        "SUM_CROSS": num(sum(of("cross"))),
        "RATIO_CROSS": f"{100 * ratio(data):.0f}%",
        "ENC_22": num(pick["enc", 2, 2]["delta_loss"], 3),
        "ENC_23": num(pick["enc", 2, 3]["delta_loss"], 3),
        "RHO_ALL": num(rho(heads)), "RHO_CROSS": num(rho(heads, "cross")),
        "CROSS2_ENT": span(of("cross", 2, "entropy"), 2), "CROSS2_COST": span(of("cross", 2)),
        "CROSS3_ENT": span(of("cross", 3, "entropy"), 2), "CROSS3_COST": span(of("cross", 3)),
        "DEC12_ENT": f"entropy {num(sharpest['entropy'])} nats",
        "DEC12_COST": f"{num(sharpest['delta_loss'], 3)} nats",
        "DEC1_SINK": span(of("dec", 1, "first_key"), 2),
        "TINY_RHO": ", ".join(num(rho(t["per_head"])) for t in tiny[:2]) + " and "
                    + num(rho(tiny[2]["per_head"])),
        "TINY_ENC_RHO": ", ".join(num(rho(t["per_head"], "enc")) for t in tiny[:2]) + " and "
                        + num(rho(tiny[2]["per_head"], "enc")),
        "TINY_LAST": span(t_last),
        "TINY_RATIO": ", ".join(f"{100 * ratio(t):.0f}%" for t in tiny[:2]) + " and "
                      + f"{100 * ratio(tiny[2]):.0f}%",
    }


def committed() -> tuple[dict, list[dict]]:
    tiny = [json.loads((TINY / f"seed{s}.json").read_text(encoding="utf-8")) for s in range(3)]
    return json.loads(COMMITTED.read_text(encoding="utf-8")), tiny


def quoted_numbers() -> dict:
    """page_numbers of the committed results, with the heads' counts (36 in cpu-base, 24 in each
    cpu-tiny seed): what book/explorer.md's numbers-from comment names for tests/drift.py."""
    data, tiny = committed()
    return {**page_numbers(data, tiny), "HEADS": len(data["per_head"]),
            "TINY_HEADS": sorted({len(t["per_head"]) for t in tiny})}


# The page's sentences with numbers, as templates: each must appear on the page, filled in.
QUOTES = [
    "raises the validation loss by {SINGLE_RANGE} nats (at most {SINGLE_PERCENT} of it), and "
    "greedy BLEU moves by {BLEU_RANGE} points",
    "raises it by {ALL_CROSS} nats and BLEU falls from {INTACT_BLEU} to {ALL_CROSS_BLEU}",
    "All decoder self-attention heads cost {ALL_DEC} (BLEU {ALL_DEC_BLEU}), all encoder "
    "self-attention heads {ALL_ENC} (BLEU {ALL_ENC_BLEU})",
    "add up to {SUM_CROSS} nats, {RATIO_CROSS} of what removing them together costs",
    "the two costliest of all 36 ({ENC_22} and {ENC_23} nats)",
    "a rank correlation of {RHO_ALL} between entropy and loss increase",
    "(mean row entropies {CROSS2_ENT}), costs {CROSS2_COST} nats per head; layer 3, blurrier "
    "({CROSS3_ENT}), costs {CROSS3_COST}, more than twice the costliest head of layer 2",
    "the rank correlation is {RHO_CROSS}: none to speak of",
    "head 2 of the decoder's first layer ({DEC12_ENT}), costs {DEC12_COST}; every head of that "
    "layer parks {DEC1_SINK} of its weight on the `<s>` sink",
    "over all 24 heads, is {TINY_RHO} in the three seeds",
    "({TINY_ENC_RHO}: there the blurrier heads cost more)",
    "in `cpu-tiny`, {TINY_LAST} nats each, at least five times any cross-attention head of layer 1",
    "({TINY_RATIO} of it, against {RATIO_CROSS} in `cpu-base`)",
]


def test_the_pages_numbers_are_the_committed_results():
    """book/explorer.md quotes results/cpu/head_ablation*.json: each number is recomputed here."""
    data, tiny = committed()
    page = " ".join((ROOT / "book" / "explorer.md").read_text(encoding="utf-8").split())
    numbers = page_numbers(data, tiny)
    intact = data["intact"]
    assert f"validation loss of {intact['val_loss']:.3f} nats" in page
    assert f"greedy BLEU of {intact['val_bleu']:.1f}" in page
    assert "all 1014 sentences" in data["loss"] and "all 1,014 validation sentences" in page
    assert "(507 sentences: one in every 2" in data["bleu"] and "(507 sentences;" in page
    assert f"$d_k = {data['d_k']}$" in page
    assert f"about {round(data['calls'][0]['cpu_s'] / 60)} minutes of processor time on one thread" in page
    tiny_cfg = preset("cpu-tiny")
    assert (tiny_cfg.arch.n_layers, tiny_cfg.arch.h, tiny_cfg.arch.dropout) == (2, 4, 0.0)
    assert "(2 + 2 layers, 4 heads, no dropout; their last checkpoints)" in page
    assert all(t["weights_of"] == "the last checkpoint" for t in tiny)
    for quote in QUOTES:
        assert quote.format(**numbers) in page, quote
    for t in tiny:
        assert t["run"].startswith("runs/ablations/base/transformer_") and t["bleu"] is None
    assert [t["run"][-15:] for t in tiny] == [f"seed{s}_steps1200" for s in range(3)]
