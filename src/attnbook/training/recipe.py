"""The training recipe (chapter 9): the run's configuration, the presets, each model's peak
learning rate and the model registry. The schedule is :func:`attnbook.schedules.warmup_lr`, the
loss :func:`attnbook.batching.translation_loss`.

The recipe of Vaswani et al. (2017), section 5: a joint BPE vocabulary; batches of about
``max_tokens`` tokens of similar length; Adam with beta2 = 0.98 and the learning rate
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (warm-up, then inverse square
root decay); label smoothing; dropout; and, from later practice, gradient clipping.
The package states the peak learning rate explicitly (``peak_lr``, reached at step ``warmup``):
the paper's factor ties it to d_model and warm-up, so that changing either silently changes the
peak, and a small model needs its own (chapter 10's sweep).

A :class:`TrainConfig` holds the model's architecture, ``arch`` (chapter 8's
:class:`~attnbook.transformer.TransformerConfig`), and the recipe's options beside it.
:func:`override` changes any of them by name (``override(cfg, d_model=256, max_steps=300)``;
a model field may also be written ``arch.d_model``), and :func:`check_config` refuses values no
run can train with. A run saves its config as a nested dict (``asdict(cfg)``: config.json,
metrics.json, checkpoints); :func:`upgrade_config` reads those of older runs, saved flat.
"""
from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field, replace

import torch

from ..conv import ConvS2S, layers_like
from ..lm import DecoderOnlyTranslator
from ..rnn import Seq2Seq, width_like
from ..transformer import Transformer, TransformerConfig
from ..utils import PRECISIONS


class ConfigError(ValueError):
    """A configuration no run can use; the message names the field and the fix."""


