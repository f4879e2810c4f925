"""Training a translator on Multi30k German->English (chapter 9), and its command line.

    python -m attnbook train --preset cpu-tiny --out runs/cpu-tiny          # a few minutes on a CPU
    python -m attnbook train --preset cpu-base --out runs/cpu-base          # an evening on a laptop
    python -m attnbook train --preset gpu-base --out runs/gpu-base          # the full run, on a GPU
    python -m attnbook train --preset gpu-base --out runs/gpu-base --resume # after an interruption

The loop itself (and ``prepare_data``, ``validation_loss``, ``attention_entropy``) is the library
module ``training``, re-exported here. The forward pass runs in the precision the device
supports (``--precision`` forces one), and ``--compile`` compiles the model with
``torch.compile`` (on any device; on a CPU it needs a C++ compiler).

The run folder also gets ``config.json`` (the command's final configuration). The command's
options (``--d-model``, ``--set KEY=VALUE``, ...) and its one-line errors are in ``cli``.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from ..cli import Parser, UsageError, fail
from ..training.options import add_common, add_recipe, apply_common, config_from_args
from ..data import DataError
from ..training.runs import RunError, check_resumable, load_checkpoint
from ..tokenizer import TokenizerError
from ..training.loop import (Data, Run, attention_entropy, distributed, prepare_data,  # noqa: F401
                       train, validation_loss)
from ..experiments.registry import EXPERIMENTS, save
from ..record import command_line, record
from ..utils import choose_precision


def main(argv: list[str] | None = None) -> int:
    """The command: parse the options, check them, record config.json and train. Every mistake
    of the user's is one line ``error: <problem>; <fix>`` and exit status 2 (``attnbook.cli``)."""
    p = Parser(prog="python -m attnbook train",
               description="Train a translator on Multi30k (de->en). The recipe options override "
                           "the preset's values; the run records the final configuration in "
                           "OUT/config.json.")
    p.add_argument("--out", type=Path, required=True, help="run folder")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--result", type=Path, metavar="FILE",
                   help="also write the run's measurements (its metrics.json) as the result file "
                        "FILE of experiment --name, with this call's provenance")
    p.add_argument("--name", help="with --result: the experiment of the registry it belongs to "
                                  "(python -m attnbook run --list; the book's: timing_2threads)")
    add_common(p, "preset", "device", "threads", "data-dir")
    add_recipe(p)
    args = p.parse_args(argv)
    if args.result and args.result.is_absolute():
        p.error("give --result relative to the repository (the command is recorded in the "
                "result, which must not name folders of the machine that made it)")
    if bool(args.result) != bool(args.name):
        p.error("give --result FILE and --name EXPERIMENT together (python -m attnbook run "
                "--list names the experiments)")
    if args.name and args.name not in EXPERIMENTS:
        p.error(f"--name {args.name}: no such experiment (python -m attnbook run --list)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        device = apply_common(args)
        cfg = config_from_args(args)
        try:
            precision = choose_precision(device, cfg.precision)   # bf16 on a GPU without it: an error
        except ValueError as e:
            raise UsageError(f"--precision: {e}") from None
        if args.resume:                                # before anything is written or prepared
            if not (args.out / "checkpoint.pt").is_file():
                raise UsageError(f"--resume: no checkpoint in {args.out}; train first, or drop "
                                 "--resume")
            check_resumable(load_checkpoint(args.out / "checkpoint.pt"), asdict(cfg), world,
                            args.out / "checkpoint.pt")
    except (UsageError, RunError) as e:
        return fail(e)
    if int(os.environ.get("RANK", "0")) == 0:   # one line: the precision this run trains in, and why
        print(f"precision: {precision.name} ({precision.reason})", flush=True)
    try:
        if int(os.environ.get("RANK", "0")) == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    except OSError as e:
        return fail(f"--out {args.out} cannot be written ({e.strerror or e}); give a folder you "
                    "can write to")
    if world > 1:  # started by torchrun: one process per GPU (or per CPU share, with gloo)
        import torch.distributed as dist
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        typed = command_line("train", sys.argv[1:] if argv is None else argv)
        with record(typed) if args.result else nullcontext() as call:
            metrics = train(cfg, args.out, resume=args.resume, data_dir=args.data_dir,
                            device=device)
    except (DataError, TokenizerError, RunError) as e:  # a missing or damaged file, a bad vocab
        return fail(e)
    finally:
        if world > 1:
            dist.destroy_process_group()
    if "test_bleu" not in metrics:  # ranks other than 0 report nothing
        return 0
    if args.result:
        save_result(args.name, args.result, metrics, call)
    print(json.dumps({k: metrics[k] for k in ("preset", "steps", "train_time_s", "tokens_per_s",
                                               "val_loss", "test_bleu", "bleu_signature")}, indent=2))
    return 0


# The run's own record of its provenance in metrics.json, which moves into the call's.
RUN_PROVENANCE = ("hardware", "date", "threads", "processes")


def save_result(name: str, target: Path, metrics: dict, call) -> None:
    """The run's measurements as the result ``target`` of experiment ``name``: the call that
    trained it, with the threads, processes and hardware the run recorded."""
    call.threads, call.processes = metrics.get("threads"), metrics.get("processes", 1)
    call.hardware = metrics.get("hardware", call.hardware)
    data = {k: v for k, v in metrics.items() if k not in RUN_PROVENANCE}
    print(f"wrote {save(name, target, data, call)}")


if __name__ == "__main__":
    sys.exit(main())
