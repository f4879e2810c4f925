"""The workshop (notebooks/14_workshop), part 1: the graders of beam search and of one training
step (the decoder block and the key/value cache are in :mod:`.workshop_blocks`).

Each grader compares the reader's code with the package's (decoding.beam_search,
batching.translation_loss) on small random cases, so that any correct style passes (loops, another
dtype). When an answer is wrong the grader recomputes the typical mistakes and names the one the
answer matches.
"""
from __future__ import annotations

import copy
import math
import warnings

import torch
import torch.nn.functional as F

from .. import BOS_ID, EOS_ID, PAD_ID
from ..batching import make_batch
from ..decoding import beam_search, length_penalty
from ..batching import translation_loss
from ..schedules import warmup_lr_scheduler
from ..transformer import Transformer, TransformerConfig
from .core import Hint, grader

# ---------------------------------------------------------------------------------------------
# Beam search


class _StepModel:
    """A stand-in 'model' for decoding.beam_search whose next-token log-probabilities come from
    ``log_probs(prefixes (n, t)) -> (n, V)``: encode ignores the source, decode puts them last."""

    def __init__(self, log_probs):
        self.log_probs = log_probs

    def encode(self, src, src_mask):
        return torch.zeros(src.shape[0], 1, 1)

    def decode(self, ys, memory, src_mask, cache=None):
        last = self.log_probs(ys)                                        # (n, V)
        earlier = last.new_zeros(ys.shape[0], ys.shape[1] - 1, last.shape[1])
        return torch.cat([earlier, last[:, None]], 1)                    # (n, t, V)


def markov_log_probs(seed: int, V: int = 8, max_len: int = 8, eos_bias: float = 0.0,
                     scale: float = 2.0):
    """A toy next-token distribution that depends on the prefix's length and last token:
    ``log_probs(prefixes (n, t) int64) -> (n, V)``, PAD and BOS impossible (-inf); EOS grows more
    likely with the length (by ``eos_bias`` per token, from -2 at the start)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(max_len + 2, V, V, generator=g) * scale          # (len, last, next)
    table[..., EOS_ID] += eos_bias * torch.arange(max_len + 2.0)[:, None] - 2.0
    table[..., [PAD_ID, BOS_ID]] = float("-inf")
    table = table.log_softmax(-1)

    def log_probs(prefixes):
        t = min(prefixes.shape[1], max_len + 1)
        return table[t, prefixes[:, -1]]                                 # (n, V)
    return log_probs


def reference_beam_search(log_probs, beam_size, max_len, alpha):
    """The package's beam search on a toy distribution: (tokens, score)."""
    src, mask = torch.ones(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)
    hyps, scores = beam_search(_StepModel(log_probs), src, mask, beam_size, max_len, alpha,
                               return_scores=True, use_cache=False)
    return hyps[0], scores[0]


def _mistaken_beam(log_probs, k, max_len, alpha, mistake):
    """Beam search, one sentence, with one typical mistake (lists, for clarity)."""
    lp_of = (lambda n: 1.0) if mistake == "no-penalty" else (lambda n: length_penalty(n, alpha))
    alive = [([BOS_ID], 0.0)] * (k if mistake == "k-copies" else 1)
    finished = []
    for t in range(1, max_len + 1):
        logp = log_probs(torch.tensor([h for h, _ in alive]))             # (n, V)
        cands = sorted(((s + float(logp[i, v]), h + [v]) for i, (h, s) in enumerate(alive)
                        for v in range(logp.shape[1]) if logp[i, v] > float("-inf")),
                       key=lambda c: -c[0])[:2 * k]
        n_pen = t - 1 if mistake == "length-without-eos" else t
        finished += [(s / lp_of(n_pen), h) for s, h in cands[:k] if h[-1] == EOS_ID]
        finished = sorted(finished, key=lambda c: -c[0])[:k]
        keep = cands[:k] if mistake == "eos-takes-slots" else cands
        alive = [(h, s) for s, h in keep if h[-1] != EOS_ID][:k]
        if mistake == "first-eos" and finished:
            break
        if finished and (not alive or finished[0][0] >= alive[0][1] / lp_of(max_len + 1)):
            break
    if finished:
        return finished[0][1][1:-1], finished[0][0]
    return alive[0][0][1:], alive[0][1] / lp_of(max_len)