@dataclass
class TrainConfig:
    preset: str = "custom"
    model: str = "transformer"
    # the model's architecture. arch.vocab_size is the run's BPE vocabulary, trained with exactly
    # that many pieces, and so the model's embedding size; arch.max_len is the longest sequence
    # its positional encoding covers (the presets: 512). The GRU models read arch.vocab_size and
    # arch.d_model (embedding and state size) only.
    arch: TransformerConfig = field(default_factory=TransformerConfig)
    max_tokens: int = 8192        # tokens per batch (source or target side, padded)
    max_steps: int = 20000
    warmup: int = 4000
    peak_lr: float = 512 ** -0.5 * 4000 ** -0.5  # reached at step `warmup` (the paper's: 7e-4)
    # after the warm-up: "inverse-sqrt" (the paper's decay, schedules.warmup_lr) or "cosine"
    # (schedules.warmup_cosine: to zero at max_steps, so a cosine run cannot be extended)
    schedule: str = "inverse-sqrt"
    label_smoothing: float = 0.1
    clip: float = 1.0             # gradient-norm clipping; 0 turns it off
    seed: int = 0
    snapshot_steps: tuple = ()    # also save the model's weights at these steps (snapshots/)
    eval_every: int = 1000        # steps between validation losses (and checkpoints)
    beam_size: int = 4
    length_alpha: float = 0.6
    eval_sentences: int = 0       # test sentences to translate for BLEU; 0 = all 1,000
    val_sentences: int = 0        # validation sentences for the loss; 0 = all 1,014 (the tests'
                                  # tiny runs use a few: experiments.sweeps.tiny_run)
    time_budget_s: float = 0      # stop training after this many seconds (0: run max_steps)
    accum_steps: int = 1          # batches per process and optimiser step (gradient accumulation)
    precision: str = "auto"       # auto | fp32 | bf16 | fp16 (utils.choose_precision)
    compile: bool = False         # torch.compile(dynamic=True) on any device; not the GRUs
    src_lang: str = "de"
    tgt_lang: str = "en"

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config saved in a checkpoint or metrics.json (see :func:`upgrade_config`)."""
        d = upgrade_config(d)
        return cls(**{**d, "arch": TransformerConfig(**d["arch"])})


# Every model of the book, trained and evaluated by the same harness (chapter 10's leaderboard):
# the GRU encoder-decoder of chapter 1 (no attention), of chapter 2 (additive attention) and of
# chapter 3 (dot-product attention), the Transformer of chapter 8 and the decoder-only model of
# chapter 12.
# Chapter 12's decoder-only Transformer, which reads "BOS source EOS target" as one sequence,
# trains with the same harness and is on the same board.
MODELS = ("gru", "gru-additive", "gru-dot", "transformer", "decoder-only")
# Two more train with the same harness at cpu-tiny, each added to chapter 10's sweep and board
# on its own (--only): the convolutional translator (conv.ConvS2S, the paper's third family) and
# GRU + additive attention as wide as gives the Transformer's parameters outside the embeddings.
ALL_MODELS = MODELS + ("conv", "gru-additive-wide")


PRESETS = {
    # a few minutes on a laptop CPU: a small model that learns real (if rough) translations.
    # No dropout: in its 1,200 steps (4.7 epochs: results/cpu/cpu_tiny_transformer_2threads.json)
    # this small model has had little chance to over-fit, and dropout only slows its learning
    # (it costs BLEU in chapter 10's dropout ablation, results/cpu/ablations.json).
    "cpu-tiny": TrainConfig(preset="cpu-tiny",
                            arch=TransformerConfig(vocab_size=4000, d_model=128, h=4, d_ff=256,
                                                   n_layers=2, dropout=0.0, max_len=512),
                            max_tokens=2048, max_steps=1200, warmup=200, eval_every=100,
                            beam_size=4, precision="auto", compile=False),
    # an evening on a laptop: at most 30 minutes of training on 2 CPU cores (chapter 9; size,
    # batch, schedule, dropout and checkpoint averaging chosen on the validation set by
    # `python -m attnbook translators base`, results/cpu/cpu_base.json)
    "cpu-base": TrainConfig(preset="cpu-base",
                            arch=TransformerConfig(vocab_size=6000, d_model=192, h=4, d_ff=768,
                                                   n_layers=3, dropout=0.1, max_len=512),
                            max_tokens=4096, max_steps=1400, warmup=300, eval_every=200,
                            beam_size=4, precision="auto",
                            snapshot_steps=(600, 1000, 1200, 1250, 1300, 1350), compile=False),
    # the speedrun: cpu-base's model and recipe made fast on 2 CPU cores, to train in under 10
    # minutes (`python -m attnbook speedrun`, results/cpu/speedrun.json): bf16
    # autocast where the CPU has it natively (AVX-512 BF16, AMX or arm64's bf16; elsewhere
    # emulated bf16 is about 100 times slower, so such a CPU trains in float32 and says so), a
    # 4,000-piece vocabulary, and as many steps as fit the minutes; its snapshots are placed by
    # speedrun.snapshots, for checkpoint averaging.
    "cpu-speedrun": TrainConfig(preset="cpu-speedrun",
                                arch=TransformerConfig(vocab_size=4000, d_model=192, h=4,
                                                       d_ff=768, n_layers=3, dropout=0.1,
                                                       max_len=512),
                                max_tokens=4096, max_steps=1100, warmup=300, eval_every=200,
                                beam_size=4, precision="bf16-if-native",
                                snapshot_steps=(366, 733, 948, 986, 1024, 1062), compile=False),
    # the test suite's smoke run: seconds
    "smoke": TrainConfig(preset="smoke",
                         arch=TransformerConfig(vocab_size=1000, d_model=32, h=2, d_ff=64,
                                                n_layers=1, dropout=0.0, max_len=512),
                         max_tokens=1024, max_steps=20, warmup=10, eval_every=10, beam_size=2,
                         eval_sentences=16, precision="fp32", compile=False),
    # the full run on one GPU: the paper's base model with 16,384-token batches. The GPU race
    # chose the rest (python -m attnbook gpu_run --plan eager, results/gpu/gpu_run_eager.json):
    # of four Transformer candidates trained for the same time, a 400-step warm-up to 9.9e-4
    # had the lowest validation loss, after 609 steps (about 20 epochs); eager,
    # because compiling for dynamic shapes costs more than a run of minutes gains.
    "gpu-base": TrainConfig(preset="gpu-base",
                            arch=TransformerConfig(vocab_size=8000, d_model=512, h=8, d_ff=2048,
                                                   n_layers=6, dropout=0.1, max_len=512),
                            max_tokens=16384, max_steps=600, warmup=400, eval_every=100,
                            beam_size=4, precision="auto", compile=False),
}


# Each model's peak learning rate, per preset. cpu-tiny's come from chapter 10's sweep, chosen
# by validation loss (results/cpu/sweep.json); cpu-base's Transformer from chapter 11's candidate
# search (results/cpu/cpu_base.json) and its GRU + additive from a sweep of its own
# (results/cpu/sweep_base.json; the other cpu-base rates are unswept); gpu-base's Transformer
# uses the peak that the paper's formula gives d_model 512 with 2,000 warm-up steps
# (d_model^-0.5 * 2000^-0.5 = 9.9e-4; the paper warms up for 4,000 steps, to about 7.0e-4),
# reached after 400 steps. The rest of a preset (data, batches, steps, warm-up, decoding) is the same for every model.
PEAK_LR = {
    "cpu-tiny": {"transformer": 6e-3, "decoder-only": 6e-3, "gru": 1.6e-2, "gru-additive": 8e-3,
                 "gru-dot": 8e-3, "conv": 8e-3, "gru-additive-wide": 8e-3},
    "cpu-base": {"transformer": 3e-3, "decoder-only": 3e-3, "gru": 8e-3, "gru-additive": 8e-3,
                 "gru-dot": 4e-3},
    "cpu-speedrun": {"transformer": 3e-3},
    "smoke": {m: 3e-3 for m in ALL_MODELS},
    "gpu-base": {"transformer": 512 ** -0.5 * 2000 ** -0.5,
                 "decoder-only": 512 ** -0.5 * 2000 ** -0.5,
                 "gru": 1e-3, "gru-additive": 1e-3, "gru-dot": 1e-3,
                 "conv": 1e-3},                  # unswept: the GRU's (the GPU families' race)
}


def preset(name: str, model: str = "transformer", peak_lr: float | None = None) -> TrainConfig:
    """The configuration of preset ``name`` for ``model`` (one of ALL_MODELS), at the model's
    peak learning rate in PEAK_LR, or at ``peak_lr`` (a sweep's)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    if model not in ALL_MODELS:
        raise ConfigError(f"unknown model {model!r}; choose one of {', '.join(ALL_MODELS)}")
    if peak_lr is None and model not in PEAK_LR[name]:
        raise ConfigError(f"preset {name!r} has no peak learning rate for {model!r} yet: sweep it "
                          f"(python -m attnbook translators sweep --models {model} ...) "
                          "or give one (--peak-lr, --set peak_lr=...)")
    cfg = PRESETS[name]   # its own copy of arch: changing it in place leaves the preset alone
    return replace(cfg, model=model, peak_lr=PEAK_LR[name][model] if peak_lr is None else peak_lr,
                   arch=replace(cfg.arch))


def flatten(d: dict) -> dict:
    """A config as a dict (``asdict(cfg)``, or saved) with the model's fields in place of
    ``arch``: {"preset": ..., "model": ..., "vocab_size": ..., "d_model": ..., ..., "max_tokens":
    ...}. The names are those :func:`override` and ``--set`` take."""
    out = {}
    for key, value in d.items():
        out.update(value if key == "arch" else {key: value})
    return out


# Every field by name, the recipe's and the model's, and its type: {"preset": str, ...,
# "vocab_size": int, "d_model": int, ...}. The two dataclasses share no field name.
FIELDS = flatten({**typing.get_type_hints(TrainConfig),
                  "arch": typing.get_type_hints(TransformerConfig)})
ARCH_FIELDS = tuple(typing.get_type_hints(TransformerConfig))


def field_name(key: str) -> str:
    """The field a key names: "max_steps", "d_model" or "arch.d_model" (-> "d_model");
    ConfigError, listing the valid keys, for any other."""
    name = key.removeprefix("arch.")
    if name not in FIELDS or (name != key and name not in ARCH_FIELDS):
        raise ConfigError(f"unknown key {key!r}; valid keys: {', '.join(FIELDS)} (a model "
                          "field may also be written arch.NAME, e.g. arch.d_model)")
    return name


def override(cfg: TrainConfig, **changes) -> TrainConfig:
    """``cfg`` with fields changed by name, the recipe's or the model's:
    ``override(cfg, max_steps=300, d_model=256)``, or ``override(cfg, **{"arch.d_model": 256})``.
    The command line's ``--set KEY=VALUE``, the ablations' and experiments' variants use it."""
    own, arch = {}, {}
    for key, value in changes.items():
        name = field_name(key)
        if name in own or name in arch:
            raise ConfigError(f"{name} is given twice ({', '.join(changes)}); give it once")
        (arch if name in ARCH_FIELDS else own)[name] = value
    return replace(cfg, **own, arch=replace(cfg.arch, **arch))


def build_model(cfg: TrainConfig) -> torch.nn.Module:
    """The model named by ``cfg.model``, of architecture ``cfg.arch``."""
    a = cfg.arch
    if cfg.model == "transformer":
        return Transformer(a)
    if cfg.model == "decoder-only":  # as many blocks as the encoder and decoder together
        return DecoderOnlyTranslator(replace(a, n_layers=2 * a.n_layers))
    if cfg.model == "gru":
        return Seq2Seq(a.vocab_size, a.d_model, attention=False)
    if cfg.model in ("gru-additive", "gru-dot"):
        return Seq2Seq(a.vocab_size, a.d_model, attention=True, score=cfg.model[4:])
    if cfg.model in ("gru-additive-wide", "conv"):  # sized like the Transformer outside embeddings
        outside = sum(p.numel() for n, p in Transformer(a).named_parameters() if "embed" not in n)
        if cfg.model == "gru-additive-wide":                      # as wide as gives that count
            return Seq2Seq(a.vocab_size, width_like(outside), attention=True)
        return ConvS2S(a.vocab_size, a.d_model, layers_like(outside, a.d_model), max_len=a.max_len)
    raise ConfigError(f"unknown model {cfg.model!r}; choose one of {', '.join(ALL_MODELS)}")


def forward_logits(model: torch.nn.Module, b) -> torch.Tensor:
    """Teacher-forced logits (B, T, V) of a batch: every model of the book (GRU Seq2Seq,
    Transformer, decoder-only), compiled or not, takes the same four tensors."""
    return model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)


