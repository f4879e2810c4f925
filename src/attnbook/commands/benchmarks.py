"""``python -m attnbook benchmarks``: the benchmark suite (appendix Performance).

The command line only: the work is :mod:`attnbook.benchmarks`."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from .. import store
from ..benchmarks.suite import DEFAULT_OUT, SECTIONS, save_plot, section_data
from ..cli import Parser
from ..experiments.registry import save
from ..record import command_line, record


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m attnbook benchmarks",
               description="The book's benchmark suite (appendix Performance).")
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds (the tests run it)")
    p.add_argument("--short", action="store_true",
                   help="the GPU call's budget (python -m attnbook gpu_run): full sizes, but on "
                        "a GPU the training benchmark measures only the paper's base model, "
                        "without fp32 compiled, in 6 rounds")
    p.add_argument("--only", action="append", choices=SECTIONS,
                   help="run only this benchmark (may be repeated)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default results/bench, or a new temporary folder with "
                        "--quick); results go into its cpu/ and cuda/ subfolders, or into OUT "
                        "itself when OUT is named cpu or cuda")
    p.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                   help="all (default): the CPU, and CUDA when PyTorch sees a GPU")
    p.add_argument("--threads", type=int, help="CPU threads (default: PyTorch's choice)")
    p.add_argument("--note", default="", help="a remark stored in every JSON file")
    p.add_argument("--no-plots", action="store_true", help="write the JSON files only")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: redraw the PNG files from the JSON files in OUT")
    args = p.parse_args(argv)
    args.command = command_line("benchmarks", sys.argv[1:] if argv is None else argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    kinds = ["cpu"] if args.device == "cpu" else []
    if args.device in ("all", "cuda"):
        if torch.cuda.is_available():
            kinds.append("cuda")
        elif args.device == "cuda":
            p.error("--device cuda: PyTorch sees no CUDA GPU")
        if args.device == "all":
            kinds.insert(0, "cpu")
    if args.out is not None:
        root = args.out
    elif args.quick:            # tiny sizes: never mixed up with the results the book shows
        root = Path(tempfile.mkdtemp(prefix="attnbook-bench-quick-"))
    else:
        root = DEFAULT_OUT
    saved_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        _run_all(kinds, root, args, p)
    finally:
        torch.set_num_threads(saved_threads)
    return 0


def _run_all(kinds, root, args, p) -> None:
    if args.replot:
        kinds = ["cpu", "cuda"]
    for kind in kinds:
        if root.name in ("cpu", "cuda"):
            if root.name != kind and len(kinds) > 1:
                out = root.parent / kind
            elif root.name != kind:
                p.error(f"--out {root} is named {root.name!r} but the device is {kind}")
            else:
                out = root
        else:
            out = root / kind
        for section in args.only or SECTIONS:
            if args.replot:
                if (out / f"{section}.json").is_file():
                    save_plot(json.loads((out / f"{section}.json").read_text()), out)
                    print(f"redrew {out / (section + '.png')}")
                continue
            print(f"[{kind}] {section} -> {out / (section + '.json')}", flush=True)
            wall = run_section(section, torch.device(kind), out, args)
            print(f"[{kind}] {section}: {wall} s", flush=True)


def run_section(section: str, device: torch.device, out: Path, args) -> float:
    """Run one benchmark on ``device`` into out/SECTION.json (and .png, unless --no-plots), in
    the results format with this call's provenance; its wall time."""
    with record(args.command, threads=torch.get_num_threads(), note=args.note) as call:
        data = section_data(section, device, args.quick, args.short, call)
    written = save("bench", out / f"{section}.json", data, call)
    if not args.no_plots:
        save_plot(store.read(written), out)
    return call.wall_s


if __name__ == "__main__":
    raise SystemExit(main())
