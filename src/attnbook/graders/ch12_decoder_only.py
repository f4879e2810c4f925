"""Chapter 12 (from translation to chatbots): the graders of top-k filtering, the temperature,
the prompt's loss targets and one step of attention with a key-value cache."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import BOS_ID, EOS_ID, PAD_ID
from ..attention import scaled_dot_product_attention
from ..lm import prompt_target_example
from .core import Hint, expect_close, expect_pair, expect_shape, grader


def _c11_top_k_ref(logits, k):
    """logits (B, V) -> (B, V): every logit below the k-th largest of its row set to -inf (ties
    with the k-th kept), as in :func:`attnbook.lm.sample_next`."""
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


@grader("ex-12-top-k", target="top_k_filter")
def check_top_k_filter(fn):
    """Checks ``top_k_filter(logits (B, V), k) -> (B, V)``: the k largest per row kept, the rest -inf."""
    n = 0
    ties = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.5], [5.0, 5.0, 5.0, 1.0, 0.0]])
    cases = [("B=2, V=10, k=3", torch.randn(2, 10) * 2, 3),
             ("B=4, V=7, k=1 (greedy)", torch.randn(4, 7), 1),
             ("B=1, V=5, k=5 (keep everything)", torch.randn(1, 5), 5),
             ("B=3, V=6, k=10 (k larger than V)", torch.randn(3, 6), 10),
             ("B=3, V=50, k=7", torch.randn(3, 50), 7),
             ("rows with ties at the k-th value, k=2", ties, 2)]
    for what, logits, k in cases:
        before = logits.clone()
        got = fn(logits, k)
        ref = _c11_top_k_ref(before, k)
        expect_shape(got, ref.shape, f"the output for {what}")
        if not torch.equal(logits, before):
            raise Hint(f"for {what}: the input logits were changed; work on a copy "
                       "(masked_fill, not masked_fill_)")
        if torch.isfinite(got).all() and k < logits.shape[-1] and not torch.equal(got, ref):
            if torch.allclose(got.sum(-1), torch.ones(got.shape[0]), atol=1e-4):
                raise Hint(f"for {what}: your rows sum to 1; return filtered *logits* (the "
                           "removed ones -inf), not probabilities")
            raise Hint(f"for {what}: every value is finite; the removed logits must be "
                       "float('-inf'), so that softmax gives them exactly 0 (0 is a valid logit)")
        kept, kept_ref = torch.isfinite(got), torch.isfinite(ref)
        if not torch.equal(kept, kept_ref):
            if "ties" in what:
                raise Hint(f"for {what}: logits {ties.tolist()}: keep every logit equal to the "
                           f"k-th largest (compare with the k-th value, `logits < kth`), expected "
                           f"{kept_ref.sum(-1).tolist()} kept per row, got {kept.sum(-1).tolist()}")
            raise Hint(f"for {what}: expected {kept_ref.sum(-1).tolist()} logits kept per row, got "
                       f"{kept.sum(-1).tolist()}; keep the k *largest* (topk(k).values[:, -1:] is "
                       "the k-th largest of each row)")
        expect_close(got[kept], ref[kept_ref], f"the kept logits for {what} (unchanged)")
        n += 1
    return n


def _c11_temperature_ref(logits, tau):
    """softmax(logits / tau) over the last dimension; tau = 0: one-hot on the argmax."""
    if tau == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return (logits / tau).softmax(-1)


@grader("ex-12-temperature", target="temperature_softmax")
def check_temperature_softmax(fn):
    """Checks ``temperature_softmax(logits (..., V), tau) -> (..., V)``."""
    n = 0
    cases = [("shape (3, 7), tau=1", (3, 7), 1.0), ("shape (3, 7), tau=0.5", (3, 7), 0.5),
             ("shape (2, 4, 5), tau=2", (2, 4, 5), 2.0), ("shape (1, 9), tau=0.1", (1, 9), 0.1),
             ("shape (4, 6), tau=0 (greedy limit)", (4, 6), 0.0),
             ("shape (2, 3, 8), tau=0", (2, 3, 8), 0.0)]
    for what, shape, tau in cases:
        logits = torch.randn(*shape) * 2
        ref = _c11_temperature_ref(logits, tau)
        try:
            got = fn(logits.clone(), tau)
        except ZeroDivisionError:
            raise Hint(f"for {what}: tau = 0 is the limit tau -> 0, a one-hot distribution on the "
                       "argmax of each row; handle it before dividing") from None
        expect_shape(got, ref.shape, f"the probabilities for {what}")
        if tau == 0 and not torch.isfinite(got).all():
            raise Hint(f"for {what}: got NaN or inf; dividing by tau = 0 does not work, return "
                       "the one-hot distribution on the argmax instead")
        if tau not in (0, 1) and torch.allclose(got, (logits * tau).softmax(-1), atol=1e-5):
            raise Hint(f"for {what}: you multiplied by tau; divide the logits by it (tau < 1 "
                       "must sharpen the distribution, tau > 1 flatten it)")
        if tau not in (0, 1) and torch.allclose(got, logits.softmax(-1), atol=1e-5):
            raise Hint(f"for {what}: this is softmax(logits); the temperature is missing")
        if tau != 0 and not torch.allclose(got.sum(-1), torch.ones(shape[:-1]),
                                                               atol=1e-4):
            raise Hint(f"for {what}: the probabilities must sum to 1 over the last dimension "
                       "(the vocabulary): softmax(dim=-1)")
        expect_close(got.to(ref.dtype), ref, f"the probabilities for {what}", atol=1e-5)
        n += 1
    return n


@grader("ex-12-prompt-target", target="prompt_target")
def check_prompt_target(fn):
    """Checks ``prompt_target(src, tgt) -> (inputs, targets)`` (lists) against the package."""
    n = 0
    cases = [([7, 8, 9], [10, 11]), ([5], [6]), ([4, 4, 4, 4], [12, 13, 14, 15, 16]), ([20, 21], [22])]
    for src, tgt in cases:
        what = f"src={src}, tgt={tgt}"
        got = fn(list(src), list(tgt))
        expect_pair(got, "(inputs, targets)", what)
        inputs, targets = ([int(t) for t in x] for x in got)
        ref_in, ref_out = prompt_target_example(src, tgt)
        if inputs != ref_in:
            if inputs == [BOS_ID, *src, EOS_ID, *tgt, EOS_ID]:
                raise Hint(f"for {what}: inputs is the sequence without its last token (the final "
                           f"EOS is only ever a target): expected {ref_in}, got {inputs}")
            raise Hint(f"for {what}: expected inputs BOS src EOS tgt = {ref_in}, got {inputs}")
        if len(targets) != len(inputs):
            raise Hint(f"for {what}: targets must have one entry per input ({len(inputs)}), got "
                       f"{len(targets)}")
        if targets == ref_in:
            raise Hint(f"for {what}: targets equal inputs; targets[i] is the token *after* "
                       "inputs[i] (shift by one)")
        if [t for t in targets if t != PAD_ID] == [*src, EOS_ID, *tgt, EOS_ID]:
            raise Hint(f"for {what}: you kept the prompt in the loss; targets that belong to the "
                       f"prompt (src and its EOS) must be PAD_ID={PAD_ID}: expected {ref_out}")
        if targets != ref_out:
            raise Hint(f"for {what}: expected targets {ref_out}, got {targets}: PAD over the "
                       "prompt, then tgt and the final EOS (the first target token is predicted "
                       "at the prompt's EOS)")
        n += 1
    return n


@grader("ex-12-cached-step", target="cached_attention_step")
def check_cached_attention_step(fn):
    """Checks ``cached_attention_step(q, k_new, v_new, cache) -> (B, d_k)`` over t calls."""
    n = 0
    for B, T, d_k in ((2, 6, 8), (1, 1, 4), (3, 9, 16)):
        what = f"B={B}, d_k={d_k}, {T} steps"
        q, k, v = torch.randn(B, T, d_k), torch.randn(B, T, d_k), torch.randn(B, T, d_k)
        ref, _ = scaled_dot_product_attention(q, k, v, causal=True)       # (B, T, d_k)
        cache = {}
        for t in range(T):
            got = fn(q[:, t], k[:, t], v[:, t], cache)
            step = f"{what}, step {t + 1}"
            if isinstance(got, torch.Tensor) and got.shape == (B, 1, d_k):
                raise Hint(f"for {step}: return (B, d_k) = {(B, d_k)}, not (B, 1, d_k)")
            expect_shape(got, (B, d_k), f"the output at {step}")
            if not ("k" in cache and "v" in cache):
                raise Hint(f"for {step}: after the call the cache must hold cache['k'] and "
                           "cache['v'] (the keys and values of every token so far)")
            if tuple(cache["k"].shape) != (B, t + 1, d_k) or tuple(cache["v"].shape) != (B, t + 1, d_k):
                raise Hint(f"for {step}: cache['k'] and cache['v'] must be (B, t, d_k) = "
                           f"{(B, t + 1, d_k)}, got {tuple(cache['k'].shape)} and "
                           f"{tuple(cache['v'].shape)}; append the new key and value along dim 1")
            if t > 0 and torch.allclose(cache["k"][:, 0], k[:, t]) and not torch.allclose(k[:, 0], k[:, t]):
                raise Hint(f"for {step}: the newest key must be the *last* row of the cache "
                           "(torch.cat([cache['k'], k_new[:, None]], dim=1))")
            unscaled = (torch.softmax(k[:, :t + 1] @ q[:, t, :, None], dim=1)     # (B, t+1, 1)
                        .transpose(1, 2) @ v[:, :t + 1])[:, 0]                   # (B, d_k)
            if t > 0 and torch.allclose(got, unscaled, atol=1e-5) and \
                    not torch.allclose(got, ref[:, t], atol=1e-5):
                raise Hint(f"for {step}: divide the scores by sqrt(d_k) = {math.sqrt(d_k):.2f} "
                           "before the softmax")
            expect_close(got, ref[:, t], f"the output at {step} (causal attention over the whole "
                         "sequence, its row t)", atol=1e-5)
            n += 1
    return n
