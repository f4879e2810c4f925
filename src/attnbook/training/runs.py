"""Run folders (chapter 9): checkpoints written atomically and loaded safely, a trained run's
model and tokenizer, the log kept to one line per evaluation, checkpoint averaging, and the
trained models stored in the package (:func:`load_stored`).

A run folder written by ``python -m attnbook train`` holds ``checkpoint.pt`` (model, optimizer,
schedule, data position and random states), ``tokenizer.model``, ``config.json`` (the run's
configuration, written when the command starts), ``log.jsonl`` (one line per evaluation),
``metrics.json`` and, if asked for, ``snapshots/step_N.pt`` (weights only).

A missing, damaged or foreign file raises :class:`RunError` (a ValueError; a missing one is also a
FileNotFoundError) whose one-line message names the file and the fix.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from .recipe import TrainConfig, build_model, differences, upgrade_config
from ..tokenizer import Tokenizer, TokenizerError
from ..utils import get_device


class RunError(ValueError):
    """A run folder or checkpoint that cannot be used; the message names the file and the fix."""


class MissingRunFile(RunError, FileNotFoundError):
    """A file of a run folder (or the folder) does not exist."""


def _reason(e: Exception) -> str:
    """The first sentence of an exception, for a one-line message: 'EOFError', 'KeyError: 101'."""
    first = str(e).strip().split("\n")[0].split(". ")[0].strip(" .")
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def save_checkpoint(path: Path, **state) -> None:
    """Write atomically: an interruption during the write never leaves half a checkpoint."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device="cpu",
                    missing: str = "train a run first with `python -m attnbook train`") -> dict:
    """Load safely: ``weights_only=True`` refuses anything but tensors and plain containers.

    A missing file raises MissingRunFile "no checkpoint at PATH; ``missing``" (the fix for the
    caller: train's ``--resume`` and a run to translate with need different ones); a damaged,
    truncated or foreign file raises RunError.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingRunFile(f"no checkpoint at {path}; {missing}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError (a cut zip archive), EOFError, KeyError
        raise RunError(f"{path} is not a readable checkpoint ({_reason(e)}): it is damaged or "
                       "truncated (an interrupted copy?) or was not written by attnbook.commands.train; "
                       "copy it again from where the run was trained, or train the run again"
                       ) from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise RunError(f"{path} holds no model weights: it was not written by attnbook.commands.train; "
                       "give the checkpoint.pt of a run folder")
    return ckpt


def check_resumable(ckpt: dict, cfg: dict, world: int, path: Path) -> None:
    """Raise RunError, naming each option that differs, unless checkpoint ``ckpt`` (read from
    ``path``) was trained with configuration ``cfg`` (up to recipe.EXTENDABLE) by ``world``
    processes: resuming with other options would silently train another run."""
    diff = [f"{k}: checkpoint {saved}, asked {asked}"
            for k, (saved, asked) in differences(ckpt["config"], cfg).items()]
    saved = upgrade_config(ckpt["config"])
    if saved["schedule"] == "cosine" and saved["max_steps"] != cfg["max_steps"]:
        diff.append(f"max_steps: checkpoint {saved['max_steps']}, asked {cfg['max_steps']} (a "
                    "cosine schedule ends at its max_steps, so its run cannot be extended)")
    if ckpt.get("world_size", 1) != world:
        diff.append(f"processes: checkpoint {ckpt.get('world_size', 1)}, asked {world}")
    if diff:
        raise RunError(f"{path} was trained with another configuration ({'; '.join(diff)}); "
                       "resume with the options it was trained with (preset, flags and "
                       "--nproc_per_node), or train into a new --out folder")


def trim_log(path: Path, step: int) -> None:
    """Keep the lines of ``log.jsonl`` up to ``step`` (the checkpoint's), atomically.

    A run killed after writing a log line but before its checkpoint would otherwise log those
    steps twice once resumed, and a line cut by the crash is not JSON: both go, so the log keeps
    one line per evaluation. A fresh run (step 0) starts an empty log."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            pass
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep), encoding="utf-8")
    os.replace(tmp, path)