BEAM_MISTAKES = {
    "no-penalty": "the length penalty is missing: a finished hypothesis is ranked by "
                  "log-prob / ((5 + length) / 6) ** alpha, not by its log-prob alone (which always "
                  "favours short outputs)",
    "eos-takes-slots": "finished hypotheses keep their places in the beam: a candidate that ends "
                       "in EOS moves to the finished set, and the k alive hypotheses are the k "
                       "best candidates that do NOT end in EOS (take them from the 2k best)",
    "first-eos": "the search stops at the first finished hypothesis; stop only when no alive "
                 "hypothesis can still beat the best finished one: best finished >= best alive "
                 "log-prob / length_penalty(max_len + 1, alpha)",
    "length-without-eos": "the length in the penalty leaves EOS out; count every generated "
                          "token, EOS included (BOS excluded)",
    "k-copies": "the search starts from k copies of BOS, which fill the beam with the same "
                "candidate k times; start from ONE hypothesis (BOS, log-prob 0)",
}

BEAM_CASES = [  # (seed, beam_size, max_len, alpha, eos_bias): the first shows all five mistakes
    (50, 2, 7, 2.0, 0.3), (0, 4, 7, 0.6, 0.6), (3, 3, 6, 0.6, 0.5), (39, 1, 6, 1.0, 0.5),
    (6, 2, 6, 1.0, 0.8), (2, 1, 5, 0.0, 0.5), (1, 3, 4, 0.6, -1.0),
]


def _same(a, b):
    return a[0] == b[0] and math.isclose(a[1], b[1], abs_tol=1e-4)


@grader("ex-14-beam-search", target="beam_search")
def check_beam_search(fn):
    """Checks ``beam_search(log_probs, beam_size, max_len, alpha) -> (tokens, score)`` against
    decoding.beam_search on toy next-token distributions. A wrong answer is compared with each
    typical mistake on every case, and the hint names the mistake it matches everywhere."""
    answers, failed = [], None
    for seed, k, max_len, alpha, eos_bias in BEAM_CASES:
        log_probs = markov_log_probs(seed, max_len=max_len, eos_bias=eos_bias)
        what = f"beam_search(log_probs (seed {seed}), beam_size={k}, max_len={max_len}, " \
               f"alpha={alpha})"
        got = fn(log_probs, k, max_len, alpha)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Hint(f"{what}: return a tuple (tokens, score), got {type(got).__name__}")
        tokens = got[0].tolist() if isinstance(got[0], torch.Tensor) else list(got[0])
        if tokens and (tokens[0] == BOS_ID or tokens[-1] == EOS_ID):
            raise Hint(f"{what}: return the tokens without BOS and EOS, got {tokens}")
        answers.append((tokens, float(got[1])))
        expected = reference_beam_search(log_probs, k, max_len, alpha)
        if failed is None and not _same(answers[-1], expected):
            failed = (what, expected, answers[-1], len(answers) - 1)
    if failed is None:
        return len(BEAM_CASES)
    what, expected, got, i = failed
    matches = []
    for mistake, message in BEAM_MISTAKES.items():
        wrong = [_mistaken_beam(markov_log_probs(seed, max_len=max_len, eos_bias=eos_bias), k,
                                max_len, alpha, mistake)
                 for seed, k, max_len, alpha, eos_bias in BEAM_CASES]
        if all(_same(a, w) for a, w in zip(answers, wrong)):
            raise Hint(f"{what}: {message}")
        if _same(got, wrong[i]):
            matches.append(message)
    if matches:
        raise Hint(f"{what}: {matches[0]}")
    if got[0] == expected[0]:
        raise Hint(f"{what}: the right tokens {got[0]}, but the score {got[1]:.4f} should "
                   f"be {expected[1]:.4f}, the log-prob divided by length_penalty(length with "
                   "EOS, alpha) (or by length_penalty(max_len, alpha) if nothing finished)")
    raise Hint(f"{what}: expected tokens {expected[0]} with score {expected[1]:.4f}, got "
               f"{got[0]} with score {got[1]:.4f}")


# ---------------------------------------------------------------------------------------------
# One training step


def reference_train_step(model, batch, optimizer, scheduler, clip=1.0, label_smoothing=0.1,
                         mistake=None):
    """One optimisation step as the package's trainer takes it; returns the loss (float)."""
    if mistake != "no-train":
        model.train()
    if mistake != "no-zero-grad":
        optimizer.zero_grad()
    logits = model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask)   # (B, T, V)
    if mistake == "pad-in-mean":
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                               label_smoothing=label_smoothing)
    else:
        loss = translation_loss(logits, batch.tgt_out, label_smoothing)
    loss.backward()
    if mistake != "no-clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    if mistake != "no-scheduler":
        scheduler.step()
    return loss.item()


