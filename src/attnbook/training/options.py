"""The command-line options that name what the recipe knows: a preset, a device, threads, the
data folder, checkpoint averaging (:func:`add_common`), and every field of a
:class:`~attnbook.training.recipe.TrainConfig` (:func:`add_recipe`, train's options).

The recipe options override the preset's values (``--d-model 256 --layers 3``); ``--set
KEY=VALUE`` reaches every field of the configuration and of its model's ``arch`` (``--set
eval_every=50``, ``--set d_k=16`` or ``--set arch.d_k=16``), all through
:func:`attnbook.training.recipe.override`. The final configuration is checked
(:func:`attnbook.training.recipe.check_config`) before anything runs. A bad value raises
:class:`attnbook.cli.UsageError`, whose one line the command prints.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..cli import UsageError
from ..utils import PRECISIONS, get_device
from .recipe import (ALL_MODELS, FIELDS, PRESETS, ConfigError, TrainConfig, check_config,
                     field_name, override, preset)
from .runs import STORED_MODELS, load_run, load_stored


# --- The options every command shares --------------------------------------------------------

def add_common(p: argparse.ArgumentParser, *names: str) -> None:
    """Add the shared options ``names``: any of "preset", "device", "threads", "data-dir",
    "average"."""
    if "preset" in names:
        p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny",
                       help="the recipe to start from (default: cpu-tiny)")
    if "device" in names:
        p.add_argument("--device", help="cpu, cuda (or cuda:N) or mps (default: the best available)")
    if "threads" in names:
        p.add_argument("--threads", type=int,
                       help="CPU threads for PyTorch (default: PyTorch's; results depend on it)")
    if "average" in names:
        p.add_argument("--average", type=int, default=1, metavar="K",
                       help="the mean of the weights of the run's last K snapshots (checkpoint "
                            "averaging; default 1: the last checkpoint alone; cpu-base is scored "
                            "with 5)")
    if "data-dir" in names:
        p.add_argument("--data-dir", help="folder with the Multi30k files "
                                          "(default: $MULTI30K_DIR or the cache)")


def apply_common(args: argparse.Namespace) -> torch.device:
    """Set the threads (``--threads``), check ``--average``, and return the device
    (``--device``); UsageError if bad."""
    if getattr(args, "average", 1) < 1:
        raise UsageError(f"--average must be at least 1, got {args.average}")
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        return get_device(getattr(args, "device", None))
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"--device: {e}") from None


# --- Which trained model: a run folder, or one the package stores -----------------------------

def add_model(p: argparse.ArgumentParser) -> None:
    """A trained model to use: a run folder (positional ``run``), or ``--stored NAME``, one the
    package keeps (:data:`attnbook.training.runs.STORED_MODELS`)."""
    p.add_argument("run", type=Path, nargs="?",
                   help="run folder (with checkpoint.pt and tokenizer.model); or give --stored")
    p.add_argument("--stored", choices=sorted(STORED_MODELS), metavar="NAME",
                   help="a model the package stores, instead of a run folder: "
                        + ", ".join(sorted(STORED_MODELS)))


def load_model(args: argparse.Namespace, device: torch.device):
    """(model, tokenizer, config) of the model that ``add_model``'s options name. A stored model
    is already an average of snapshots, so ``--average`` applies to run folders only.
    UsageError for neither or both; RunError (attnbook.training.runs) for a bad folder."""
    if (args.run is None) == (args.stored is None):
        raise UsageError("give a run folder or --stored NAME (one of "
                         f"{', '.join(sorted(STORED_MODELS))}), not {'both' if args.run else 'neither'}")
    if args.stored is not None:
        if getattr(args, "average", 1) != 1:
            raise UsageError(f"--average applies to a run folder's snapshots; the stored "
                             f"{args.stored} is used as stored: leave --average out")
        return load_stored(args.stored, device)
    if not args.run.exists() and str(args.run) in STORED_MODELS:
        raise UsageError(f"{args.run} is not a run folder, but the package stores a model of that "
                         f"name: give --stored {args.run}")
    return load_run(args.run, device, average=getattr(args, "average", 1))


# --- The recipe options of python -m attnbook train ------------------------------------------

# field (recipe.FIELDS): (flag, argparse keywords). Every other field is reached by --set.
OPTIONS = {
    "model": ("--model", dict(choices=ALL_MODELS, help="the model (default: a Transformer); the "
                                                       "GRU models use the preset's GRU peak rate")),
    "d_model": ("--d-model", dict(type=int, help="model width")),
    "n_layers": ("--layers", dict(type=int, help="layers of the encoder and of the decoder")),
    "h": ("--heads", dict(type=int, help="attention heads (must divide --d-model)")),
    "d_ff": ("--d-ff", dict(type=int, help="feed-forward width")),
    "dropout": ("--dropout", dict(type=float, help="dropout rate, in [0, 1)")),
    "norm_first": ("--norm-first", dict(action=argparse.BooleanOptionalAction,
                                        help="pre-LN blocks, or post-LN as in the paper")),
    "positional": ("--positional", dict(choices=("sinusoidal", "learned", "none"),
                                        help="positional encoding (chapter 7)")),
    "vocab_size": ("--vocab-size", dict(type=int, help="BPE vocabulary size")),
    "max_tokens": ("--max-tokens", dict(type=int, help="tokens per batch (padded)")),
    "max_steps": ("--max-steps", dict(type=int, help="optimiser steps")),
    "warmup": ("--warmup", dict(type=int, help="warm-up steps (the peak learning rate's step)")),
    "peak_lr": ("--peak-lr", dict(type=float, help="peak learning rate")),
    "label_smoothing": ("--label-smoothing", dict(type=float, help="in [0, 1)")),
    "seed": ("--seed", dict(type=int, help="random seed (default 0)")),
    "accum_steps": ("--accum-steps", dict(type=int, help="batches per process and step")),
    "precision": ("--precision", dict(choices=PRECISIONS, help="auto (bf16 on recent GPUs, fp16 "
                                      "+ GradScaler on a T4 or MPS, fp32 on a CPU), fp32, bf16, "
                                      "fp16, or bf16-if-native (bf16 where the CPU has it in "
                                      "hardware, else fp32)")),
    "compile": ("--compile", dict(action=argparse.BooleanOptionalAction,
                                  help="torch.compile the model (no preset does: for a run "
                                       "of minutes, compiling costs more than it gains)")),
}
def flag(field: str) -> str:
    """The option that sets ``field``: '--d-model', or '--set eval_every'."""
    return OPTIONS[field][0] if field in OPTIONS else f"--set {field}"


def add_recipe(p: argparse.ArgumentParser) -> None:
    """Add the options that override the preset's configuration, and ``--set KEY=VALUE``."""
    g = p.add_argument_group("recipe (each overrides the preset's value)")
    for field, (name, kw) in OPTIONS.items():
        metavar = {int: "N", float: "X"}.get(kw.get("type"))
        g.add_argument(name, dest=field, default=argparse.SUPPRESS, metavar=metavar, **kw)
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any configuration field (repeatable), e.g. --set eval_every=50 or "
                        "--set arch.d_k=16; keys: " + ", ".join(FIELDS))


