"""How the experiments score a trained run, beyond BLEU: what more than one experiment command
uses (``translators``' sweep, board and cpu-base search; ``evening``).

* :func:`output_stats` (and :func:`repeats`): how often translations run long or loop.
* :func:`score_base_run`: a long run's BLEU against training minutes, and checkpoint averaging
  chosen on the validation set (the ``cpu-base`` recipe's scoring).
* :func:`paired_bootstrap`: sacreBLEU's paired bootstrap for every two models of a set of runs,
  seed with seed; :func:`merge_bootstrap`, its rows after a merging call.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from ..batching import TranslationBatches
from ..bleu import bleu
from ..data import load_multi30k
from ..decoding import translate
from ..training.loop import validation_loss
from ..training.runs import average_checkpoints, load_checkpoint, snapshot_files
from .sweeps import open_run


def repeats(text: str) -> bool:
    """Whether a translation loops: a word three times running ("winter winter winter") or a
    group of 2 to 4 words said twice back to back ("wearing hats, wearing hats"). Captions
    repeat words ("a man in a ... in a ..."), but not back to back."""
    w = text.lower().replace(",", " ").replace(".", " ").split()
    if any(w[i] == w[i + 1] == w[i + 2] for i in range(len(w) - 2)):
        return True
    return any(w[i:i + n] == w[i + n:i + 2 * n] for n in (2, 3, 4) for i in range(len(w) - 2 * n + 1))


def output_stats(hyps: list[str], refs: list[str]) -> dict:
    too_long = sum(len(h.split()) > 2 * len(r.split()) for h, r in zip(hyps, refs))
    return {"too_long_frac": round(too_long / len(hyps), 4),
            "repeats_frac": round(sum(map(repeats, hyps)) / len(hyps), 4),
            "length_ratio": round(sum(len(h.split()) for h in hyps) / sum(len(r.split()) for r in refs), 3)}


AVERAGE_LAST = 5      # checkpoint averaging: the mean of the last k snapshots, k = 1..5,
AVERAGE_SPAN = 0.15   # of those in the last 15% of the steps (Vaswani et al.: the last 5 of 100k)


def score_base_run(job) -> dict:
    """BLEU against training minutes, and checkpoint averaging, for one candidate.

    * The snapshots before the averaging window, and the last checkpoint: test BLEU (beam
      search) and validation loss, with the training minutes they took.
    * The average of the last k snapshots, k = 1 .. AVERAGE_LAST, of those in the last
      AVERAGE_SPAN of the steps: validation loss; the k with the lowest is chosen, and scored
      (validation and test BLEU with beam search; test BLEU greedy too).
    The test translations (``hypotheses``, ``greedy_hypotheses``) are for the caller to drop.
    """
    folder, model, tok, cfg, test, device = open_run(job, "test_2016_flickr")
    val = load_multi30k("val", cfg.src_lang, cfg.tgt_lang, job[2])[:job[3] or None]
    val_batches = TranslationBatches(tok.encode_batch([s for s, _ in val]),
                                     tok.encode_batch([t for _, t in val]), cfg.max_tokens,
                                     shuffle=False)

    def scores(pairs):
        hyps = translate(model, tok, [s for s, _ in pairs], beam_size=cfg.beam_size,
                         alpha=cfg.length_alpha)
        return hyps, bleu(hyps, [t for _, t in pairs])

    files = snapshot_files(folder, cfg.max_steps)
    window = [f for f in files if f[0] >= (1 - AVERAGE_SPAN) * cfg.max_steps][-AVERAGE_LAST:]
    curve = [f for f in files if f not in window[:-1]]
    snapshots = []
    for step, f in curve:
        ckpt = load_checkpoint(f, device)
        model.load_state_dict(ckpt["model"])
        snapshots.append({"step": step, "train_minutes": round(ckpt["elapsed"] / 60, 2),
                          "val_loss": round(validation_loss(model, val_batches, device), 4),
                          "test_bleu": scores(test)[1]["bleu"]})
    averages = []
    for k in range(1, len(window) + 1):
        model.load_state_dict(average_checkpoints([f for _, f in window[-k:]]))
        averages.append({"last_k": k, "steps": [s for s, _ in window[-k:]],
                         "val_loss": round(validation_loss(model, val_batches, device), 4)})
    best = min(averages, key=lambda a: a["val_loss"])
    model.load_state_dict(average_checkpoints([f for _, f in window[-best["last_k"]:]]))
    _, val_result = scores(val)
    hyps, result = scores(test)
    greedy = translate(model, tok, [s for s, _ in test], beam_size=1)
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"config": asdict(cfg), "parameters": metrics["parameters"],
            "train_time_s": metrics["train_time_s"], "tokens_per_s": metrics["tokens_per_s"],
            "threads": metrics["threads"], "epochs": round(metrics["epochs"], 2),
            "precision": metrics.get("precision", "fp32"),          # what the run trained in
            "snapshots": snapshots, "averages": averages, "chosen_last_k": best["last_k"],
            "val_bleu": val_result["bleu"], "test_bleu": result["bleu"],
            "greedy_test_bleu": bleu(greedy, [t for _, t in test])["bleu"],
            "bleu_signature": result["signature"], **output_stats(hyps, [t for _, t in test]),
            "hypotheses": hyps, "greedy_hypotheses": greedy}


score_base_run.version = 2       # greedy as well as beam search for the chosen average


def at_end(row: dict) -> dict:
    """A score_base_run row's test translations as paired_bootstrap reads them: at its run's
    own end (runs compared for the same minutes train different numbers of steps)."""
    return {"end": {"beam": row["hypotheses"], "greedy": row["greedy_hypotheses"]}}


def paired_bootstrap(runs: list[dict], refs: list[str], models, n_samples: int = 1000) -> list[dict]:
    """sacreBLEU's paired bootstrap resampling (Koehn, 2004) for every two models of ``runs``
    (in the order of ``models``: the first is the baseline), seed with seed, at every step both
    were scored, for beam search and greedy: each one's BLEU with its 95% confidence interval
    (half-width) and the p-value of the difference (sacreBLEU's: the share of 1,000 resampled test
    sets on which the difference is at least as far from its mean as the real one, plus one)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest
    by = {(r["model"], r["seed"]): r for r in runs}
    rows = []
    for i, a in enumerate(models):
        for b in models[i + 1:]:
            for seed in sorted({r["seed"] for r in runs}):
                ra, rb = by.get((a, seed)), by.get((b, seed))
                if ra is None or rb is None:
                    continue
                for step in [s for s in ra["hypotheses_at_step"] if s in rb["hypotheses_at_step"]]:
                    for decoding in ("beam", "greedy"):
                        test = PairedTest([(a, ra["hypotheses_at_step"][step][decoding]),
                                           (b, rb["hypotheses_at_step"][step][decoding])],
                                          {"BLEU": BLEU()}, [refs], test_type="bs",
                                          n_samples=n_samples)
                        _, res = test()
                        sa, sb = res["BLEU"]
                        rows.append({"a": a, "b": b, "seed": seed, "step": step,
                                     "decoding": decoding, "bleu_a": round(sa.score, 2),
                                     "bleu_b": round(sb.score, 2), "ci_a": round(sa.ci, 2),
                                     "ci_b": round(sb.ci, 2), "p_value": round(sb.p_value, 4)})
    return rows


def merge_bootstrap(old: list[dict], new: list[dict]) -> list[dict]:
    """A result file's bootstrap rows after a merging call: the call's pairs of models are its
    own (its rows replace the old rows of the same two models), every other pair is kept."""
    pairs = {(r["a"], r["b"]) for r in new}
    return [r for r in old if (r["a"], r["b"]) not in pairs] + new
