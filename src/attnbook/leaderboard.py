"""One harness for every model of the book (chapter 9), and its command line.

    python -m attnbook.leaderboard --preset cpu-tiny --out runs/board-cpu --results results/cpu
    python -m attnbook.leaderboard --preset gpu-base --out runs/board-gpu --results results/gpu

The GRU encoder-decoder without attention (chapter 1), with additive attention (chapter 2) and
with dot-product attention (chapter 3), and the Transformer (chapter 8) are trained on the same
data with the same tokenizer, batches and number of steps (``python -m attnbook.train`` with
``--model``), decoded by the same beam search and scored by the same sacreBLEU. Into --results
it writes ``leaderboard.json`` (per model: BLEU with its signature, parameters, training time,
tokens/s, BLEU by source length; the hardware, versions and total wall time) and
``bleu_by_length.png``. A model whose run folder already has its metrics is not trained again,
so an interrupted leaderboard continues where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .data import load_multi30k
from .evaluate import bleu_by_length
from .train import MODELS, PRESETS, preset, same_run, train
from .utils import get_device, versions


def run_model(cfg, out: Path, data_dir=None, device=None, progress=True) -> dict:
    """Train one model (or reuse a finished run of the same configuration); its leaderboard row."""
    metrics_file = out / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
    if metrics is None or not same_run(metrics["config"], asdict(cfg)) \
            or metrics["steps"] != cfg.max_steps or "test_bleu" not in metrics:
        resume = (out / "checkpoint.pt").is_file() and metrics is None
        try:
            metrics = train(cfg, out, resume=resume, data_dir=data_dir, device=device,
                            progress=progress)
        except ValueError:  # a checkpoint of another configuration: start this model afresh
            metrics = train(cfg, out, resume=False, data_dir=data_dir, device=device,
                            progress=progress)
    hyps = (out / "test_hypotheses.txt").read_text().splitlines()
    pairs = load_multi30k("test_2016_flickr", cfg.src_lang, cfg.tgt_lang, data_dir)[:len(hyps)]
    keep = ("parameters", "steps", "epochs", "train_time_s", "tokens_per_s", "val_loss",
            "test_bleu", "bleu_signature", "test_set", "decoding", "device")
    return {"model": cfg.model, **{k: metrics[k] for k in keep},
            "bleu_by_length": bleu_by_length(hyps, pairs),
            "examples": [{"source": s, "reference": t, "hypothesis": h}
                         for (s, t), h in list(zip(pairs, hyps))[:5]]}


def build_board(preset_name: str, runs: dict, data_dir, device, command: str) -> dict:
    """Train (or reuse) each model of ``runs`` (model name -> run folder) and collect their rows
    with the hardware, versions, wall time and load average: the content of a results JSON."""
    start = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)   # other programs slow the timings down
    entries = [run_model(preset(preset_name, m), folder, data_dir, device)
               for m, folder in runs.items()]
    return {"preset": preset_name, "device": str(device), "hardware": versions(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "wall_time_s": round(time.perf_counter() - start, 1),
            "load_average": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
            "command": command, "entries": entries}


def write_plot(board: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import plot_bleu_by_length, use_book_style

    use_book_style()
    fig, ax = plt.subplots(figsize=(7, 4))
    hw = board["hardware"]
    where = hw.get("gpu") or hw.get("cpu") or board["device"]
    plot_bleu_by_length(board["entries"], ax=ax,
                        title=f"BLEU against source length ({board['preset']}, {where})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnbook.leaderboard",
                                description="Train and score every model of the book on Multi30k.")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny")
    p.add_argument("--out", type=Path, required=True, help="folder for the runs (one per model)")
    p.add_argument("--results", type=Path, required=True,
                   help="folder for leaderboard.json and bleu_by_length.png")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--device", help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--data-dir", help="folder with the Multi30k files (default: $MULTI30K_DIR or the cache)")
    args = p.parse_args(argv)
    try:
        device = get_device(args.device)
    except (RuntimeError, ValueError) as e:
        p.error(str(e))
    board = build_board(args.preset, {m: args.out / m for m in args.models}, args.data_dir,
                        device, "python -m attnbook.leaderboard " + " ".join(argv or sys.argv[1:]))
    entries = board["entries"]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "leaderboard.json").write_text(json.dumps(board, indent=2) + "\n")
    write_plot(board, args.results / "bleu_by_length.png")
    for e in entries:
        print(f"{e['model']:>14}  BLEU {e['test_bleu']:5.2f}  params {e['parameters']:>10,}  "
              f"train {e['train_time_s']:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
