"""The workshop (notebooks/14_workshop), part 2: the graders of the bug gallery.

Each exercise hands the reader a function with a bug that real code has shipped, and its symptom;
the reader writes the fixed function. The grader compares the fix with the package's version
(attention.masked_softmax, attention.scaled_dot_product_attention, attention.causal_mask,
sacreBLEU's corpus BLEU as bleu.bleu computes it, batching.translation_loss) on cases that trigger
the bug, and names the bug (or a half-fix) when the answer still shows it.
"""
from __future__ import annotations

import torch

from .. import PAD_ID
from ..attention import causal_mask, masked_softmax, padding_mask, scaled_dot_product_attention
from ..batching import translation_loss
from ..batching import lengths_mask
from .core import OFF_BY_ONE, Hint, expect_close, expect_shape, grader, \
    shifted_causal_mask


def _close(a, b, atol=1e-5):
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=1e-4, equal_nan=False)


# ---------------------------------------------------------------------------------------------
# Bug 1: masking with -1e-12

@grader("ex-14-bug-mask-fill", target="masked_weights")
def check_masked_weights(fn):
    """Checks ``masked_weights(scores, mask) -> weights`` against attention.masked_softmax (rows
    with at least one allowed key)."""
    n = 0
    cases = [("scores (2, 3, 5), key lengths [5, 2] as a (2, 1, 5) mask", (2, 3, 5), [5, 2], False,
              torch.float32),
             ("scores (1, 2, 4, 4) (B, h, T, S) with a causal (4, 4) mask", (1, 2, 4, 4), None,
              True, torch.float32),
             ("float64 scores (3, 2, 6), key lengths [6, 1, 3]", (3, 2, 6), [6, 1, 3], False,
              torch.float64)]
    for what, shape, lengths, causal, dtype in cases:
        scores = torch.randn(*shape, dtype=dtype) * 3
        mask = causal_mask(shape[-1]) if causal else lengths_mask(lengths, shape[-1])[:, None, :]
        before = scores.clone()
        expected = masked_softmax(scores, mask)
        got = fn(scores, mask)
        on = f"masked_weights on {what}"
        if not torch.equal(scores, before):
            raise Hint(f"{on}: the scores were changed in place (masked_fill_); use masked_fill, "
                       "which returns a new tensor")
        expect_shape(got, expected.shape, on)
        if _close(got, expected):
            n += 1
            continue
        blocked = (~mask).expand_as(scores)
        if _close(got, torch.softmax(scores.masked_fill(~mask, -1e-12), -1)) or \
                _close(got, torch.softmax(scores.masked_fill(~mask, 1e-12), -1)):
            raise Hint(f"{on}: still the bug: -1e-12 is almost zero, not a large negative number, "
                       "so exp(-1e-12) ~ 1 and every masked key keeps a weight like a key of score "
                       "0; fill with float('-inf') (or torch.finfo(scores.dtype).min)")
        if _close(got.nan_to_num(0.0), masked_softmax(scores, ~mask)):
            raise Hint(f"{on}: the mask is inverted: True means 'may attend', so fill where the "
                       "mask is False (~mask)")
        if _close(got, torch.softmax(scores, -1) * mask):
            raise Hint(f"{on}: the weights were zeroed after the softmax, so a row sums to less "
                       "than 1; mask the scores before the softmax")
        if got[blocked].abs().max() > 1e-6:
            raise Hint(f"{on}: masked keys get weight up to {got[blocked].abs().max().item():.3g}; "
                       "a masked key must get exactly 0")
        expect_close(got, expected, on)
    return n


# ---------------------------------------------------------------------------------------------
# Bug 2: a padding mask broadcast over the wrong axis

AXIS = ("the padding mask is broadcast over the query axis: key_mask[:, :, None] has shape "
        "(B, S, 1) and masks rows (queries), and a padded query's row is all -inf, whose softmax "
        "is NaN; mask the keys, the last axis: key_mask[:, None, :], shape (B, 1, S)")


