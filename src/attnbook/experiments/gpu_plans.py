"""The GPU call's plans: what each call trains, scores and measures, and how long each part
may take (``attnbook.experiments.gpu_run`` runs them; its docstring describes the parts)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# the must-show measurements first: the deadline shortens the last parts when earlier ones ran long
BENCH_PARTS = ("bench-recurrence", "bench-training", "bench-loop", "bench-attention", "bench-decoding")
PARTS = ("check", "train", "score", *BENCH_PARTS)

# name -> (model, changes to the base preset). The base is gpu-base: the paper's base model
# (d_model 512, 6 + 6 layers, 8 heads), 16,384-token batches, peak 9.9e-4 (the paper's formula
# at 2,000 warm-up steps; the paper itself warms up for 4,000 steps to about 7.0e-4), dropout 0.1,
# and the warm-up that this race chose (400 steps). Multi30k has about 30 such batches per epoch,
# so a warm-up of thousands of steps would last longer than a few minutes of training: the
# candidates try what a reader would try first ("paper" is the formula at 2,000 steps).
CANDIDATES = {
    "paper": ("transformer", {"warmup": 2000}),
    "warmup-400": ("transformer", {"warmup": 400}),
    "peak-2e-3": ("transformer", {"warmup": 400, "peak_lr": 2e-3}),
    "pre-ln": ("transformer", {"warmup": 400, "peak_lr": 2e-3, "norm_first": True}),
    "dropout-0.3": ("transformer", {"warmup": 400, "dropout": 0.3}),
    "small": ("transformer", {"warmup": 400, "peak_lr": 2e-3, "d_model": 256, "h": 4,
                              "d_ff": 1024, "n_layers": 3}),
    "batch-32k": ("transformer", {"max_tokens": 32768, "warmup": 200, "peak_lr": 1.4e-3}),
    "gru-additive-1e-3": ("gru-additive", {"warmup": 400, "peak_lr": 1e-3}),
    "gru-additive-3e-3": ("gru-additive", {"warmup": 400, "peak_lr": 3e-3}),
}
# the dry run's candidates: one of each kind of run, on the smoke preset
DRY_CANDIDATES = {
    "paper": ("transformer", {}),
    "pre-ln": ("transformer", {"norm_first": True}),
    "gru-additive-3e-3": ("gru-additive", {"peak_lr": 3e-3}),
}
# The seeds race: each family's choice from the races above (the Transformer's and the GRU's;
# decoder-only takes the Transformer's), three seeds each.
SEED_FAMILIES = {"transformer": {"warmup": 400}, "decoder-only": {"warmup": 400},
                 "gru-additive": {"warmup": 400, "peak_lr": 1e-3}}
SEEDS_CANDIDATES = {f"{m}-seed{s}": (m, {**c, "seed": s})
                    for m, c in SEED_FAMILIES.items() for s in range(3)}
# its dry run: two seeds of two of the families (the GRU's training and scoring are the dry run's
# of the race): what the plan does with seeds and families, at a third less work
DRY_SEEDS_CANDIDATES = {f"{m}-seed{s}": (m, {"seed": s}) for m in ("transformer", "decoder-only")
                        for s in range(2)}


@dataclass(frozen=True)
class Plan:
    """What one call does and how long each part may take (seconds)."""
    name: str                   # "full", "eager", "seeds" (a GPU); "dry", "dry-seeds" (the CPU, tiny)
    device: str
    preset: str                 # the candidates' base preset
    candidates: dict
    train_seconds: float        # training time of every candidate (compiling included)
    eval_every: int             # steps between validation losses: the curves' points
    threads: int                # PyTorch's CPU threads per process
    test_sentences: int         # 0: all 1,000 of test_2016_flickr
    beam: int
    minutes: float              # the whole call's deadline
    limits: dict = field(default_factory=dict)
    compile: bool = True        # torch.compile the Transformers (on a GPU)
    parts: tuple = PARTS        # the parts this plan runs
    score_all: bool = False     # score every run with beam and greedy, bootstrap between models
    alone: bool = False         # train the candidates one after another, each with the GPU to
    #                             itself (else all at once, sharing it)

    @property
    def dry(self) -> bool:
        return self.name.startswith("dry")

    def runs(self, model: str | None = None) -> list[str]:
        return [n for n, (m, _) in self.candidates.items() if model in (None, m)]


# The race trains eager: compiled, nine processes with one CPU thread each spent most of their
# three minutes compiling (results/gpu/gpu_run.json); the benchmarks measure compiling alone.
FULL = Plan("full", "cuda", "gpu-base", CANDIDATES, train_seconds=180, eval_every=50, threads=1,
            test_sentences=0, beam=4, minutes=9,
            limits={"check": 60, "train": 250, "score": 80, "bench-attention": 35,
                    "bench-decoding": 25, "bench-recurrence": 80, "bench-training": 100,
                    "bench-loop": 60},
            compile=False)
DRY = Plan("dry", "cpu", "smoke", DRY_CANDIDATES, train_seconds=2, eval_every=5, threads=1,
           test_sentences=16, beam=4, minutes=5,
           limits={"check": 60, "train": 90, "score": 60, "bench-attention": 60,
                   "bench-decoding": 60, "bench-recurrence": 60, "bench-training": 60,
                   "bench-loop": 60})
# A shorter race (results/gpu/gpu_run_eager.json): five candidates, eager, 150 s each, no
# benchmarks; about four minutes.
EAGER = Plan("eager", "cuda", "gpu-base",
             {n: CANDIDATES[n] for n in ("warmup-400", "peak-2e-3", "pre-ln", "small",
                                         "gru-additive-1e-3")},
             train_seconds=150, eval_every=50, threads=1, test_sentences=0, beam=4, minutes=4.6,
             limits={"check": 20, "train": 185, "score": 55}, compile=False,
             parts=("check", "train", "score"))
# Three seeds of each family (results/gpu/gpu_run_seeds.json): nine runs at once for 180 s, as
# crowded as the full call's race; every run scored; about six minutes.
SEEDS = Plan("seeds", "cuda", "gpu-base", SEEDS_CANDIDATES, train_seconds=180, eval_every=50,
             threads=1, test_sentences=0, beam=4, minutes=7.5,
             limits={"check": 30, "train": 240, "score": 150}, compile=False,
             parts=("check", "train", "score"), score_all=True)
DRY_SEEDS = replace(DRY, name="dry-seeds", candidates=DRY_SEEDS_CANDIDATES,
                    parts=("check", "train", "score"), score_all=True, train_seconds=1)

# Each family alone on the GPU for the same minutes (issue 38's fair verdict on the clock): the
# Transformer, GRU + additive attention, ConvS2S and decoder-only, one seed a call (a call holds
# four runs of 80 s, each scored both ways, and the paired bootstrap between them); three calls
# make the three seeds. ConvS2S's peak at gpu-base is not swept: 1e-3, the GRU's.
FAMILIES = {"transformer": {"warmup": 400}, "gru-additive": {"warmup": 400, "peak_lr": 1e-3},
            "conv": {"warmup": 400, "peak_lr": 1e-3}, "decoder-only": {"warmup": 400}}


def families(seed: int, dry: bool = False) -> Plan:
    """The plan that trains every family of FAMILIES alone, one after another, with ``seed``."""
    candidates = {f"{m}-seed{seed}": (m, {**({} if dry else c), "seed": seed})
                  for m, c in FAMILIES.items()}
    if dry:
        return replace(DRY, name=f"dry-families{seed}", candidates=candidates, alone=True,
                       parts=("check", "train", "score"), score_all=True, train_seconds=2)
    return Plan(f"families{seed}", "cuda", "gpu-base", candidates, train_seconds=80,
                eval_every=50, threads=4, test_sentences=0, beam=4, minutes=9,
                limits={"check": 30, "train": 4 * 100, "score": 120}, compile=False,
                parts=("check", "train", "score"), score_all=True, alone=True)


# gpu-base chosen by validation with the GPU to itself (issue 38): the preset against dropout 0.3,
# which the crowded races never trained long enough, each alone for four minutes of training.
SELECT = Plan("select", "cuda", "gpu-base",
              {"warmup-400": ("transformer", {"warmup": 400}),
               "dropout-0.3": ("transformer", {"warmup": 400, "dropout": 0.3})},
              train_seconds=240, eval_every=50, threads=4, test_sentences=0, beam=4, minutes=9.5,
              limits={"check": 30, "train": 2 * 270, "score": 45}, compile=False,
              parts=("check", "train", "score"), alone=True)
# One layer's cost of generating on the GPU (chapter 13; attnbook.recall.generation_cost): the
# attention cache against the selective state, as results/cpu/recall.json measured the CPU.
RECALL = Plan("recall", "cuda", "gpu-base", {}, train_seconds=0, eval_every=50, threads=1,
              test_sentences=0, beam=4, minutes=2.5,
              limits={"check": 30, "recall-generation": 100}, compile=False,
              parts=("check", "recall-generation"))
DRY_RECALL = replace(DRY, name="dry-recall", candidates={}, parts=RECALL.parts,
                     limits={"check": 60, "recall-generation": 60})
EXTRA_PARTS = ("recall-generation",)          # parts that only some plans run
PLANS = {"full": FULL, "eager": EAGER, "seeds": SEEDS, "select": SELECT, "recall": RECALL,
         "dry": DRY, "dry-recall": DRY_RECALL, "dry-seeds": DRY_SEEDS,
         "dry-select": replace(DRY, name="dry-select",
                               candidates=dict(list(DRY_CANDIDATES.items())[:2]),
                               alone=True, parts=("check", "train", "score"))}
PLANS.update({f"families{k}": families(k) for k in range(3)})
PLANS.update({f"dry-families{k}": families(k, dry=True) for k in range(3)})