SCHEDULES = ("inverse-sqrt", "cosine")
POSITIVE = ("vocab_size", "d_model", "h", "d_ff", "n_layers", "max_len", "max_tokens",
            "max_steps", "warmup", "eval_every", "beam_size", "accum_steps")
NON_NEGATIVE = ("seed", "clip", "eval_sentences", "val_sentences", "time_budget_s", "length_alpha",
                "learned_std", "d_k")


def check_config(cfg: TrainConfig, name=lambda field: field) -> None:
    """Raise ConfigError for a value no run can train with. The message calls each field
    ``name(field)``: the command line passes its option ('--d-model', '--set eval_every')."""
    c = flatten(asdict(cfg))
    for f in POSITIVE:
        if not c[f] >= 1:
            raise ConfigError(f"{name(f)} must be at least 1, got {c[f]}")
    for f in NON_NEGATIVE:
        if not c[f] >= 0:
            raise ConfigError(f"{name(f)} must be 0 or more, got {c[f]}")
    for f in ("dropout", "label_smoothing"):
        if not 0 <= c[f] < 1:
            raise ConfigError(f"{name(f)} must be in [0, 1), got {c[f]}")
    if not 0 < cfg.peak_lr < math.inf:
        raise ConfigError(f"{name('peak_lr')} must be positive, got {cfg.peak_lr}")
    if cfg.model not in ALL_MODELS:
        raise ConfigError(f"unknown model {cfg.model!r}; choose one of {', '.join(ALL_MODELS)}")
    if cfg.schedule not in SCHEDULES:
        raise ConfigError(f"{name('schedule')} {cfg.schedule!r}: choose one of "
                          f"{', '.join(SCHEDULES)}")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"{name('precision')} {cfg.precision!r}: choose one of "
                          f"{', '.join(PRECISIONS)}")
    if any(s < 1 for s in cfg.snapshot_steps):
        raise ConfigError(f"{name('snapshot_steps')}: steps must be at least 1, got "
                          f"{cfg.snapshot_steps}")
    a = cfg.arch
    if cfg.model in ("transformer", "decoder-only"):
        if a.d_model % a.h:
            raise ConfigError(f"{name('d_model')} {a.d_model} is not divisible by {name('h')} "
                              f"{a.h}; choose a width that is a multiple of the number of heads "
                              "(each head gets d_model / heads dimensions)")
        if a.d_model % 2:
            raise ConfigError(f"{name('d_model')} must be even (sinusoidal positions come in "
                              f"sin/cos pairs), got {a.d_model}")
    if a.positional not in ("sinusoidal", "learned", "none"):
        raise ConfigError(f"{name('positional')} {a.positional!r}: choose sinusoidal, learned "
                          "or none")