@grader("ex-14-bug-padding-axis", target="padded_attention")
def check_padded_attention(fn):
    """Checks ``padded_attention(q, k, v, key_mask) -> (B, T, d_v)`` against
    attention.scaled_dot_product_attention with padding_mask(key_mask, heads=False)."""
    n = 0
    for what, B, T, S, d, lengths, dtype in [
            ("self-attention, q, k, v (2, 5, 8), key lengths [5, 3]", 2, 5, 5, 8, [5, 3],
             torch.float32),
            ("cross-attention, q (2, 3, 8), k, v (2, 6, 8), key lengths [6, 2]", 2, 3, 6, 8, [6, 2],
             torch.float32),
            ("float64 self-attention, (3, 4, 4), key lengths [1, 4, 2]", 3, 4, 4, 4, [1, 4, 2],
             torch.float64)]:
        q = torch.randn(B, T, d, dtype=dtype)
        k, v = torch.randn(B, S, d, dtype=dtype), torch.randn(B, S, d, dtype=dtype)
        key_mask = lengths_mask(lengths, S)
        mask = padding_mask(key_mask, heads=False)                     # (B, 1, S)
        expected = scaled_dot_product_attention(q, k, v, mask=mask)[0]
        on = f"padded_attention on {what}"
        try:
            got = fn(q, k, v, key_mask)
        except RuntimeError as e:
            if "size of tensor" in str(e) or "broadcast" in str(e):
                raise Hint(f"{on}: the mask does not broadcast to the scores (B, T, S) when "
                           f"T != S ({e}); {AXIS}") from None
            raise
        expect_shape(got, expected.shape, on)
        if torch.isnan(got).any():
            raise Hint(f"{on}: NaN in the output; {AXIS}")
        if _close(got, expected):
            n += 1
            continue
        if T == S:  # the real queries' rows are not masked at all: the padding is visible
            unmasked = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, -1) @ v
            if _close(got[key_mask], unmasked[key_mask]):
                raise Hint(f"{on}: {AXIS}")
        expect_close(got, expected, on)
    return n


# ---------------------------------------------------------------------------------------------
# Bug 3: a causal mask that leaks

@grader("ex-14-bug-causal-leak", target="lm_mask")
def check_lm_mask(fn):
    """Checks ``lm_mask(T) -> (T, T) bool`` (True = may attend) against attention.causal_mask."""
    for T in (2, 5, 9, 1):
        got, expected = fn(T), causal_mask(T)
        on = f"lm_mask({T})"
        expect_shape(got, (T, T), on)
        if got.dtype != torch.bool:
            raise Hint(f"{on}: return a bool mask (True = may attend), got {got.dtype}")
        if torch.equal(got, expected):
            continue
        for shift, message in OFF_BY_ONE.items():
            if torch.equal(got, shifted_causal_mask(T, shift=shift)):
                raise Hint(f"{on}: {message}")
        if torch.equal(got, ~expected):
            raise Hint(f"{on}: the mask is inverted: True means 'may attend', so the past and the "
                       "position itself are True")
        if torch.equal(got, expected.T):
            raise Hint(f"{on}: this is the upper triangle: query t sees every later key, the "
                       "future; query t may see keys s <= t (torch.tril)")
        leaks = (got & ~expected).nonzero()
        if len(leaks):
            t, s = leaks[0].tolist()
            raise Hint(f"{on}: query {t} may see key {s}, a later position (the future leaks)")
        raise Hint(f"{on}: expected {expected.int().tolist()}, got {got.int().tolist()}")
    return 4


# ---------------------------------------------------------------------------------------------
# Bug 4: corpus BLEU as a mean of sentence BLEUs

BLEU_CASES = [
    ("three sentences of different lengths",
     ["A man rides a bike on the road.", "Two dogs play.", "People are walking down a busy "
      "street at night."],
     ["A man rides a bike on a road.", "Two dogs play in the grass.", "People walk down a busy "
      "street at night."]),
    ("two sentences, one perfect", ["A dog runs in the snow.", "A woman sings on a stage."],
     ["A dog runs in the snow.", "A woman is singing on stage."]),
    ("one sentence", ["A child in a red coat jumps into a pool."],
     ["A child in a red coat jumps into the pool."]),
]


def _number(x, on):
    if isinstance(x, torch.Tensor):
        x = x.item()
    if isinstance(x, dict) or not isinstance(x, (int, float)):
        raise Hint(f"{on}: return BLEU as a number, got {type(x).__name__}")
    return float(x)