def snapshot_files(run: Path, last_step: int) -> list[tuple[int, Path]]:
    """(step, file) of a run's weight snapshots (``snapshots/step_N.pt``) before ``last_step``,
    and its checkpoint at ``last_step``, in order of steps."""
    snaps = []
    for f in (Path(run) / "snapshots").glob("step_*.pt"):
        step = int(f.stem.removeprefix("step_"))
        if step < last_step:
            snaps.append((step, f))
    return [*sorted(snaps), (last_step, Path(run) / "checkpoint.pt")]


def load_run(run: Path, device=None, average: int = 1):
    """The model, tokenizer and config of a run folder written by ``python -m attnbook train``;
    with ``average`` = k > 1, the model's weights are the mean of its last k snapshots
    (the checkpoint and the k - 1 snapshots before it: checkpoint averaging).

    Raises RunError (MissingRunFile for a missing folder or file) naming the file and the fix.
    """
    run = Path(run)
    device = device or get_device()
    train_one = (f"train one with `python -m attnbook train --preset cpu-tiny --out {run}`, "
                 "or use a model the package stores (the commands' --stored "
                 f"{'|'.join(sorted(STORED_MODELS))}; load_stored(name) in Python)")
    if not run.is_dir():
        raise MissingRunFile(f"{run} is not a run folder; {train_one}")
    path = run / "checkpoint.pt"
    ckpt = load_checkpoint(path, device, missing=f"give the folder of a trained run, or {train_one}")
    if "config" not in ckpt:
        raise RunError(f"{path} holds weights only (a snapshot?), not a run's checkpoint: "
                       "give a run folder whose checkpoint.pt was written by attnbook.commands.train")
    tok_path = run / "tokenizer.model"
    copy = "copy the run's tokenizer.model from where it was trained (a model works with its own only)"
    if not tok_path.is_file():
        raise MissingRunFile(f"no tokenizer at {tok_path}; {copy}")
    try:
        tok = Tokenizer(tok_path)
    except TokenizerError:
        raise RunError(f"{tok_path} is not a tokenizer of attnbook (damaged, or another "
                       f"sentencepiece model); {copy}") from None
    cfg = TrainConfig.from_dict(ckpt["config"])
    if tok.vocab_size != cfg.arch.vocab_size:
        raise RunError(f"{tok_path} has {tok.vocab_size} pieces but the model of {path} was "
                       f"trained with {cfg.arch.vocab_size}: it is another run's tokenizer; {copy}")
    model = build_model(cfg).to(device)
    model.load_state_dict(ckpt["model"])
    if average > 1:
        files = snapshot_files(run, ckpt["step"])
        if len(files) < average:
            raise RunError(f"cannot average the last {average} snapshots of {run}: it has "
                           f"{len(files)} (steps {', '.join(str(s) for s, _ in files)}); ask for "
                           "fewer, or train with more snapshot_steps (--set snapshot_steps=...)")
        model.load_state_dict(average_checkpoints([f for _, f in files[-average:]]))
    return model.eval(), tok, cfg