# Options that may differ when a run is resumed: how long it trains and what it records.
# Everything else (model, data, recipe, seed) must match the checkpoint's.
EXTENDABLE = ("max_steps", "time_budget_s", "eval_every", "snapshot_steps", "eval_sentences",
              "val_sentences", "beam_size", "length_alpha")
# The model of a config saved flat (before TrainConfig held ``arch``) had these, where it did
# not name them: a 512-position table, tied embeddings and, before the ablations, sinusoidal
# positions and d_k = d_model / h.
FLAT_DEFAULTS = dict(max_len=512, tie_embeddings=True, positional="sinusoidal", learned_std=0.02,
                     d_k=0)


def upgrade_config(d: dict) -> dict:
    """A saved config (config.json, metrics.json, a checkpoint's) in today's nested form.

    Runs saved before TrainConfig held ``arch`` saved it flat, the model's fields beside the
    recipe's: they go into ``arch``, with FLAT_DEFAULTS for those not saved. Older runs saved
    ``bf16`` (autocast on CUDA only), which ``precision`` replaced: True is "auto", False is
    "fp32"; runs saved before ``schedule`` existed decayed as inverse-sqrt. JSON turned tuples
    into lists."""
    d = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    if "bf16" in d:
        d.setdefault("precision", "auto" if d.pop("bf16") else "fp32")
    d.setdefault("schedule", "inverse-sqrt")             # runs saved before it could be chosen
    d.setdefault("val_sentences", 0)                     # ... before it could be cut (all)
    if "arch" not in d:
        d["arch"] = {**FLAT_DEFAULTS, **{k: d.pop(k) for k in ARCH_FIELDS if k in d}}
    return d


def differences(a: dict, b: dict) -> dict:
    """{field: (a's value, b's value)} for each field, by its :func:`flatten` name, in which the
    saved (or ``asdict``) configs ``a`` and ``b`` differ, apart from the EXTENDABLE options."""
    a, b = flatten(upgrade_config(a)), flatten(upgrade_config(b))
    return {k: (a.get(k), b.get(k)) for k in {**a, **b}
            if k not in EXTENDABLE and a.get(k, ...) != b.get(k, ...)}


def same_run(a: dict, b: dict) -> bool:
    """Whether configs a and b describe the same training run (up to EXTENDABLE options)."""
    return not differences(a, b)