@grader("ex-14-bug-corpus-bleu", target="corpus_bleu")
def check_gallery_corpus_bleu(fn):
    """Checks ``corpus_bleu(hypotheses, references) -> float`` (detokenised text, one reference
    each) against sacreBLEU's corpus score with its default 13a tokenisation, 0..100."""
    from sacrebleu.metrics import BLEU

    n = 0
    for what, hyps, refs in BLEU_CASES:
        on = f"corpus_bleu on {what}"
        expected = BLEU().corpus_score(hyps, [refs]).score
        got = _number(fn(list(hyps), list(refs)), on)
        if abs(got - expected) < 6e-3:        # bleu.bleu rounds to 2 decimals
            n += 1
            continue
        if len(hyps) > 1:
            mean = sum(_number(fn([h], [r]), on) for h, r in zip(hyps, refs)) / len(hyps)
            if abs(got - mean) < 1e-6:
                raise Hint(f"{on}: still the bug: {got:.2f} is the mean of the sentences' "
                           f"scores; corpus BLEU adds up the n-gram matches and lengths of all "
                           f"sentences first, then takes one geometric mean and one brevity "
                           f"penalty: {expected:.2f}")
        if abs(got - expected / 100) < 1e-4:
            raise Hint(f"{on}: got {got:.4f}; report BLEU on sacreBLEU's 0..100 scale "
                       f"({expected:.2f})")
        if abs(got - BLEU(tokenize="none").corpus_score(hyps, [refs]).score) < 6e-3:
            raise Hint(f"{on}: the text was split on spaces only (tokenize='none'), so 'road.' "
                       "and 'road' differ; score detokenised text with sacreBLEU's default 13a "
                       "tokenisation (bleu.bleu does)")
        raise Hint(f"{on}: expected {expected:.2f} (sacreBLEU's corpus_score), got {got:.2f}")
    return n


# ---------------------------------------------------------------------------------------------
# Bug 5: a label-smoothed loss that takes log(0)

LOG_ZERO = ("log(0): softmax underflows to exactly 0 for a token whose logit is far below the "
            "others, and log(0) = -inf makes the loss inf (and the gradients NaN); compute the "
            "log-probabilities directly with log_softmax, which stays finite")


@grader("ex-14-bug-log-zero", target="label_smoothed_loss")
def check_label_smoothed_loss(fn):
    """Checks ``label_smoothed_loss(logits, tgt_out, eps) -> 0-dim tensor`` against
    batching.translation_loss (mean over the real tokens, eps spread over the whole vocabulary)."""
    n = 0
    for what, B, T, V, scale, eps, dtype in [
            ("logits (2, 4, 7), eps 0.1", 2, 4, 7, 1.0, 0.1, torch.float32),
            ("confident logits (2, 3, 6) of spread ~3000, eps 0.1", 2, 3, 6, 1000.0, 0.1,
             torch.float32),
            ("float64 confident logits (3, 2, 5), eps 0.2", 3, 2, 5, 1000.0, 0.2, torch.float64),
            ("logits (1, 5, 9), eps 0 (plain cross-entropy)", 1, 5, 9, 1.0, 0.0, torch.float32)]:
        logits = (torch.randn(B, T, V, dtype=dtype) * scale).requires_grad_()
        tgt_out = torch.randint(1, V, (B, T))
        tgt_out[0, -1] = PAD_ID                                         # one padded position
        expected = translation_loss(logits, tgt_out, eps).to(dtype)
        on = f"label_smoothed_loss on {what}"
        got = fn(logits, tgt_out.clone(), eps)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            raise Hint(f"{on}: return the loss as a 0-dimensional tensor (backward() needs it), "
                       f"got {type(got).__name__}"
                       + (f" of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else ""))
        if not got.requires_grad:
            raise Hint(f"{on}: the loss is detached from the logits (.item(), .detach() or "
                       "torch.tensor(...)): backward() could not train the model")
        if not torch.isfinite(got):
            raise Hint(f"{on}: the loss is {got.item()}; {LOG_ZERO}")
        if torch.allclose(got.double(), expected.double(), atol=1e-4, rtol=1e-4):
            n += 1
            continue
        with torch.no_grad():
            logp = logits.detach().log_softmax(-1)
            real = tgt_out != PAD_ID
            nll = -logp.gather(-1, tgt_out[..., None])[..., 0]
            per_token = (1 - eps) * nll - eps * logp.mean(-1)
            over_all = per_token.mean()
            others = (1 - eps) * nll - eps * (logp.sum(-1) + nll) / (V - 1)
        if torch.allclose(got.double(), over_all.double(), atol=1e-4, rtol=1e-4):
            raise Hint(f"{on}: the loss is averaged over the PAD position too; average over the "
                       "real target tokens only")
        if torch.allclose(got.double(), others[real].mean().double(), atol=1e-4, rtol=1e-4):
            raise Hint(f"{on}: eps is spread over the V - 1 other tokens; as in translation_loss "
                       "(and PyTorch's label_smoothing) spread it over the whole vocabulary, "
                       "eps / V each")
        if scale > 1:
            raise Hint(f"{on}: expected {expected.item():.6g}, got {got.item():.6g}: the loss is "
                       "finite but wrong on confident logits; clamping the probabilities (or "
                       "adding a small number before the log) hides the log(0) but changes the "
                       "loss; use log_softmax")
        expect_close(got.detach().double(), expected.detach().double(), on, atol=1e-4)
    return n