def average_checkpoints(paths) -> dict:
    """The element-wise mean of the ``model`` weights saved in ``paths`` (checkpoint averaging,
    Vaswani et al., 2017, section 6.1: the base model averages its last 5 checkpoints). Every
    file must hold the same parameters with the same shapes."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: no checkpoints given")
    total = None
    for p in paths:
        sd = load_checkpoint(p)["model"]
        if total is None:
            total = {k: v.double().clone() for k, v in sd.items()}
            dtypes = {k: v.dtype for k, v in sd.items()}
            continue
        if sd.keys() != total.keys() or any(sd[k].shape != total[k].shape for k in sd):
            raise ValueError(f"{p} holds other parameters than {paths[0]}: "
                             "average checkpoints of one run only")
        for k, v in sd.items():
            total[k] += v.double()
    return {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}


# ---------------------------------------------------------------------------------------------
# Trained models stored in the package: what the chapters load instead of training for minutes

STORED = Path(__file__).resolve().parents[1] / "stored"       # attnbook/stored/NAME/
STORED_FILES = ("weights.pt", "config.json", "tokenizer.model")
# NAME -> (what it is, the sha256 of each of its files): a changed or damaged file is refused
STORED_MODELS: dict[str, tuple[str, dict[str, str]]] = {
    "cpu-tiny": ("chapter 9's cpu-tiny Transformer, seed 0, 1,200 steps (results/cpu/board.json), "
                 "float16",
                 {"weights.pt": "4086927d2761cec900eedbbf06d439993bf2c4811cebb953cbcc00cfc7f17d92",
                  "config.json": "37511d460bf2a7152519a40f08e5c5268b3a6d41d8969f0f19d239843f18f789",
                  "tokenizer.model": "65f1be612c80ae7fa14ee317dae6933e8889c9ac3f34d461c7fa2b9fa4defe60"}),
    "cpu-base": ("chapter 11's cpu-base model (medium), the mean of its last five snapshots "
                 "(results/cpu/cpu_base.json), float16",
                 {"weights.pt": "8492c20a6cc238646638c4d1e028f99cf93d5c2b8f3c633fe079213fdc579888",
                  "config.json": "3354bc7ee001c7d2af1b5a7b6ff2b52588ad585cd82d7ca179eb8ec90dc84c04",
                  "tokenizer.model": "24d7c0d2be643287abe73ea6b4120f0b1d8705dfd324162aa9f5ea9221096242"}),
    "gru-additive": ("chapter 10's GRU with additive attention, seed 0, 1,200 steps (results/cpu/board.json), "
                     "float16",
                     {"weights.pt": "9fa0973e444ea203beff843dfc46000618e334da2682f6983e878098e4aed52c",
                      "config.json": "a41647bd79b6975ff559beb205ee47f87910a4914e91e88bc23ead4247ff4675",
                      "tokenizer.model": "65f1be612c80ae7fa14ee317dae6933e8889c9ac3f34d461c7fa2b9fa4defe60"}),
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def store_run(run: Path, dest: Path, average: int = 1, dtype=torch.float16) -> dict[str, str]:
    """Write a run's model into ``dest`` (a folder) as the package stores it: ``weights.pt``
    (the weights only, in ``dtype``; with ``average`` = k, the mean of its last k snapshots),
    ``config.json`` and ``tokenizer.model``. Returns the sha256 of each file, for STORED_MODELS."""
    model, _, cfg = load_run(run, "cpu", average=average)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    converted, weights = {}, {}          # tied weights (one tensor under several names) stay one
    for k, v in model.state_dict().items():
        if v.data_ptr() not in converted:
            converted[v.data_ptr()] = v.to(dtype) if v.is_floating_point() else v
        weights[k] = converted[v.data_ptr()]
    torch.save(weights, dest / "weights.pt")
    (dest / "config.json").write_text(json.dumps(asdict(cfg), indent=1, sort_keys=True) + "\n")
    (dest / "tokenizer.model").write_bytes((Path(run) / "tokenizer.model").read_bytes())
    return {f: _sha256(dest / f) for f in STORED_FILES}


def load_stored(name: str, device=None, folder: Path | None = None):
    """(model, tokenizer, config) of a trained model stored in the package, in float32 and in
    evaluation mode, ready to translate with :func:`attnbook.decoding.translate`:
    ``load_stored("cpu-tiny")`` is chapter 9's cpu-tiny Transformer (seed 0, 1,200 steps),
    ``load_stored("cpu-base")`` chapter 11's cpu-base model (the mean of its last five snapshots),
    ``load_stored("gru-additive")`` the leaderboard's GRU with additive attention (seed 0), the
    model of the page of Bahdanau's attention (book/explorer_bahdanau.md).

    Every file is checked against its sha256 (STORED_MODELS) and the weights load with
    ``weights_only=True``. ``folder``: another copy of the files (the tests). Raises RunError,
    naming the file and the fix, for an unknown name or a missing or changed file."""
    if name not in STORED_MODELS:
        raise RunError(f"no stored model {name!r}; the package stores "
                       f"{', '.join(sorted(STORED_MODELS)) or 'none'}")
    folder = Path(folder) if folder is not None else STORED / name
    for f, digest in STORED_MODELS[name][1].items():
        path = folder / f
        if not path.is_file():
            raise MissingRunFile(f"{path} is missing; reinstall the package (pip install -e .) or "
                                 "restore the file from the book's repository (git checkout)")
        if _sha256(path) != digest:
            raise RunError(f"{path} is not the stored file (its sha256 differs): it was changed or "
                           "damaged; restore it from the book's repository (git checkout)")
    cfg = TrainConfig.from_dict(json.loads((folder / "config.json").read_text()))
    weights = torch.load(folder / "weights.pt", map_location="cpu", weights_only=True)
    model = build_model(cfg)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()})
    return model.to(device or get_device()).eval(), Tokenizer(folder / "tokenizer.model"), cfg