STEP_MISTAKES = {
    "pad-in-mean": "the loss is averaged over PAD positions too: ignore the targets that are PAD "
                   "(translation_loss, or cross_entropy(..., ignore_index=PAD_ID))",
    "no-zero-grad": "the gradients of the previous step are still there: call "
                    "optimizer.zero_grad() before backward(), or they add up from step to step",
    "no-clip": "the gradients are not clipped before the update: call "
               "clip_grad_norm_(model.parameters(), clip) between backward() and optimizer.step()",
    "no-train": "the model is still in eval mode (no dropout): call model.train() first",
    "no-scheduler": "the learning-rate schedule does not advance: call scheduler.step() after "
                    "optimizer.step()",
}


def _training_setup(seed, dropout):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=12, d_model=16, h=2, d_ff=32, n_layers=1, dropout=dropout,
                            max_len=16)
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(4, 12, (n,), generator=g).tolist()  # noqa: E731
    batch = make_batch([rand(5), rand(3), rand(4)], [rand(6), rand(2), rand(4)])
    return model, batch


def _run_steps(step, model, batch, clip, eps, n_steps=2, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = warmup_lr_scheduler(opt, 1.0, 3)
    losses = []
    for i in range(n_steps):
        torch.manual_seed(100 + i)                     # the same dropout masks for every run
        losses.append(step(model, batch, opt, sched, clip, eps, **kw))
    return losses, sched


def _close_losses(a, b):
    return all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5) for x, y in zip(a, b))


@grader("ex-14-train-step", target="train_step")
def check_train_step(fn):
    """Checks ``train_step(model, batch, optimizer, scheduler, clip, label_smoothing) -> float``:
    two steps on a tiny Transformer with SGD and a warm-up schedule, against the package's step."""
    n = 0
    for what, seed, dropout, clip, eps in [("dropout 0.1, clip 0.05, label smoothing 0.1",
                                            0, 0.1, 0.05, 0.1),
                                           ("no dropout, clip 0.1, no label smoothing",
                                            1, 0.0, 0.1, 0.0)]:
        model, batch = _training_setup(seed, dropout)
        ref_model = copy.deepcopy(model)
        ref_losses, ref_sched = _run_steps(reference_train_step, ref_model, batch, clip, eps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # PyTorch's warning on the step order
            losses, sched = _run_steps(fn, model, batch, clip, eps)
        on = f"two train_step calls ({what})"
        for i, loss in enumerate(losses):
            if isinstance(loss, torch.Tensor):
                if loss.requires_grad:
                    raise Hint(f"{on}: return the loss as a Python float (loss.item()), not a "
                               "tensor that keeps the whole graph alive")
                losses[i] = loss.item()
            if not isinstance(losses[i], float):
                raise Hint(f"{on}: return the loss as a Python float, got {type(loss).__name__}")
        if sched.last_epoch != ref_sched.last_epoch:
            raise Hint(f"{on}: the scheduler took {sched.last_epoch} steps, expected 2: "
                       + STEP_MISTAKES["no-scheduler"])
        if dropout > 0 and not model.training:
            raise Hint(f"{on}: {STEP_MISTAKES['no-train']}")
        params, ref_params = list(model.parameters()), list(ref_model.parameters())
        same = all(torch.allclose(p, r, atol=1e-5, rtol=1e-4) for p, r in zip(params, ref_params))
        if same and _close_losses(losses, ref_losses):
            n += 1
            continue
        for mistake, message in STEP_MISTAKES.items():
            m_model, _ = _training_setup(seed, dropout)
            m_losses, _ = _run_steps(reference_train_step, m_model, batch, clip, eps,
                                     mistake=mistake)
            if _close_losses(losses, m_losses) and all(
                    torch.allclose(p, q, atol=1e-5, rtol=1e-4)
                    for p, q in zip(params, m_model.parameters())):
                raise Hint(f"{on}: {message}")
        if not _close_losses(losses, ref_losses):
            raise Hint(f"{on}: the losses {[round(x, 5) for x in losses]} should be "
                       f"{[round(x, 5) for x in ref_losses]} (mean label-smoothed cross-entropy "
                       "over the real target tokens)")
        raise Hint(f"{on}: the losses are right but the parameters after the steps differ from "
                   "zero_grad, forward, loss, backward, clip_grad_norm_, optimizer.step, "
                   "scheduler.step")
    return n
