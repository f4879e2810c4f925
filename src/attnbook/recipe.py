"""The training recipe (chapter 9): the run's configuration, the presets, each model's peak
learning rate and the model registry. The schedule is :func:`attnbook.schedules.warmup_lr`, the
loss :func:`attnbook.batching.translation_loss`.

The recipe of Vaswani et al. (2017), section 5: a joint BPE vocabulary; batches of about
``max_tokens`` tokens of similar length; Adam with beta2 = 0.98 and the learning rate
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (warm-up, then inverse square
root decay); label smoothing; dropout; and, from later practice, gradient clipping.
The package states the peak learning rate explicitly (``peak_lr``, reached at step ``warmup``):
the paper's factor ties it to d_model and warm-up, so that changing either silently changes the
peak, and a small model needs its own (chapter 9's sweep).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .lm import DecoderOnlyTranslator
from .rnn import Seq2Seq
from .transformer import Transformer, TransformerConfig


@dataclass
class TrainConfig:
    preset: str = "custom"
    model: str = "transformer"
    d_model: int = 512
    h: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    norm_first: bool = False
    positional: str = "sinusoidal"  # sinusoidal | learned | none (chapter 7; the ablations)
    learned_std: float = 0.02       # starting std of a learned positional table
    d_k: int = 0                  # query/key width per head; 0: d_model / h (the ablations)
    vocab_size: int = 8000
    max_tokens: int = 8192        # tokens per batch (source or target side, padded)
    max_steps: int = 20000
    warmup: int = 4000
    peak_lr: float = 512 ** -0.5 * 4000 ** -0.5  # reached at step `warmup` (the paper's: 7e-4)
    label_smoothing: float = 0.1
    clip: float = 1.0             # gradient-norm clipping; 0 turns it off
    seed: int = 0
    snapshot_steps: tuple = ()    # also save the model's weights at these steps (snapshots/)
    eval_every: int = 1000        # steps between validation losses (and checkpoints)
    beam_size: int = 4
    length_alpha: float = 0.6
    eval_sentences: int = 0       # test sentences to translate for BLEU; 0 = all 1,000
    time_budget_s: float = 0      # stop training after this many seconds (0: run max_steps)
    accum_steps: int = 1          # batches per process and optimiser step (gradient accumulation)
    precision: str = "auto"       # auto | fp32 | bf16 | fp16 (utils.choose_precision)
    compile: bool = False         # torch.compile(dynamic=True) on any device; not the GRUs
    src_lang: str = "de"
    tgt_lang: str = "en"
    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config saved in a checkpoint or metrics.json (see :func:`upgrade_config`)."""
        return cls(**upgrade_config(d))

    def transformer_config(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(vocab_size=vocab_size, d_model=self.d_model, h=self.h,
                                 d_ff=self.d_ff, n_layers=self.n_layers, dropout=self.dropout,
                                 max_len=512, norm_first=self.norm_first,
                                 positional=self.positional, learned_std=self.learned_std,
                                 d_k=self.d_k)


# Every model of the book, trained and evaluated by the same harness (chapter 9's leaderboard):
# the GRU encoder-decoder of chapter 1 (no attention), of chapter 2 (additive attention) and of
# chapter 3 (dot-product attention), the Transformer of chapter 8 and the decoder-only model of
# chapter 10.
# Chapter 10's decoder-only Transformer, which reads "BOS source EOS target" as one sequence,
# trains with the same harness and is on the same board.
MODELS = ("gru", "gru-additive", "gru-dot", "transformer", "decoder-only")
ALL_MODELS = MODELS


PRESETS = {
    # a few minutes on a laptop CPU: a small model that learns real (if rough) translations.
    # No dropout: in 600 steps (2.4 epochs) this small model does not over-fit yet (its
    # validation loss still falls steeply, chapter 9), and dropout would only slow it down.
    "cpu-tiny": TrainConfig(preset="cpu-tiny", d_model=128, h=4, d_ff=256, n_layers=2,
                            dropout=0.0, vocab_size=4000, max_tokens=2048, max_steps=1200,
                            warmup=200, eval_every=100, beam_size=4, precision="auto",
                            compile=False),
    # an evening on a laptop: at most 30 minutes of training on 2 CPU cores (chapter 9; size,
    # batch, schedule, dropout and checkpoint averaging chosen on the validation set by
    # `python -m attnbook.experiments base`, results/cpu/cpu_base.json)
    "cpu-base": TrainConfig(preset="cpu-base", d_model=192, h=4, d_ff=768, n_layers=3,
                            dropout=0.1, vocab_size=6000, max_tokens=4096, max_steps=1400,
                            warmup=300, eval_every=200, beam_size=4, precision="auto",
                            snapshot_steps=(600, 1000, 1200, 1250, 1300, 1350), compile=False),
    # the test suite's smoke run: seconds
    "smoke": TrainConfig(preset="smoke", d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0,
                         vocab_size=1000,
                         max_tokens=1024, max_steps=20, warmup=10, eval_every=10, beam_size=2,
                         eval_sentences=16, precision="fp32", compile=False),
    # the full run on one GPU: the paper's base model, sized for Multi30k, five minutes of training
    "gpu-base": TrainConfig(preset="gpu-base", d_model=512, h=8, d_ff=2048, n_layers=6,
                            dropout=0.1, vocab_size=8000, max_tokens=16384, max_steps=20000,
                            warmup=2000, eval_every=1000, beam_size=4,
                            precision="auto", compile=True, time_budget_s=300),
}


# Each model's peak learning rate, per preset. cpu-tiny's come from chapter 9's sweep, chosen
# by validation loss (results/cpu/sweep.json); gpu-base's Transformer uses the paper's schedule
# (d_model^-0.5 * warmup^-0.5 = 9.9e-4). The rest of a preset (data, batches, steps, warm-up,
# decoding) is the same for every model.
PEAK_LR = {
    "cpu-tiny": {"transformer": 6e-3, "decoder-only": 6e-3, "gru": 1.6e-2, "gru-additive": 8e-3,
                 "gru-dot": 8e-3},
    "cpu-base": {"transformer": 3e-3, "decoder-only": 3e-3, "gru": 8e-3, "gru-additive": 4e-3,
                 "gru-dot": 4e-3},
    "smoke": {m: 3e-3 for m in ALL_MODELS},
    "gpu-base": {"transformer": 512 ** -0.5 * 2000 ** -0.5,
                 "decoder-only": 512 ** -0.5 * 2000 ** -0.5,
                 "gru": 1e-3, "gru-additive": 1e-3, "gru-dot": 1e-3},
}


def preset(name: str, model: str = "transformer") -> TrainConfig:
    """The configuration of preset ``name`` for ``model`` (one of ALL_MODELS)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    if model not in ALL_MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(ALL_MODELS)}")
    return replace(PRESETS[name], model=model, peak_lr=PEAK_LR[name][model])


def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model named by ``cfg.model``; the GRU models use d_model as embedding and state size."""
    if cfg.model == "transformer":
        return Transformer(cfg.transformer_config(vocab_size))
    if cfg.model == "decoder-only":  # as many blocks as the encoder and decoder together
        return DecoderOnlyTranslator(replace(cfg.transformer_config(vocab_size),
                                             n_layers=2 * cfg.n_layers))
    if cfg.model == "gru":
        return Seq2Seq(vocab_size, cfg.d_model, attention=False)
    if cfg.model in ("gru-additive", "gru-dot"):
        return Seq2Seq(vocab_size, cfg.d_model, attention=True, score=cfg.model[4:])
    raise ValueError(f"unknown model {cfg.model!r}; choose one of {', '.join(ALL_MODELS)}")


def forward_logits(model: torch.nn.Module, b) -> torch.Tensor:
    """Teacher-forced logits (B, T, V) of a batch: every model of the book (GRU Seq2Seq,
    Transformer, decoder-only), compiled or not, takes the same four tensors."""
    return model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)


# Options that may differ when a run is resumed: how long it trains and what it records.
# Everything else (model, data, recipe, seed) must match the checkpoint's.
EXTENDABLE = ("max_steps", "time_budget_s", "eval_every", "snapshot_steps", "eval_sentences",
              "beam_size", "length_alpha")


def upgrade_config(d: dict) -> dict:
    """A saved config in today's fields: older runs saved ``bf16`` (autocast on CUDA only), which
    ``precision`` replaced: True is "auto", False is "fp32"; JSON turned tuples into lists."""
    d = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    if "bf16" in d:
        d.setdefault("precision", "auto" if d.pop("bf16") else "fp32")
    d.setdefault("positional", "sinusoidal")   # runs saved before the ablations had no choice
    d.setdefault("learned_std", 0.02)
    d.setdefault("d_k", 0)
    return d


def same_run(a: dict, b: dict) -> bool:
    """Whether configs a and b describe the same training run (up to EXTENDABLE options)."""
    strip = lambda c: {k: v for k, v in upgrade_config(c).items() if k not in EXTENDABLE}  # noqa: E731
    return strip(a) == strip(b)
