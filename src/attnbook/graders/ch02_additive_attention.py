"""Chapter 2 (additive attention): the graders of bilinear attention and the masked softmax.

Masks are (B, S) bool, True at real tokens (may attend), False at padding (blocked)."""
from __future__ import annotations

import torch

from ..attention import masked_softmax
from ..batching import lengths_mask
from .core import Hint, expect_close, expect_pair, expect_shape, grader


def _ref_bilinear_attention(query, keys, mask, W):
    """query (B, d_q), keys (B, S, d_k), mask (B, S), W (d_q, d_k) -> (context, alpha)."""
    e = torch.einsum("bq,qk,bsk->bs", query, W, keys)                   # (B, S)
    alpha = masked_softmax(e, mask)                                      # (B, S)
    return (alpha[:, :, None] * keys).sum(1), alpha                      # (B, d_k), (B, S)


@grader("ex-02-bilinear-attention", target="bilinear_attention")
def check_bilinear_attention(fn):
    """Checks ``bilinear_attention(query, keys, mask, W) -> (context, alpha)``."""
    n = 0
    cases = [("a full mask", [5, 5, 5], 1.0, None),
             ("a padded batch with lengths [5, 3, 1] and large key values at the padding",
              [5, 3, 1], 1.0, 50.0),
             ("a batch of 1 with a single source position", [1], 1.0, None),
             ("large scores (query and keys scaled by 30)", [4, 2], 30.0, None)]
    for what, lengths, scale, pad_value in cases:
        B, S, d_q, d_k = len(lengths), max(lengths), 4, 6
        query = torch.randn(B, d_q) * scale
        keys = torch.randn(B, S, d_k) * scale
        W = torch.randn(d_q, d_k) / d_k
        mask = lengths_mask(lengths, S)
        if pad_value is not None:
            keys[~mask] = pad_value
        c_ref, a_ref = _ref_bilinear_attention(query, keys, mask, W)
        got = fn(query.clone(), keys.clone(), mask.clone(), W.clone())
        expect_pair(got, "(context, alpha)", what)
        c, alpha = got
        expect_shape(alpha, (B, S), f"alpha on {what} (query {(B, d_q)}, keys {(B, S, d_k)})")
        expect_shape(c, (B, d_k), f"context on {what}")
        if torch.isnan(alpha).any() or torch.isinf(alpha).any():
            raise Hint(f"on {what}: alpha contains NaN or inf. Large scores overflow exp(); "
                       "use torch.softmax (it subtracts the maximum first)")
        if (~mask).any() and (alpha[~mask] != 0).any():
            b, i = torch.nonzero(~mask & (alpha != 0))[0].tolist()
            raise Hint(f"on {what}: alpha[{b}, {i}] is at a padded position (mask False) and "
                       f"must be exactly 0, got {alpha[b, i].item():.3g}. Set the blocked "
                       "scores to -inf before the softmax")
        sums = alpha.sum(-1)
        if not torch.allclose(sums, torch.ones(B), atol=1e-5):
            b = int((sums - 1).abs().argmax())
            raise Hint(f"on {what}: the weights of sequence {b} sum to {sums[b].item():.4f}, "
                       "not 1: take the softmax over the source positions (the last dimension)")
        expect_close(alpha, a_ref, f"alpha on {what} (scores e_i = q^T W k_i)")
        n += 1
        expect_close(c, c_ref, f"context on {what} (c = sum_i alpha_i k_i)")
        n += 1
    return n


@grader("ex-02-masked-softmax", target="masked_softmax")
def check_masked_softmax(fn):
    """Checks ``masked_softmax(scores, mask)``: exact zeros, sums to one, all-blocked rows."""
    n = 0
    B, S = 3, 5
    full = torch.ones(B, S, dtype=torch.bool)
    padded = lengths_mask([5, 3, 1], S)
    scattered = torch.tensor([[True, False, True, False, True]]).expand(B, S)
    blocked_row = lengths_mask([4, 0, 2], S)
    cases = [("scores (3, 5) with a full mask", torch.randn(B, S), full),
             ("scores (3, 5) with padding lengths [5, 3, 1]", torch.randn(B, S), padded),
             ("scores (3, 5) with mask [T, F, T, F, T] in every row", torch.randn(B, S), scattered),
             ("scores (1, 1) with mask [[True]]", torch.randn(1, 1),
              torch.ones(1, 1, dtype=torch.bool)),
             ("large scores (times 1000) with padding", 1000 * torch.randn(B, S), padded),
             ("scores (2, 3, 5) with a (2, 1, 5) mask (broadcast over the 3 queries)",
              torch.randn(2, 3, S), lengths_mask([5, 2], S)[:, None, :]),
             ("a row whose mask is all False (lengths [4, 0, 2])", torch.randn(B, S), blocked_row)]
    for what, scores, mask in cases:
        m = mask.expand(scores.shape)
        ref = masked_softmax(scores, m)                  # an all-blocked row: all zeros
        got = fn(scores.clone(), mask.clone())
        expect_shape(got, scores.shape, f"the weights for {what}")
        if torch.isnan(got).any():
            idx = tuple(torch.nonzero(torch.isnan(got))[0].tolist())
            hint = (" A row with no allowed position must come back as all zeros, not NaN"
                    if not m.any(-1).all() else " Use torch.softmax, which subtracts the max")
            raise Hint(f"for {what}: NaN at index {idx}.{hint}")
        if (got[~m] != 0).any():
            idx = tuple(torch.nonzero(~m & (got != 0))[0].tolist())
            raise Hint(f"for {what}: position {idx} is blocked (mask False) and must get "
                       f"exactly 0 weight, got {got[idx].item():.3g}")
        sums, live = got.sum(-1), m.any(-1)
        if not torch.allclose(sums[live], torch.ones_like(sums[live]), atol=1e-5):
            idx = tuple(torch.nonzero(live & ((sums - 1).abs() > 1e-5))[0].tolist())
            raise Hint(f"for {what}: the weights of row {idx} sum to {sums[idx].item():.4f}, not "
                       "1. Zeroing blocked weights after the softmax leaves the others "
                       "unnormalised: set blocked scores to -inf before the softmax")
        expect_close(got, ref, f"the weights for {what}")
        n += 1
    return n