def parse_set(item: str) -> tuple[str, object]:
    """``'eval_every=50'`` -> ``('eval_every', 50)``, the value of the field's type; a model field
    may be written ``arch.d_model`` (-> ``'d_model'``)."""
    key, sep, text = item.partition("=")
    if not sep:
        raise UsageError(f"--set {item}: expected KEY=VALUE; valid keys: {', '.join(FIELDS)}")
    try:
        key = field_name(key.strip().replace("-", "_"))
    except ConfigError as e:
        raise UsageError(f"--set {item}: {e}") from None
    kind, text = FIELDS[key], text.strip()
    try:
        if kind is bool:
            return key, {"true": True, "1": True, "yes": True,
                         "false": False, "0": False, "no": False}[text.lower()]
        if kind is tuple:
            return key, tuple(int(x) for x in text.split(",") if x.strip())
        return key, kind(text)
    except (KeyError, ValueError):
        wanted = {int: "an integer", float: "a number", bool: "true or false",
                  tuple: "comma-separated integers, e.g. 100,200"}
        raise UsageError(f"--set {item}: {text!r} is not a valid {key}; give {wanted[kind]}"
                         ) from None


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The preset's configuration with the recipe options and ``--set`` applied, checked."""
    given = {field: getattr(args, field) for field in OPTIONS if hasattr(args, field)}
    for item in args.set:
        key, value = parse_set(item)
        if key in given:
            raise UsageError(f"{flag(key)} is given twice (--set {item}); give it once")
        given[key] = value
    try:
        cfg = override(preset(args.preset, given.pop("model", "transformer")), **given)
        check_config(cfg, name=flag)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return cfg
