"""Homework graders: one checking function per coding exercise of the book.

A grader tests the reader's function or module against a reference on random inputs and edge
cases (a batch of 1, length 1, masked positions, other dtypes) and reports either one success
line or a precise hint: which input, which shape or value, what was expected and what came back.
It never just says "wrong" and never passes a stub.

Writing a grader::

    @grader("ex-02-masked-softmax", target="masked_softmax")
    def check_masked_softmax(fn):
        ...                      # raise Hint("...") at the first failed check
        return n_checks          # the number of checks that passed

In a notebook the reader calls ``check_masked_softmax(masked_softmax)``, which prints one line. The grading
command (``python -m attnbook.homework``) looks graders up by exercise label in ``GRADERS`` and
calls ``GRADERS[label].grade(obj)``, which returns a :class:`GradeResult` instead of printing.

Graders draw their random inputs from a private, seeded generator and restore PyTorch's global
random state afterwards, so calling one never changes what a notebook computes next.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch


class Hint(Exception):
    """A failed check. The message says what was tested, what was expected and what came back."""


@dataclass
class GradeResult:
    label: str
    passed: bool
    message: str

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        return f"[{mark}] {self.label}: {self.message}"

    def __bool__(self) -> bool:
        return self.passed


@dataclass
class Grader:
    label: str      # the exercise's label in the book, e.g. "ex-02-masked-softmax"
    target: str     # the name the reader's code defines in the notebook, e.g. "masked_softmax"
    check: Callable  # raises Hint on failure, returns the number of checks passed

    def grade(self, obj) -> GradeResult:
        """Run the checks on ``obj`` and return the result (never raises for a wrong answer)."""
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1234)
                n = self.check(obj)
        except Hint as h:
            return GradeResult(self.label, False, str(h))
        except NotImplementedError:
            return GradeResult(self.label, False,
                               f"`{self.target}` is not implemented yet: replace the "
                               "`raise NotImplementedError` with your code.")
        except Exception as e:  # the reader's code crashed: say where and on what
            return GradeResult(self.label, False,
                               f"`{self.target}` raised {type(e).__name__}: {e}")
        return GradeResult(self.label, True, f"`{self.target}` passed {n} checks.")


GRADERS: dict[str, Grader] = {}


def grader(label: str, target: str):
    """Register ``check`` as the grader of exercise ``label``; the returned function prints."""
    def decorate(check):
        if label in GRADERS:
            raise ValueError(f"two graders for exercise {label!r}")
        g = Grader(label, target, check)
        GRADERS[label] = g

        @functools.wraps(check)
        def run(obj) -> None:
            print(g.grade(obj).line())

        run.grader = g
        return run
    return decorate


# ---------------------------------------------------------------------------------------------
# Helpers for writing checks

def expect_shape(got, shape, what: str) -> None:
    """Raise a Hint unless ``got`` is a tensor of exactly ``shape``."""
    if not isinstance(got, torch.Tensor):
        raise Hint(f"{what}: expected a torch.Tensor of shape {tuple(shape)}, got {type(got).__name__}")
    if tuple(got.shape) != tuple(shape):
        raise Hint(f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}")


def expect_pair(got, names: str, what: str) -> None:
    """Raise a Hint unless ``got`` is a tuple of two, e.g. names="(context, alpha)"."""
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Hint(f"on {what}: return a tuple {names}, got {type(got).__name__}")


def expect_close(got, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Raise a Hint unless ``got`` matches ``expected`` in shape, dtype and value."""
    expect_shape(got, expected.shape, what)
    if got.dtype != expected.dtype:
        raise Hint(f"{what}: expected dtype {expected.dtype}, got {got.dtype}")
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        idx = tuple(torch.nonzero(torch.isnan(got))[0].tolist())
        raise Hint(f"{what}: NaN at index {idx}; the reference has no NaN there")
    if not torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
        diff = (got.double() - expected.double()).abs().nan_to_num(0.0)
        idx = tuple(torch.nonzero(diff == diff.max())[0].tolist())
        raise Hint(f"{what}: values differ; largest difference {diff.max().item():.3g} at index "
                   f"{idx}: expected {expected[idx].item():.6g}, got {got[idx].item():.6g}")


# ---------------------------------------------------------------------------------------------
# Chapter 0: setting up

@grader("ex-00-pad", target="pad_batch")
def check_pad_batch(pad_batch):
    from .batching import pad as reference

    cases = [
        ("three sequences of lengths 3, 1, 2", [[5, 6, 7], [8], [9, 10]], 0),
        ("a batch of one", [[4, 5, 6, 7]], 0),
        ("sequences of length 1", [[9], [4]], 0),
        ("equal lengths (no padding at all)", [[4, 5], [6, 7]], 0),
        ("pad_id=99", [[5, 6, 7], [8]], 99),
    ]
    g = torch.Generator().manual_seed(0)
    for n in (2, 8, 32):
        lengths = torch.randint(1, 20, (n,), generator=g).tolist()
        seqs = [torch.randint(4, 1000, (L,), generator=g).tolist() for L in lengths]
        cases.append((f"{n} random sequences of lengths {min(lengths)}..{max(lengths)}", seqs, 0))
    checks = 0
    for what, seqs, pad_id in cases:
        out = pad_batch(seqs, pad_id=pad_id)
        expect_pair(out, "(ids, mask)", what)
        ids, mask = out
        exp_ids, exp_mask = reference(seqs, pad_id=pad_id)
        expect_shape(ids, exp_ids.shape, f"ids on {what}")
        expect_shape(mask, exp_mask.shape, f"mask on {what}")
        if ids.dtype != torch.long:
            raise Hint(f"ids on {what}: expected dtype torch.long (embedding layers need it), got {ids.dtype}")
        if mask.dtype != torch.bool:
            raise Hint(f"mask on {what}: expected dtype torch.bool, got {mask.dtype}")
        if not torch.equal(mask, exp_mask):
            b = int(torch.nonzero((mask != exp_mask).any(1))[0])
            raise Hint(f"mask on {what}, row {b}: expected {exp_mask[b].tolist()}, got "
                       f"{mask[b].tolist()} (True at real tokens, False at padding)")
        if not torch.equal(ids, exp_ids):
            b = int(torch.nonzero((ids != exp_ids).any(1))[0])
            raise Hint(f"ids on {what}, row {b}: expected {exp_ids[b].tolist()}, got {ids[b].tolist()}")
        checks += 1
    return checks


# ---------------------------------------------------------------------------------------------
# Part I: chapters 1 and 2

def _padding_mask(lengths, S: int) -> torch.Tensor:
    """(B, S) bool, True at the first lengths[b] positions of row b."""
    return torch.arange(S)[None, :] < torch.as_tensor(lengths)[:, None]


def _ref_gru_encode(x, mask, cell):
    """Reference: run ``cell`` over (B, S, I); state frozen at padding; H zero at padding."""
    B, S, _ = x.shape
    h = torch.zeros(B, cell.hidden_size, dtype=x.dtype)
    H = []
    for i in range(S):
        h = torch.where(mask[:, i, None], cell(x[:, i], h), h)
        H.append(h * mask[:, i, None])
    return torch.stack(H, 1), h


@grader("ex-01-gru-encode", target="gru_encode")
def check_gru_encode(fn):
    """Checks ``gru_encode(x, mask, cell) -> (H, h_last)`` on full and padded batches."""
    n = 0
    cases = [("a full batch (no padding)", [5, 5, 5], 5),
             ("a padded batch with lengths [5, 2, 1]", [5, 2, 1], 5),
             ("a batch of 1 sequence of length 1", [1], 1),
             ("a padded batch with lengths [2, 4]", [2, 4], 4)]
    for what, lengths, S in cases:
        B, I, Hd = len(lengths), 3, 4
        cell = torch.nn.GRUCell(I, Hd)
        x = torch.randn(B, S, I)
        mask = _padding_mask(lengths, S)
        with torch.no_grad():
            H_ref, h_ref = _ref_gru_encode(x, mask, cell)
            got = fn(x.clone(), mask.clone(), cell)
        expect_pair(got, "(H, h_last)", what)
        H, h_last = got
        expect_shape(H, (B, S, Hd), f"H on {what} (x of shape {(B, S, I)}, hidden size {Hd})")
        expect_shape(h_last, (B, Hd), f"h_last on {what}")
        pad = ~mask
        if pad.any() and H[pad].abs().max() > 0:
            b, i = (torch.nonzero(pad & (H.abs().amax(-1) > 0))[0]).tolist()
            raise Hint(f"on {what}: H[{b}, {i}] is a padded position (sequence {b} has "
                       f"{lengths[b]} real tokens) and must be all zeros, like the output of "
                       f"pad_packed_sequence; got a nonzero vector")
        expect_close(H, H_ref, f"H on {what}")
        n += 1
        b_bad = [b for b in range(B) if not torch.allclose(h_last[b], h_ref[b], atol=1e-5)]
        if b_bad:
            b = b_bad[0]
            zero = " (it is all zeros: did you take H[:, -1], which is padding?)" \
                if lengths[b] < S and not h_last[b].any() else ""
            raise Hint(f"on {what}: h_last[{b}] should be the state after token {lengths[b]} of "
                       f"sequence {b} (its last real token), i.e. H[{b}, {lengths[b] - 1}]; "
                       f"largest difference {(h_last[b] - h_ref[b]).abs().max().item():.3g}{zero}")
        n += 1
    return n


def _ref_bilinear_attention(query, keys, mask, W):
    e = torch.einsum("bq,qk,bsk->bs", query, W, keys)                   # (B, S)
    alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)  # (B, S)
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
        mask = _padding_mask(lengths, S)
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
    padded = _padding_mask([5, 3, 1], S)
    scattered = torch.tensor([[True, False, True, False, True]]).expand(B, S)
    blocked_row = _padding_mask([4, 0, 2], S)
    cases = [("scores (3, 5) with a full mask", torch.randn(B, S), full),
             ("scores (3, 5) with padding lengths [5, 3, 1]", torch.randn(B, S), padded),
             ("scores (3, 5) with mask [T, F, T, F, T] in every row", torch.randn(B, S), scattered),
             ("scores (1, 1) with mask [[True]]", torch.randn(1, 1),
              torch.ones(1, 1, dtype=torch.bool)),
             ("large scores (times 1000) with padding", 1000 * torch.randn(B, S), padded),
             ("scores (2, 3, 5) with a (2, 1, 5) mask (broadcast over the 3 queries)",
              torch.randn(2, 3, S), _padding_mask([5, 2], S)[:, None, :]),
             ("a row whose mask is all False (lengths [4, 0, 2])", torch.randn(B, S), blocked_row)]
    for what, scores, mask in cases:
        m = mask.expand(scores.shape)
        ref = torch.softmax(scores.masked_fill(~m, float("-inf")), -1).nan_to_num(0.0)
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


# ---------------------------------------------------------------------------------------------
# Chapter 4: scaled dot-product attention

def _c4_pad_mask(lengths, S: int) -> torch.Tensor:
    """(B, 1, 1, S) bool padding mask, True at the first lengths[b] positions."""
    return (torch.arange(S)[None, :] < torch.as_tensor(lengths)[:, None])[:, None, None, :]


def _c4_call(fn, what: str, *args, advice: str = "", **kwargs):
    """Call the reader's function; a crash becomes a Hint that names the input it crashed on."""
    try:
        return fn(*args, **kwargs)
    except (Hint, NotImplementedError):
        raise
    except Exception as e:
        raise Hint(f"on {what}: your function raised {type(e).__name__}: {e}{advice}") from None


def _c4_attention_ref(q, k, v, mask=None, causal=False, scale=None, dim=-1):
    """The book's attention, or (dim=-2) the same with the softmax taken over the queries."""
    from .attention import causal_mask, masked_softmax, scaled_dot_product_attention

    if dim == -1:
        return scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, scale=scale)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5                     # (..., T, S)
    if causal:
        c = causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand(scores.shape)
    w = masked_softmax(scores, mask, dim=-2)
    return w @ v, w


def _c4_attention_mistake(got, q, k, v, mask, causal) -> str | None:
    """The name of a plausible mistake whose output matches ``got``, if any."""
    from .attention import causal_mask

    d_k, d_v, T, S = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    tries = [(dict(scale=1.0), f"the scores were not scaled: divide q k^T by sqrt(d_k) = "
                               f"{d_k ** 0.5:.3g} (here d_k = {d_k})"),
             (dict(scale=1.0 / d_k), f"the scores were divided by d_k = {d_k}; divide by "
                                     f"sqrt(d_k) = {d_k ** 0.5:.3g} instead")]
    if d_v != d_k:
        tries.append((dict(scale=d_v ** -0.5), f"the scores were divided by sqrt(d_v) (d_v = "
                      f"{d_v}, the width of the values); the scale uses d_k = {d_k}, the width "
                      "of the queries and keys"))
    tries.append((dict(dim=-2), "the softmax was taken over the queries (dim -2); each query's "
                                "weights must sum to 1 over the keys, the last dimension"))
    if mask is not None:
        tries.append((dict(mask=~mask), "the mask was read the wrong way round: in this book "
                      "True means 'may attend' (a real token) and False means 'blocked', as in "
                      "F.scaled_dot_product_attention; nn.MultiheadAttention's key_padding_mask "
                      "is the opposite"))
        if causal:
            tries.append((dict(mask=None), "the mask was ignored when causal=True: combine the two "
                          "with mask & causal"))
    if causal:
        tries.append((dict(causal=False), "causal=True was ignored: block every key s > t (the "
                      "future) of query t"))
        future = ~causal_mask(T, S) | torch.eye(T, S, dtype=torch.bool)
        tries.append((dict(causal=False, mask=future if mask is None else mask & future),
                      "the causal mask is the wrong way round: query t may see keys s <= t (the "
                      "lower triangle, torch.tril), not s >= t"))
    for change, hint in tries:
        kw = dict(mask=mask, causal=causal)
        kw.update(change)
        try:
            alt, _ = _c4_attention_ref(q, k, v, **kw)
        except RuntimeError:  # this mistake cannot even be made on these shapes
            continue
        if alt.shape == got.shape and torch.allclose(got, alt.to(got.dtype), atol=1e-6, rtol=1e-5):
            return hint
    return None


@grader("ex-04-sdpa", target="scaled_dot_product_attention")
def check_scaled_dot_product_attention(fn):
    """Checks ``scaled_dot_product_attention(q, k, v, mask=None, causal=False) -> (out, weights)``
    on 2-, 3- and 4-dimensional inputs, padding and causal masks, a fully masked row, large
    scores, float32, and the gradients."""
    from .attention import causal_mask
    from .attention import scaled_dot_product_attention as reference

    g = torch.Generator().manual_seed(4)

    def rnd(*shape, dtype=torch.float64, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)

    row_blocked = torch.rand(2, 4, 5, generator=g) < 0.7
    row_blocked[0, 2] = False            # query 2 of sequence 0 sees no key at all
    row_blocked[1, 1] = True
    cases = [
        ("one sequence: q (4, 8), k (6, 8), v (6, 5)", rnd(4, 8), rnd(6, 8), rnd(6, 5), None,
         False),
        ("a batch: q (2, 4, 8), k (2, 6, 8), v (2, 6, 5)", rnd(2, 4, 8), rnd(2, 6, 8), rnd(2, 6, 5),
         None, False),
        ("heads: q (2, 3, 5, 16), k and v (2, 3, 7, 16) and (2, 3, 7, 4), padding mask "
         "(2, 1, 1, 7) with lengths [7, 4]", rnd(2, 3, 5, 16), rnd(2, 3, 7, 16), rnd(2, 3, 7, 4),
         _c4_pad_mask([7, 4], 7), False),
        ("causal self-attention: q, k, v (2, 3, 6, 8), causal=True", rnd(2, 3, 6, 8),
         rnd(2, 3, 6, 8), rnd(2, 3, 6, 8), None, True),
        ("causal self-attention with padding: q, k, v (2, 2, 6, 8), lengths [6, 3], causal=True",
         rnd(2, 2, 6, 8), rnd(2, 2, 6, 8), rnd(2, 2, 6, 8), _c4_pad_mask([6, 3], 6), True),
        ("a (2, 4, 5) mask in which query 2 of sequence 0 may attend to no key at all",
         rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3), row_blocked, False),
        ("large scores: q and k (2, 5, 64) times 30", rnd(2, 5, 64, scale=30.0),
         rnd(2, 5, 64, scale=30.0), rnd(2, 5, 4), None, False),
        ("float32 inputs: q, k, v (2, 4, 8)", rnd(2, 4, 8, dtype=torch.float32),
         rnd(2, 4, 8, dtype=torch.float32), rnd(2, 4, 8, dtype=torch.float32), None, False),
    ]
    n = 0
    for what, q, k, v, mask, causal in cases:
        kwargs = {}
        if mask is not None:
            kwargs["mask"] = mask.clone()
        if causal:
            kwargs["causal"] = True
        got = _c4_call(fn, what, q.clone(), k.clone(), v.clone(), **kwargs)
        out_ref, w_ref = reference(q, k, v, mask=mask, causal=causal)
        expect_pair(got, "(out, weights)", what)
        out, w = got
        if (isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
                and out_ref.shape != w_ref.shape
                and out.shape == w_ref.shape and w.shape == out_ref.shape):
            raise Hint(f"on {what}: return (out, weights) in that order; you returned the weights "
                       f"{tuple(out.shape)} first and the output {tuple(w.shape)} second")
        expect_shape(out, out_ref.shape, f"out on {what}")
        expect_shape(w, w_ref.shape, f"weights on {what}")
        if out.dtype != q.dtype:
            raise Hint(f"out on {what}: expected dtype {q.dtype} (the dtype of q), got {out.dtype}")
        allowed = torch.ones(w_ref.shape, dtype=torch.bool)
        if mask is not None:
            allowed = allowed & mask
        if causal:
            allowed = allowed & causal_mask(q.shape[-2], k.shape[-2])
        empty = ~allowed.any(-1)                                       # (..., T) fully masked rows
        if torch.isnan(out).any() or torch.isnan(w).any():
            bad = torch.isnan(w).any(-1) | torch.isnan(out).any(-1)
            idx = tuple(torch.nonzero(bad)[0].tolist())
            if empty[idx]:
                raise Hint(f"on {what}: NaN in query row {idx}, whose keys are all blocked. The "
                           "softmax of a row of -inf is 0/0 = NaN; return all-zero weights and "
                           "a zero output for such a row (NaN would spread to everything that "
                           "touches it, even multiplied by 0)")
            raise Hint(f"on {what}: NaN in query row {idx}. Large scores overflow exp(); use "
                       "torch.softmax, which subtracts each row's maximum first")
        if not torch.allclose(out, out_ref, atol=1e-5, rtol=1e-4):
            mistake = _c4_attention_mistake(out, q, k, v, mask, causal)
            if mistake is not None:
                raise Hint(f"on {what}: {mistake}")
            if (w[~allowed] != 0).any():
                idx = tuple(torch.nonzero(~allowed & (w != 0))[0].tolist())
                if empty[idx[:-1]]:
                    raise Hint(f"on {what}: query row {list(idx[:-1])} may attend to no key, so "
                               f"its weights must all be 0, got {w[idx].item():.3g} at key "
                               f"{idx[-1]}. A large negative fill value such as -1e9 makes such "
                               "a row uniform, attending to padding; give it zero weights")
                raise Hint(f"on {what}: weights{list(idx)} belongs to a blocked key and must be "
                           f"exactly 0, got {w[idx].item():.3g}; set blocked scores to -inf "
                           "before the softmax")
        expect_close(out, out_ref, f"out on {what}")
        expect_close(w, w_ref, f"weights on {what}")
        n += 1

    # Gradients flow back to q, k and v as they do through the reference.
    what = ("the gradients of (out * g).sum() for causal attention with padding, q, k, v "
            "(2, 2, 6, 8)")
    q, k, v = (rnd(2, 2, 6, 8).requires_grad_() for _ in range(3))
    mask = _c4_pad_mask([6, 3], 6)
    out, _ = _c4_call(fn, what, q, k, v, mask=mask.clone(), causal=True)
    upstream = rnd(*out.shape)
    if not out.requires_grad:
        raise Hint(f"on {what}: out does not require grad; do not use torch.no_grad(), .detach() "
                   "or .data inside the function, or nothing can be trained through it")
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v), allow_unused=True)
    out_ref, _ = reference(q, k, v, mask=mask, causal=True)
    refs = torch.autograd.grad((out_ref * upstream).sum(), (q, k, v))
    for name, got_g, ref_g in zip("qkv", grads, refs):
        if got_g is None:
            raise Hint(f"on {what}: no gradient reaches {name}; it must take part in the "
                       "computation through differentiable operations")
        expect_close(got_g, ref_g, f"the gradient with respect to {name} on {what}")
    return n + 1


def _c4_entropy_ref(d_k: int, scale: float, S: int, n: int = 50_000) -> float:
    """Mean entropy (nats) of softmax(scale * q . k_s) over S keys, q and k_s i.i.d. N(0, 1).

    Given q, the S dot products q . k_s are independent N(0, |q|^2), and |q|^2 is chi-square with
    d_k degrees of freedom, so the scores can be drawn directly (no (n, S, d_k) tensor).
    """
    norm2 = torch.distributions.Chi2(torch.tensor(float(d_k), dtype=torch.float64)).sample((n, 1))
    e = scale * norm2.sqrt() * torch.randn(n, S, dtype=torch.float64)   # (n, S)
    logw = torch.log_softmax(e, dim=-1)
    return float(-(logw.exp() * logw).sum(-1).mean())


@grader("ex-04-attention-entropy", target="attention_entropy")
def check_attention_entropy(fn):
    """Checks ``attention_entropy(d_k, scaled=True, n=1000, S=32) -> float`` against the exact
    distribution, within a tolerance much wider than the sampling noise of n queries."""
    import math

    cases = [(4, True, 2000, 32), (4, False, 2000, 32), (64, True, 2000, 32),
             (64, False, 2000, 32), (256, False, 1000, 32), (16, True, 2000, 8)]
    n_checks = 0
    for d_k, scaled, n, S in cases:
        what = f"attention_entropy(d_k={d_k}, scaled={scaled}, n={n}, S={S})"
        got = _c4_call(fn, what, d_k, scaled=scaled, n=n, S=S)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (float, int)):
            raise Hint(f"{what}: return the mean entropy as one Python float (use .item()), got "
                       f"{type(got).__name__}" + (f" of shape {tuple(got.shape)}"
                                                  if isinstance(got, torch.Tensor) else ""))
        got = float(got)
        scale = d_k ** -0.5 if scaled else 1.0
        ref = _c4_entropy_ref(d_k, scale, S)
        tol = 0.05 + 0.03 * ref
        if math.isnan(got):
            raise Hint(f"{what}: got NaN. Without the scaling some weights underflow to exactly 0, "
                       "and 0 * log(0) = 0 * (-inf) = NaN; a zero weight contributes 0 to the "
                       "entropy: use torch.special.xlogy(w, w), or log_softmax for log(w)")
        if S != 32 and abs(got - _c4_entropy_ref(d_k, scale, 32)) <= tol < abs(got - ref):
            raise Hint(f"{what}: got {got:.3f}, the value for 32 keys; use S={S} keys per query")
        if got > math.log(S) + 1e-6:
            raise Hint(f"{what}: got {got:.4f}, more than ln(S) = {math.log(S):.4f}, the entropy "
                       "of uniform weights and the largest possible. Use the natural logarithm, "
                       "and average over the queries (do not sum)")
        if got < -1e-9:
            raise Hint(f"{what}: got {got:.4f}; an entropy is never negative: "
                       "H = -sum_s w_s log w_s")
        if abs(got - ref) <= tol:
            n_checks += 1
            continue
        other = _c4_entropy_ref(d_k, 1.0 if scaled else d_k ** -0.5, S)
        if abs(got - other) <= tol:
            other_name = "without" if scaled else "with"
            raise Hint(f"{what}: got {got:.3f}, which is the value {other_name} the scaling "
                       f"(expected about {ref:.3f}). " +
                       ("Divide the scores by sqrt(d_k) when scaled=True" if scaled else
                        "With scaled=False use the raw dot products q . k"))
        if scaled and abs(got - _c4_entropy_ref(d_k, 1.0 / d_k, S)) <= tol:
            raise Hint(f"{what}: got {got:.3f}, expected about {ref:.3f}: the scores seem divided "
                       f"by d_k = {d_k} instead of sqrt(d_k) = {d_k ** 0.5:.3g}")
        if ref > 0.5 and abs(got * math.log(2) - ref) <= tol:
            raise Hint(f"{what}: got {got:.3f}, expected about {ref:.3f}: that is the entropy in "
                       "bits; use the natural logarithm (torch.log), which gives nats")
        raise Hint(f"{what}: expected about {ref:.3f} (within {tol:.3f}: q and each of the S keys "
                   f"drawn with i.i.d. N(0, 1) components), got {got:.3f}")
    return n_checks


@grader("ex-04-chunked-attention", target="chunked_attention")
def check_chunked_attention(fn):
    """Checks ``chunked_attention(q, k, v, mask=None, chunk_size=64) -> out``: the same output as
    the book's attention for several chunk sizes and masks, and a peak memory well below that of
    the full score matrix."""
    from .attention import scaled_dot_product_attention as reference
    from .bench import peak_memory, score_matrix_bytes

    g = torch.Generator().manual_seed(4)

    def rnd(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    blocked = torch.rand(2, 10, 12, generator=g) < 0.7
    blocked[1, 3] = False                       # query 3 of sequence 1 sees no key at all
    cases = [
        ("q (2, 3, 10, 8), k and v (2, 3, 12, 8) and (2, 3, 12, 5), chunk_size=4 (10 is not a "
         "multiple of 4)", rnd(2, 3, 10, 8), rnd(2, 3, 12, 8), rnd(2, 3, 12, 5), None, 4),
        ("the same shapes with a (2, 1, 1, 12) padding mask (lengths [12, 5]), chunk_size=3",
         rnd(2, 3, 10, 8), rnd(2, 3, 12, 8), rnd(2, 3, 12, 5), _c4_pad_mask([12, 5], 12), 3),
        ("q (2, 10, 8), k and v (2, 12, 8), a (2, 10, 12) mask in which query 3 of sequence 1 "
         "sees no key, chunk_size=4", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), blocked, 4),
        ("chunk_size=64, larger than T=10", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), None, 64),
        ("chunk_size=1", rnd(2, 10, 8), rnd(2, 12, 8), rnd(2, 12, 8), _c4_pad_mask([12, 7], 12)[:, 0],
         1),
    ]
    n = 0
    for what, q, k, v, mask, c in cases:
        kwargs = {"chunk_size": c}
        if mask is not None:
            kwargs["mask"] = mask.clone()
        advice = ""
        if mask is not None and mask.shape[-2] == 1:
            advice = (f". The mask has shape {tuple(mask.shape)}: its query dimension has size 1 "
                      "and broadcasts over all T queries, so mask[..., i:i + chunk_size, :] is "
                      "empty for i > 0. Slice it only where mask.shape[-2] == T, or first expand "
                      "it to (..., T, S) (a view: no copy)")
        got = _c4_call(fn, what, q.clone(), k.clone(), v.clone(), advice=advice, **kwargs)
        ref, _ = reference(q, k, v, mask=mask)
        if isinstance(got, tuple):
            raise Hint(f"on {what}: return only the output tensor out (..., T, d_v), not a tuple")
        if (isinstance(got, torch.Tensor) and got.dim() == ref.dim()
                and got.shape[-2] < ref.shape[-2]):
            raise Hint(f"on {what}: out has {got.shape[-2]} query rows, expected T = "
                       f"{ref.shape[-2]}; the last chunk may be shorter than chunk_size and must "
                       "not be dropped (range(0, T, chunk_size) visits every chunk)")
        expect_shape(got, ref.shape, f"out on {what}")
        if torch.isnan(got).any():
            raise Hint(f"on {what}: NaN in the output. A query whose keys are all blocked must get "
                       "a zero output (the book's attention function already does this)")
        if not torch.allclose(got, ref, atol=1e-6, rtol=1e-5):
            mistake = _c4_attention_mistake(got, q, k, v, mask, False)
            if mistake is not None:
                raise Hint(f"on {what}: {mistake}")
        expect_close(got, ref, f"out on {what}")
        n += 1

    # Memory: one chunk of scores at a time, never the whole (B, h, T, S) matrix.
    B, h, T, d_k = 1, 2, 1024, 32
    q, k, v = rnd(B, h, T, d_k, dtype=torch.float32), rnd(B, h, T, d_k, dtype=torch.float32), \
        rnd(B, h, T, d_k, dtype=torch.float32)
    what = f"q, k, v of shape {(B, h, T, d_k)} (float32), chunk_size=64"
    full = score_matrix_bytes(B, h, T)
    try:
        peak = peak_memory(fn, q, k, v, chunk_size=64)
    except (Hint, NotImplementedError):
        raise
    except Exception as e:
        raise Hint(f"on {what}: your function raised {type(e).__name__}: {e}") from None
    if peak > full / 2:
        raise Hint(f"on {what}: the call used {peak / 2**20:.1f} MiB at its peak, while the full "
                   f"(B, h, T, S) score matrix takes {full / 2**20:.1f} MiB. Compute the scores of "
                   "one chunk of queries at a time, q[..., i:i + chunk_size, :] against all keys, "
                   "so that only a (chunk_size, S) block exists at any moment")
    expect_close(fn(q, k, v, chunk_size=64), reference(q, k, v)[0], f"out on {what}")
    return n + 1


# ---------------------------------------------------------------------------------------------
# Chapter 7: positional encoding

def _ch07_table(T: int, d_model: int, base: float = 10000.0, *, start: int = 0,
                two_j: bool = True, layout: str = "interleaved") -> torch.Tensor:
    """Sinusoidal table and its typical mistakes (positions from ``start``, exponent j instead of
    2j, sines and cosines swapped or in two halves), in float64, for the hints."""
    p = torch.arange(start, start + T, dtype=torch.float64)[:, None]            # (T, 1)
    j = torch.arange(d_model // 2, dtype=torch.float64)
    omega = base ** (-(2 * j if two_j else j) / d_model)                      # (d_model/2,)
    sin, cos = torch.sin(p * omega), torch.cos(p * omega)                     # (T, d_model/2)
    if layout == "halves":
        return torch.cat([sin, cos], dim=1)
    first, second = (cos, sin) if layout == "swapped" else (sin, cos)
    return torch.stack([first, second], dim=-1).reshape(T, d_model)


@grader("ex-07-sinusoid-table", target="sinusoid_table")
def check_sinusoid_table(fn):
    """Checks ``sinusoid_table(T, d_model, base=10000.0) -> (T, d_model) float32``."""
    from .positional import sinusoidal_encoding

    n = 0
    mistakes = [
        (dict(layout="halves"), "all the sines come first and then all the cosines; interleave "
         "them: column 2j holds sin(p * omega_j) and column 2j+1 holds cos(p * omega_j)"),
        (dict(layout="swapped"), "sine and cosine are swapped: column 2j is sin(p * omega_j), "
         "column 2j+1 is cos(p * omega_j) (so row 0 is [0, 1, 0, 1, ...])"),
        (dict(start=1), "the positions start at 1; they start at 0, so row 0 is [0, 1, 0, 1, ...]"),
        (dict(two_j=False), "the frequencies are wrong: omega_j = base ** (-2j / d_model) for "
         "pair j = 0 .. d_model/2 - 1 (the exponent has 2j, not j)"),
    ]
    cases = [("T=10, d_model=8", 10, 8, None), ("T=1, d_model=2", 1, 2, None),
             ("T=50, d_model=32", 50, 32, None), ("T=7, d_model=6, base=100.0", 7, 6, 100.0),
             ("T=20, d_model=16, base=10.0", 20, 16, 10.0)]
    for what, T, d_model, base in cases:
        got = fn(T, d_model) if base is None else fn(T, d_model, base=base)
        b = 10000.0 if base is None else base
        expect_shape(got, (T, d_model), f"sinusoid_table for {what}")
        if got.dtype != torch.float32:
            raise Hint(f"sinusoid_table for {what}: expected dtype torch.float32, got {got.dtype}")
        expected = sinusoidal_encoding(T, d_model, base=b)
        if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            for kwargs, message in mistakes:
                if T > 1 and torch.allclose(got.double(), _ch07_table(T, d_model, b, **kwargs),
                                            atol=1e-4, rtol=1e-4):
                    raise Hint(f"sinusoid_table for {what}: {message}")
            if base is not None and torch.allclose(got, sinusoidal_encoding(T, d_model),
                                                   atol=1e-4, rtol=1e-4):
                raise Hint(f"sinusoid_table for {what}: the result is the table for base "
                           f"10000; use the `base` argument (omega_j = base ** (-2j / d_model))")
            expect_close(got, expected, f"sinusoid_table for {what} (rows are positions "
                         "p = 0..T-1, column 2j = sin(p * omega_j), column 2j+1 = cos(p * omega_j))",
                         atol=1e-4, rtol=1e-4)
        n += 1
    try:
        fn(4, 5)
    except ValueError:
        n += 1
    except Exception as e:
        raise Hint(f"sinusoid_table(4, 5): an odd d_model has no sin/cos pairs; raise a ValueError "
                   f"that says so, not {type(e).__name__}: {e}") from None
    else:
        raise Hint("sinusoid_table(4, 5): an odd d_model has no sin/cos pairs; raise a ValueError "
                   "that says so instead of returning a table")
    return n


def _ch07_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, *,
               sign: float = 1.0, two_j: bool = True, halves: bool = False) -> torch.Tensor:
    """Rotary position embedding: rotate each pair (2j, 2j+1) of the last dimension of x (..., T, d)
    by the angle positions[t] * omega_j, omega_j = base ** (-2j / d). The keyword arguments give
    typical mistakes (the wrong direction, exponent j, the pairs (j, j + d/2)), for the hints."""
    d = x.shape[-1]
    j = torch.arange(d // 2, dtype=torch.float64)
    omega = base ** (-(2 * j if two_j else j) / d)                            # (d/2,)
    angle = sign * positions.to(torch.float64)[:, None] * omega               # (T, d/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    xd = x.double()
    x1, x2 = (xd[..., :d // 2], xd[..., d // 2:]) if halves else (xd[..., 0::2], xd[..., 1::2])
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos                         # (..., T, d/2)
    out = torch.cat([r1, r2], -1) if halves else torch.stack([r1, r2], -1).flatten(-2)
    return out.to(x.dtype)


@grader("ex-07-rope", target="apply_rope")
def check_apply_rope(fn):
    """Checks ``apply_rope(x, positions)``: x (..., T, d), positions (T,) -> (..., T, d)."""
    n = 0
    shapes = [("x of shape (T, d) = (5, 8)", (5, 8)), ("x of shape (B, T, d) = (2, 6, 4)", (2, 6, 4)),
              ("x of shape (B, h, T, d) = (2, 3, 7, 16)", (2, 3, 7, 16)),
              ("x of shape (B, h, T, d) = (1, 1, 1, 2)", (1, 1, 1, 2))]
    for what, shape in shapes:
        x = torch.randn(shape)
        positions = torch.arange(shape[-2])
        x_before = x.clone()
        got = fn(x, positions)
        expect_shape(got, shape, f"apply_rope on {what}")
        if got.dtype != x.dtype:
            raise Hint(f"apply_rope on {what}: expected dtype {x.dtype} (the dtype of x), got {got.dtype}")
        if not torch.equal(x, x_before):
            raise Hint(f"apply_rope on {what}: x was changed in place; return a new tensor and "
                       "leave the input alone (the caller may still need the unrotated vectors)")
        n += 1
    x = torch.randn(2, 3, 10, 16)
    positions = torch.arange(10) * 3
    got = fn(x, positions)
    norms_in, norms_out = x.norm(dim=-1), got.norm(dim=-1)
    if not torch.allclose(norms_in, norms_out, atol=1e-4, rtol=1e-4):
        k = int((norms_in - norms_out).abs().flatten().argmax())
        raise Hint(f"apply_rope on x (2, 3, 10, 16) at positions 0, 3, ..., 27: a rotation keeps "
                   f"the length of every vector, but one of length {norms_in.flatten()[k]:.4f} "
                   f"came back with length {norms_out.flatten()[k]:.4f}. Rotate each pair "
                   "(x_2j, x_2j+1); do not add the sinusoids to x")
    n += 1
    x = torch.randn(3, 4, 8)
    got = fn(x, torch.zeros(4, dtype=torch.long))
    if not torch.allclose(got, x, atol=1e-5):
        ignored = torch.allclose(got, _ch07_rope(x, torch.arange(4)), atol=1e-4)
        raise Hint("apply_rope with positions [0, 0, 0, 0]: every rotation angle is "
                   "0 * omega_j = 0, so the vectors must come back unchanged; they did not"
                   + (". `positions` was ignored (the result is that of positions 0..T-1); rotate "
                      "row t by the angle positions[t] * omega_j" if ignored else ""))
    n += 1
    d = 16
    q, k = torch.randn(d), torch.randn(d)
    for t, s in [(3, 7), (10, 2), (5, 5)]:
        scores = []
        for c in (0, 4, 25):
            qt = fn(q[None], torch.tensor([t + c]))[0]
            ks = fn(k[None], torch.tensor([s + c]))[0]
            scores.append(float(qt @ ks))
        if max(scores) - min(scores) > 1e-3 * (1 + abs(scores[0])):
            raise Hint(f"q at position t and k at position s: the score q.k after rotation must "
                       f"depend only on the offset s - t = {s - t}, but (t, s) = ({t}, {s}), "
                       f"({t + 4}, {s + 4}), ({t + 25}, {s + 25}) gave {scores[0]:.4f}, "
                       f"{scores[1]:.4f}, {scores[2]:.4f}. Rotate by positions[t] * omega_j, "
                       "the same rule for queries and keys")
        n += 1
    x = torch.randn(2, 5, 8)
    for what, positions in [("positions 7, 8, 9, 10, 11", torch.arange(7, 12)),
                            ("positions 0, 2, 4, 6, 8", torch.arange(0, 10, 2)),
                            ("positions 4, 3, 2, 1, 0", torch.arange(4, -1, -1))]:
        got = fn(x, positions)
        expected = _ch07_rope(x, positions)
        if torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            n += 1
            continue
        mistakes = [
            (_ch07_rope(x, torch.arange(5)), "`positions` was ignored (the result is that of "
             "positions 0..T-1); rotate row t by the angle positions[t] * omega_j"),
            (_ch07_rope(x, positions, sign=-1.0), "each pair is rotated the wrong way: "
             "x'_2j = x_2j cos(a) - x_2j+1 sin(a) and x'_2j+1 = x_2j sin(a) + x_2j+1 cos(a), "
             "with a = positions[t] * omega_j"),
            (_ch07_rope(x, positions, halves=True), "dimension j is paired with j + d/2 (the "
             "'rotate half' layout of some libraries); the book pairs (2j, 2j+1), like the columns "
             "of the sinusoidal table"),
            (_ch07_rope(x, positions, two_j=False), "the frequencies are wrong: omega_j = "
             "10000 ** (-2j / d) for pair j (the exponent has 2j, not j)"),
        ]
        for wrong, message in mistakes:
            if torch.allclose(got, wrong, atol=1e-4, rtol=1e-4):
                raise Hint(f"apply_rope on x (2, 5, 8) at {what}: {message}")
        expect_close(got, expected, f"apply_rope on x (2, 5, 8) at {what}", atol=1e-4, rtol=1e-4)
    return n


# ---------------------------------------------------------------------------------------------
# Chapter 6: masking and cross-attention

def _ref_causal_mask(T: int, S: int | None = None) -> torch.Tensor:
    """(T, S) bool, True where query t (at position t + S - T) may see key i."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)


def _first_difference(got: torch.Tensor, ref: torch.Tensor) -> tuple:
    return tuple(torch.nonzero(got != ref)[0].tolist())


@grader("ex-06-causal-mask", target="make_causal_mask")
def check_make_causal_mask(make_causal_mask):
    """Checks ``make_causal_mask(T, S=None) -> (T, S)`` bool, True where key i <= t + (S - T)."""
    n = 0
    cases = [(5, None), (2, None), (4, 4), (1, None), (2, 5), (1, 3), (4, 7)]
    for T, S in cases:
        args = (T,) if S is None else (T, S)
        call = f"make_causal_mask({', '.join(map(str, args))})"
        ref = _ref_causal_mask(T, S)
        got = make_causal_mask(*args)
        expect_shape(got, ref.shape, f"{call} (rows: the T queries, columns: the S keys)")
        if got.dtype != torch.bool:
            raise Hint(f"{call}: expected dtype torch.bool (True = may attend, False = blocked), "
                       f"got {got.dtype}. A float mask of 0 and -inf is PyTorch's other "
                       "convention; this book's masks are bool")
        if torch.equal(got, ref):
            n += 1
            continue
        square = S is None or S == T
        mistakes = [
            (~ref, "True and False are swapped. In this book True means 'may attend': query t "
                   "sees itself and the past"),
            (ref.T.contiguous() if square else None,
             "this is the upper triangle: it lets query t see the future and hides the past. "
             "Row t is the query and column i the key; query t may see keys i <= t (torch.tril)"),
            (torch.ones_like(ref).tril(-1) if square else None,
             "the diagonal is False, but position t must see itself (key i = t)"),
            (torch.ones_like(ref).tril(1) if square else None,
             "off by one: query t also sees key t + 1, the next token, which is the very token "
             "it must predict"),
            (None if square else torch.ones_like(ref).tril(0),
             f"with S = {S} keys and T = {T} queries, the queries are the *last* T positions (as "
             "when decoding with a cache of earlier keys): query t sits at position t + S - T and "
             "may see keys i <= t + (S - T). Your mask treats it as position t"),
        ]
        for wrong, message in mistakes:
            if wrong is not None and torch.equal(got, wrong):
                raise Hint(f"{call}: {message}")
        t, i = _first_difference(got, ref)
        raise Hint(f"{call}: entry [{t}, {i}] should be {bool(ref[t, i])} (query {t} "
                   f"{'may' if ref[t, i] else 'may not'} see key {i}), got {bool(got[t, i])}")
    return n


@grader("ex-06-decoder-mask", target="make_decoder_mask")
def check_make_decoder_mask(make_decoder_mask):
    """Checks ``make_decoder_mask(pad_mask (B, T)) -> (B, 1, T, T)``: real keys and no future."""
    n = 0
    g = torch.Generator().manual_seed(6)
    cases = [("lengths [5, 3, 1]", [5, 3, 1], 5),
             ("left padding (lengths [2, 4], padded on the left)", [2, 4], 4),
             ("a batch of 1 without padding (length 4)", [4], 4),
             ("lengths [1, 2]", [1, 2], 2),
             ("a batch of 1 of length 1", [1], 1),
             ("6 random lengths in 1..7", torch.randint(1, 8, (6,), generator=g).tolist(), 7)]
    for what, lengths, T in cases:
        B = len(lengths)
        pad_mask = _padding_mask(lengths, T)                         # (B, T)
        if what.startswith("left"):
            pad_mask = pad_mask.flip(1)
        keys = pad_mask[:, None, None, :]                            # (B, 1, 1, T)
        queries = pad_mask[:, None, :, None]                         # (B, 1, T, 1)
        causal = _ref_causal_mask(T)                                 # (T, T)
        ref = keys & causal                                          # (B, 1, T, T)
        given = pad_mask.clone()
        got = make_decoder_mask(given)
        on = f"make_decoder_mask on a (B, T) = {(B, T)} padding mask with {what}"
        if not torch.equal(given, pad_mask):
            raise Hint(f"{on}: the padding mask passed in was modified; build a new tensor")
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T, T) and T > 1:
            raise Hint(f"{on}: expected shape {(B, 1, T, T)}, got {(B, T, T)}. Keep a dimension "
                       "of size 1 for the heads, so that the mask broadcasts over scores of shape "
                       "(B, h, T, T)")
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, 1, 1, T) and T > 1:
            raise Hint(f"{on}: got shape {(B, 1, 1, T)}, which is the padding mask alone. Combine "
                       "it with the (T, T) causal mask using &, to get (B, 1, T, T)")
        expect_shape(got, ref.shape, on)
        if got.dtype != torch.bool:
            raise Hint(f"{on}: expected dtype torch.bool (True = may attend), got {got.dtype}")
        if torch.equal(got, ref):
            n += 1
            continue
        rows_message = ("you blocked whole rows, those of padded queries. Padding must block "
                        "keys (columns i), not queries (rows t): mask[b, 0, t, i] = pad_mask[b, i] "
                        "and i <= t, as in MultiHeadAttention(key_mask=..., causal=True). The "
                        "outputs at padded positions are ignored by the loss anyway, and a row "
                        "with every key blocked makes PyTorch's softmax return NaN")
        mistakes = [
            (~ref, "True and False are swapped. In this book True means 'may attend'"),
            (queries & causal, rows_message),
            (keys & queries & causal, rows_message),
            (keys.expand(B, 1, T, T), "future keys are visible: the causal part is missing "
                                      "(key i is allowed only if i <= t)"),
            (causal.expand(B, 1, T, T), "padded keys are visible: the padding part is missing "
                                        "(key i is allowed only if pad_mask[b, i] is True)"),
            (keys | causal, "you combined the masks with | (or). A key must be a real token *and* "
                            "not in the future: use &"),
            (keys & causal.T, "the causal part is the upper triangle: query t sees the future "
                              "and not the past. Row t is the query, column i the key; use "
                              "torch.tril"),
        ]
        for wrong, message in mistakes:
            if torch.equal(got, wrong.expand(B, 1, T, T)):
                raise Hint(f"{on}: {message}")
        b, _, t, i = _first_difference(got, ref)
        reason = ("a padded key" if not pad_mask[b, i] else
                  "a future key" if i > t else "a real key in the past")
        raise Hint(f"{on}: entry [{b}, 0, {t}, {i}] should be {bool(ref[b, 0, t, i])} (key {i} of "
                   f"sequence {b} is {reason} for query {t}), got {bool(got[b, 0, t, i])}")
    return n


class _Peek(torch.nn.Module):
    """A causal model plus a leak: the output at position ``to`` also reads the token at ``frm``."""

    def __init__(self, base: torch.nn.Module, frm: int, to: int, vocab_size: int):
        super().__init__()
        self.base, self.frm, self.to = base, frm, to
        self.leak = torch.nn.Embedding(vocab_size, vocab_size)

    def forward(self, ids):                                     # (B, T) -> (B, T, V)
        out = self.base(ids).clone()
        if ids.shape[1] > max(self.frm, self.to):
            out[:, self.to] = out[:, self.to] + self.leak(ids[:, self.frm])
        return out


def _leak_models(vocab_size: int, T: int):
    """(description, model, leaks?) triples: honest models and models that see the future."""
    from .transformer import SelfAttentionStack, TransformerConfig

    def stack(causal, positional="sinusoidal"):
        cfg = TransformerConfig(vocab_size=vocab_size, d_model=16, h=2, d_ff=32, n_layers=2,
                                dropout=0.0, max_len=64, positional=positional)
        return SelfAttentionStack(cfg, causal=causal).eval()

    return [
        ("a causal SelfAttentionStack (no leak)", stack(True), False),
        ("a SelfAttentionStack without the causal mask (every position sees the future)",
         stack(False), True),
        ("a causal SelfAttentionStack without positional encoding (no leak)",
         stack(True, "none"), False),
        ("a causal model whose output at position 0 also reads the last token",
         _Peek(stack(True), T - 1, 0, vocab_size).eval(), True),
        (f"a causal model whose output at position {T // 2} also reads token {T // 2 + 1}",
         _Peek(stack(True), T // 2 + 1, T // 2, vocab_size).eval(), True),
        ("a causal model whose output at position 1 also reads token 0 (the past: no leak)",
         _Peek(stack(True), 0, 1, vocab_size).eval(), False),
    ]


@grader("ex-06-leak-detector", target="leaks_future")
def check_leaks_future(leaks_future):
    """Checks ``leaks_future(model, T, vocab_size) -> bool`` on honest and leaking models."""
    n = 0
    for vocab_size, T in [(12, 8), (20, 5)]:
        for what, model, leaks in _leak_models(vocab_size, T):
            with torch.no_grad():
                got = leaks_future(model, T, vocab_size)
            if isinstance(got, torch.Tensor) and got.numel() == 1:
                got = bool(got.item())
            if not isinstance(got, bool):
                raise Hint(f"leaks_future(model, T={T}, vocab_size={vocab_size}) on {what}: "
                           f"return True or False, got {type(got).__name__}")
            if got != leaks:
                if leaks:
                    hint = ("it leaks, but your function said it does not. For every position "
                            "t, change the tokens after t (all of them, to tokens that really "
                            "differ) and compare the outputs at positions 0..t")
                else:
                    hint = ("it does not leak, but your function said it does. Outputs at "
                            "positions after t may change when tokens after t change; compare only "
                            "positions 0..t, with a tolerance (torch.allclose) rather than ==")
                raise Hint(f"leaks_future(model, T={T}, vocab_size={vocab_size}) on {what}: "
                           f"{hint}")
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Chapter 5: self-attention and multi-head attention

def _ref_mhsa(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False, *, scale=None,
              split="heads_first", merge="transpose", flip_mask=False, dim=-1):
    """Multi-head self-attention from (d_model, d_model) matrices used as ``x @ W``, no biases.

    The keyword-only switches turn it into typical wrong answers, to name the mistake in a hint:
    ``split``: "heads_first" (right: head i gets columns i*d_k..(i+1)*d_k-1), "no_transpose"
    (view(B, h, T, d_k) of the (B, T, d_model) tensor), "strided" (head i gets every h-th column);
    ``merge``: "transpose" (right) or "no_transpose"; ``scale``: the factor on the scores.
    """
    from .attention import causal_mask, masked_softmax

    B, T, d = x.shape
    d_k = d // h

    def split_(t):
        if split == "no_transpose":
            return t.reshape(B, h, T, d_k)
        if split == "strided":
            return t.view(B, T, d_k, h).permute(0, 3, 1, 2)
        return t.view(B, T, h, d_k).transpose(1, 2)                        # (B, h, T, d_k)

    q, k, v = split_(x @ W_q), split_(x @ W_k), split_(x @ W_v)
    scores = q @ k.transpose(-2, -1) * (d_k ** -0.5 if scale is None else scale)  # (B, h, T, T)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if key_mask is not None:
        allowed = allowed & (~key_mask if flip_mask else key_mask)[:, None, None, :]
    if causal:
        allowed = allowed & causal_mask(T)
    weights = masked_softmax(scores, allowed.expand(scores.shape), dim=dim)
    heads = weights @ v                                                    # (B, h, T, d_k)
    if merge == "no_transpose":
        concat = heads.reshape(B, T, d)
    else:
        concat = heads.transpose(1, 2).reshape(B, T, d)                    # (B, T, d_model)
    return concat @ W_o, weights


def _mhsa_cases():
    """(description, B, T, d_model, h, lengths or None, causal) for the self-attention graders."""
    return [("d_model=8, h=2, no mask", 2, 5, 8, 2, None, False),
            ("a single head (h=1)", 2, 4, 8, 1, None, False),
            ("d_model=16, h=4 and padding lengths [6, 3, 1]", 3, 6, 16, 4, [6, 3, 1], False),
            ("causal=True, d_model=8, h=2", 2, 5, 8, 2, None, True),
            ("causal=True and padding lengths [5, 2], d_model=12, h=3", 2, 5, 12, 3, [5, 2], True),
            ("a batch of 1 sequence of length 1", 1, 1, 8, 2, None, False),
            ("h = d_model = 4 (every head has d_k = 1)", 2, 3, 4, 4, None, False)]


def _diagnose_mhsa_weights(got, args, kwargs, what):
    """A hint naming the mistake when the weights match a typical wrong answer, else None."""
    x, h = args[0], args[5]
    d, d_k = x.shape[-1], x.shape[-1] // args[5]
    wrong = [(dict(scale=d ** -0.5), "the scores were divided by sqrt(d_model); each head "
              f"compares d_k = d_model / h = {d_k}-dimensional queries and keys, so divide by "
              "sqrt(d_k)"),
             (dict(scale=1.0), "the scores were not scaled; divide q k^T by sqrt(d_k)"),
             (dict(flip_mask=True), "the mask is used the wrong way round: key_mask is True at "
              "real tokens (True means 'may attend')"),
             (dict(dim=-2), "the softmax ran over the queries (dim=-2); each query's weights "
              "must sum to 1 over the keys (dim=-1)"),
             (dict(split="no_transpose"), "the heads were split with view(B, h, T, d_k), which "
              "mixes tokens between heads; split the last dimension instead: "
              "view(B, T, h, d_k).transpose(1, 2)"),
             (dict(split="strided"), "head i got every h-th column (view(B, T, d_k, h)); head i "
              "must get the contiguous columns i*d_k .. (i+1)*d_k - 1: view(B, T, h, d_k)")]
    if h == 1:
        wrong = [w for w in wrong if "split" not in w[0]]
    if kwargs.get("key_mask") is None:
        wrong = [w for w in wrong if "flip_mask" not in w[0]]
    for switches, hint in wrong:
        ref_w = _ref_mhsa(*args, **kwargs, **switches)[1]
        if torch.allclose(got, ref_w, atol=1e-6):
            return f"weights on {what}: {hint}"
    if kwargs.get("causal"):
        plain = dict(kwargs, causal=False)
        if torch.allclose(got, _ref_mhsa(*args, **plain)[1], atol=1e-6):
            return f"weights on {what}: causal=True was ignored; query t may only see keys s <= t"
    return None


@grader("ex-05-mhsa", target="multi_head_self_attention")
def check_multi_head_self_attention(fn):
    """Checks ``multi_head_self_attention(x, W_q, W_k, W_v, W_o, h, key_mask=None, causal=False)
    -> (out, weights)`` against a reference on seven inputs."""
    n = 0
    for what, B, T, d, h, lengths, causal in _mhsa_cases():
        x = torch.randn(B, T, d, dtype=torch.float64)
        Ws = [torch.randn(d, d, dtype=torch.float64) / d ** 0.5 for _ in range(4)]
        key_mask = None if lengths is None else _padding_mask(lengths, T)
        args, kwargs = (x, *Ws, h), dict(key_mask=key_mask, causal=causal)
        exp_out, exp_w = _ref_mhsa(*args, **kwargs)
        got = fn(x.clone(), *(W.clone() for W in Ws), h,
                 key_mask=None if key_mask is None else key_mask.clone(), causal=causal)
        expect_pair(got, "(out, weights)", what)
        out, weights = got
        if isinstance(out, torch.Tensor) and isinstance(weights, torch.Tensor) \
                and out.dim() == 4 and weights.dim() == 3:
            raise Hint(f"on {what}: return (out, weights) in that order: out (B, T, d_model) "
                       "first, then weights (B, h, T, T)")
        expect_shape(weights, (B, h, T, T), f"weights on {what} (x {(B, T, d)}, h={h}: one "
                     "(T, T) matrix per head)")
        expect_shape(out, (B, T, d), f"out on {what}")
        if torch.isnan(weights).any():
            raise Hint(f"weights on {what}: NaN; blocked scores must be -inf before the softmax "
                       "and every query here has at least one key it may see")
        hint = None if torch.allclose(weights, exp_w, atol=1e-6) else \
            _diagnose_mhsa_weights(weights, args, kwargs, what)
        if hint:
            raise Hint(hint)
        expect_close(weights, exp_w, f"weights on {what} (head i uses columns i*d_k..(i+1)*d_k-1 "
                     "of W_q and W_k; scores divided by sqrt(d_k))", atol=1e-6)
        n += 1
        mixed = _ref_mhsa(*args, **kwargs, merge="no_transpose")[0]
        if not torch.allclose(mixed, exp_out, atol=1e-6) and torch.allclose(out, mixed, atol=1e-6):
            raise Hint(f"out on {what}: the heads were concatenated with reshape(B, T, d_model) "
                       "straight from (B, h, T, d_k), which mixes tokens; transpose(1, 2) back to "
                       "(B, T, h, d_k) first")
        if torch.allclose(out, _ref_mhsa(*args, **kwargs)[0] @ torch.linalg.inv(Ws[3]), atol=1e-6):
            raise Hint(f"out on {what}: the concatenated heads were not multiplied by W_o")
        expect_close(out, exp_out, f"out on {what} (concat(heads) @ W_o)", atol=1e-6)
        n += 1
    return n


def _ref_head_contributions(mha, x, key_mask=None):
    """(B, h, T, d_model): head i's output times its own d_k columns of W_o (no bias)."""
    B, T, d = x.shape
    h, d_k = mha.h, mha.d_k
    q, k, v = (mha.split_heads(W(x)) for W in (mha.W_q, mha.W_k, mha.W_v))  # (B, h, T, d_k)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    from .attention import scaled_dot_product_attention
    heads, _ = scaled_dot_product_attention(q, k, v, mask=mask)             # (B, h, T, d_k)
    W_o = mha.W_o.weight.view(d, h, d_k)                                   # (out, head, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)


@grader("ex-05-head-contributions", target="head_contributions")
def check_head_contributions(fn):
    """Checks ``head_contributions(mha, x, key_mask=None) -> (B, h, T, d_model)``."""
    from .mha import MultiHeadAttention

    n = 0
    cases = [("d_model=8, h=2, no mask", 2, 5, 8, 2, None),
             ("a single head (h=1)", 2, 4, 8, 1, None),
             ("d_model=16, h=4 and padding lengths [6, 3, 1]", 3, 6, 16, 4, [6, 3, 1]),
             ("a batch of 1 sequence of length 1", 1, 1, 12, 3, None),
             ("d_model=12, h=3 and padding lengths [2, 5]", 2, 5, 12, 3, [2, 5])]
    for what, B, T, d, h, lengths in cases:
        mha = MultiHeadAttention(d, h).double()
        with torch.no_grad():
            mha.W_o.bias.normal_()          # a visible bias, so that adding it is noticed
        x = torch.randn(B, T, d, dtype=torch.float64)
        key_mask = None if lengths is None else _padding_mask(lengths, T)
        with torch.no_grad():
            exp = _ref_head_contributions(mha, x, key_mask)
            full = mha(x, key_mask=key_mask)[0]
            got = fn(mha, x.clone(), key_mask=None if key_mask is None else key_mask.clone())
        expect_shape(got, (B, h, T, d), f"the contributions on {what} (one (T, d_model) "
                     "contribution per head)")
        if got.dtype != torch.float64:
            raise Hint(f"on {what}: x is float64, the contributions came back as {got.dtype}")
        total = got.sum(1) + mha.W_o.bias
        if torch.allclose(got.sum(1), full, atol=1e-8) and h > 1:
            raise Hint(f"on {what}: the contributions sum to the full output including the bias "
                       "of W_o; leave the bias out (it belongs to no head), so that "
                       "contributions.sum(1) + mha.W_o.bias == mha(x)[0]")
        if torch.allclose(got.sum(1) - (h - 1) * mha.W_o.bias, full, atol=1e-8) and h > 1:
            raise Hint(f"on {what}: every head's contribution includes the bias of W_o; leave it "
                       "out (it belongs to no head)")
        if not torch.allclose(total, full, atol=1e-8):
            diff = (total - full).abs().max().item()
            raise Hint(f"on {what}: contributions.sum(1) + mha.W_o.bias should equal "
                       f"mha(x, key_mask=key_mask)[0]; largest difference {diff:.3g}. Head i's "
                       "output (B, T, d_k) goes through columns i*d_k..(i+1)*d_k-1 of "
                       "mha.W_o.weight (nn.Linear stores it as (out, in), so x @ weight.T)")
        n += 1
        expect_close(got, exp, f"the contributions on {what} (they sum correctly, but the "
                     "split between heads is wrong: head i uses only its own d_k columns of "
                     "mha.W_o.weight)", atol=1e-8)
        n += 1
    return n


def _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal=False, scale=None):
    """Multi-query attention: h query heads, one key head and one value head shared by all."""
    from .attention import scaled_dot_product_attention

    B, T, d = x.shape
    d_k = d // h
    q = (x @ W_q).view(B, T, h, d_k).transpose(1, 2)                       # (B, h, T, d_k)
    k, v = (x @ W_k)[:, None], (x @ W_v)[:, None]                          # (B, 1, T, d_k)
    heads, weights = scaled_dot_product_attention(q, k, v, causal=causal,
                                                  scale=scale)             # (B, h, T, d_k)
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, weights


@grader("ex-05-multi-query", target="multi_query_attention")
def check_multi_query_attention(fn):
    """Checks ``multi_query_attention(x, W_q, W_k, W_v, W_o, h, causal=False) -> (out, weights)``."""
    n = 0
    cases = [("d_model=8, h=2", 2, 5, 8, 2, False),
             ("d_model=16, h=4, causal=True", 2, 6, 16, 4, True),
             ("a single head (h=1): the same as ordinary attention", 2, 4, 8, 1, False),
             ("a batch of 1 sequence of length 1, h=3", 1, 1, 12, 3, False),
             ("d_model=12, h=6 (d_k=2), causal=True", 3, 4, 12, 6, True)]
    for what, B, T, d, h, causal in cases:
        d_k = d // h
        x = torch.randn(B, T, d, dtype=torch.float64)
        W_q, W_o = (torch.randn(d, d, dtype=torch.float64) / d ** 0.5 for _ in range(2))
        W_k, W_v = (torch.randn(d, d_k, dtype=torch.float64) / d ** 0.5 for _ in range(2))
        exp_out, exp_w = _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal)
        got = fn(x.clone(), W_q.clone(), W_k.clone(), W_v.clone(), W_o.clone(), h, causal=causal)
        expect_pair(got, "(out, weights)", what)
        out, weights = got
        expect_shape(weights, (B, h, T, T), f"weights on {what} (W_k and W_v are "
                     f"({d}, {d_k}): one key and one value head, shared by all {h} query heads)")
        expect_shape(out, (B, T, d), f"out on {what}")
        if not torch.allclose(weights, exp_w, atol=1e-6):
            if causal and torch.allclose(weights, _ref_mqa(x, W_q, W_k, W_v, W_o, h)[1], atol=1e-6):
                raise Hint(f"weights on {what}: causal=True was ignored")
            if h > 1 and torch.allclose(weights, _ref_mqa(x, W_q, W_k, W_v, W_o, h, causal,
                                                          scale=d ** -0.5)[1], atol=1e-6):
                raise Hint(f"weights on {what}: the scores were divided by sqrt(d_model); the "
                           f"queries and keys have d_k = {d_k} dimensions, so divide by sqrt(d_k)")
            raise Hint(f"weights on {what}: expected softmax(q_i k^T / sqrt(d_k)) for each query "
                       f"head i (q_i = columns i*d_k..(i+1)*d_k-1 of x @ W_q, k = x @ W_k, "
                       f"d_k = {d_k}); largest difference "
                       f"{(weights - exp_w).abs().max().item():.3g}")
        n += 1
        expect_close(out, exp_out, f"out on {what} (each head sums the shared values v = x @ W_v "
                     "with its own weights; concatenate the heads, then @ W_o)", atol=1e-6)
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Chapter 8: the Transformer

def _ch08_pre_ln_block(d_model: int, h: int, d_ff: int):
    """A pre-LN EncoderBlock in eval mode whose two LayerNorms have different, non-trivial weights."""
    from .transformer import EncoderBlock, TransformerConfig

    cfg = TransformerConfig(vocab_size=10, d_model=d_model, h=h, d_ff=d_ff, n_layers=1,
                            dropout=0.0, norm_first=True)
    block = EncoderBlock(cfg).eval()
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.3)
    return block


def _ch08_block_mistakes(block, x, src_mask):
    """(output, message) for typical wrong encoder blocks, built from ``block``'s own modules."""
    a, ff, n1, n2 = block.self_attn, block.ff, block.norm1, block.norm2

    def att(z, mask=src_mask):
        return a(z, key_mask=mask)[0]

    y = n1(x + att(x))
    post = n2(y + ff(y))
    y = att(n1(x))
    no_residual = ff(n2(y))
    y = n1(x) + att(n1(x))
    normed_residual = n2(y) + ff(n2(y))
    y = x + att(n1(x), None)
    no_mask = y + ff(n2(y))
    y = x + att(n2(x))
    swapped = y + ff(n1(y))
    y = x + att(n1(x))
    y = y + ff(n2(y))
    final_norm = n2(y)
    return [
        (post, "this is post-LN, LayerNorm(x + Sublayer(x)) as in the paper. Pre-LN normalises "
               "the *input* of each sub-layer and adds its output to the un-normalised x: "
               "x = x + Sublayer(LayerNorm(x))"),
        (no_residual, "the residual connections are missing: add each sub-layer's output to its "
                      "input, x = x + Sublayer(LayerNorm(x))"),
        (normed_residual, "the residual path carries LayerNorm(x) instead of x itself: "
                          "x = x + Sublayer(LayerNorm(x)), so that x passes through unchanged"),
        (no_mask, "padding is visible: pass src_mask to self-attention as key_mask"),
        (swapped, "the two LayerNorms are swapped: norm1 goes before self-attention and norm2 "
                  "before the feed-forward network"),
        (final_norm, "the block's output is normalised at the end; in pre-LN the output is the "
                     "un-normalised residual stream x + FFN(LayerNorm(x)) (the model applies one "
                     "final LayerNorm after the whole stack)"),
    ]


@grader("ex-08-pre-ln-block", target="pre_ln_encoder_block")
def check_pre_ln_encoder_block(fn):
    """Checks ``pre_ln_encoder_block(block, x, src_mask) -> (B, S, d_model)`` against EncoderBlock."""
    n = 0
    cases = [("x (2, 5, 16), h=4, lengths [5, 3]", 16, 4, 32, [5, 3]),
             ("x (3, 7, 32), h=8, lengths [7, 2, 5]", 32, 8, 64, [7, 2, 5]),
             ("x (1, 1, 8), h=2, a batch of one token", 8, 2, 16, [1]),
             ("x (2, 4, 16), h=2, src_mask=None (no padding)", 16, 2, 48, None)]
    for what, d_model, h, d_ff, lengths in cases:
        block = _ch08_pre_ln_block(d_model, h, d_ff)
        B = 2 if lengths is None else len(lengths)
        S = 4 if lengths is None else max(lengths)
        x = torch.randn(B, S, d_model)
        src_mask = None if lengths is None else _padding_mask(lengths, S)
        x_before = x.clone()
        with torch.no_grad():
            expected = block(x, src_mask)
            got = fn(block, x, src_mask)
        on = f"pre_ln_encoder_block on {what}"
        expect_shape(got, expected.shape, on)
        if not torch.equal(x, x_before):
            raise Hint(f"{on}: x was changed in place (x += ...); write x = x + ... so that the "
                       "caller's tensor is left alone")
        if not torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
            with torch.no_grad():
                mistakes = _ch08_block_mistakes(block, x, src_mask)
            for wrong, message in mistakes:
                if torch.allclose(got, wrong, atol=1e-5, rtol=1e-4):
                    raise Hint(f"{on}: {message}")
            expect_close(got, expected, f"{on} (x = x + self_attn(norm1(x)); x = x + "
                         "ff(norm2(x)))")
        n += 1
    return n


def _ch08_params(V, d_model, d_ff, N, tied=True, norm_first=False, *, biases=True, norms=True,
                 cross=True, final=True, embeddings=None) -> int:
    """Parameters of the package's Transformer, and typical mistakes (for the hints)."""
    d = d_model
    attn = 4 * d * d + (4 * d if biases else 0)
    ff = 2 * d * d_ff + (d_ff + d if biases else 0)
    ln = 2 * d if norms else 0
    enc = attn + ff + 2 * ln
    dec = (2 if cross else 1) * attn + ff + (3 if cross else 2) * ln
    if embeddings is None:
        embeddings = 1 if tied else 2
    return embeddings * V * d + N * (enc + dec) + (2 * ln if norm_first and final else 0)


@grader("ex-08-param-count", target="transformer_params")
def check_transformer_params(fn):
    """Checks ``transformer_params(V, d_model, h, d_ff, N, tied=True, norm_first=False) -> int``."""
    from .transformer import Transformer, TransformerConfig

    n = 0
    cases = [(50, 16, 4, 32, 2, True, False), (50, 16, 4, 32, 2, False, False),
             (60, 32, 2, 48, 1, True, True), (40, 24, 3, 40, 3, False, True),
             (30, 8, 1, 16, 4, True, False)]
    for V, d_model, h, d_ff, N, tied, norm_first in cases:
        call = (f"transformer_params(V={V}, d_model={d_model}, h={h}, d_ff={d_ff}, N={N}, "
                f"tied={tied}, norm_first={norm_first})")
        got = fn(V, d_model, h, d_ff, N, tied=tied, norm_first=norm_first)
        if isinstance(got, bool) or not isinstance(got, int):
            raise Hint(f"{call}: return a Python int (a count), got {type(got).__name__} {got!r}")
        cfg = TransformerConfig(vocab_size=V, d_model=d_model, h=h, d_ff=d_ff, n_layers=N,
                                dropout=0.0, max_len=16, norm_first=norm_first,
                                tie_embeddings=tied)
        expected = sum(p.numel() for p in Transformer(cfg).parameters())
        if got == expected:
            n += 1
            continue
        args = (V, d_model, d_ff, N, tied, norm_first)
        mistakes = [
            (dict(biases=False), "the biases are missing: every nn.Linear of the attention "
             "(W_q, W_k, W_v, W_o: d_model each) and of the FFN (d_ff and d_model) has one"),
            (dict(norms=False), "the LayerNorms are missing: each has 2 * d_model parameters "
             "(gamma and beta); an encoder layer has 2, a decoder layer 3"),
            (dict(cross=False), "the decoder's cross-attention (and its LayerNorm) is missing: a "
             "decoder layer has two attention sub-layers and three LayerNorms"),
            (dict(embeddings=2 if tied else 1), "the embedding matrix is counted "
             + ("twice; with tied=True one (V, d_model) matrix serves as embedding and output "
                "layer" if tied else "once; with tied=False the output layer has its own "
                "(V, d_model) matrix")),
            (dict(embeddings=3 if tied else 3), "there is one shared (V, d_model) embedding for "
             "source and target" + (", which is also the output layer" if tied else
                                    ", plus the output layer's own matrix when untied")),
            (dict(final=False), "pre-LN (norm_first=True) adds one final LayerNorm after the "
             "encoder stack and one after the decoder stack: 2 * 2 * d_model parameters"),
        ]
        for kwargs, message in mistakes:
            if got == _ch08_params(*args, **kwargs):
                raise Hint(f"{call}: {message}")
        raise Hint(f"{call}: expected {expected:,} (the sum of p.numel() over the model's "
                   f"parameters), got {got:,}; the difference is {got - expected:+,}")
    base = _ch08_params(37000, 512, 2048, 6)
    got = fn(37000, 512, 8, 2048, 6)
    if got != base:
        raise Hint(f"transformer_params(37000, 512, 8, 2048, 6) with the defaults tied=True, "
                   f"norm_first=False (the paper's base model): expected {base:,}, got {got!r}")
    n += 1
    if fn(37000, 512, 16, 2048, 6) != base:
        raise Hint("transformer_params(37000, 512, 16, 2048, 6): the number of heads h does not "
                   "change the count (the h heads split W_q, W_k, W_v into slices), but your "
                   "result changed with h")
    return n + 1


@grader("ex-08-next-token", target="next_token")
def check_next_token(fn):
    """Checks ``next_token(model, src, src_mask, prefix) -> (ids (B,), probs (B,))``."""
    from .transformer import Transformer, TransformerConfig
    n = 0
    torch.manual_seed(3)
    model = Transformer(TransformerConfig(vocab_size=13, d_model=16, h=2, d_ff=32, n_layers=2,
                                          dropout=0.0, max_len=32)).eval()
    for what, B, S, T in [("B=3, S=5, a prefix of 4 tokens", 3, 5, 4),
                          ("B=1, S=2, a prefix of BOS alone", 1, 2, 1),
                          ("B=4, S=6 with padding, a prefix of 3 tokens", 4, 6, 3)]:
        src = torch.randint(4, 13, (B, S))
        src_mask = torch.ones(B, S, dtype=torch.bool)
        if "padding" in what:
            src_mask[1:, -2:] = False
            src = src.masked_fill(~src_mask, 0)
        prefix = torch.cat([torch.full((B, 1), 2), torch.randint(4, 13, (B, T - 1))], dim=1)
        with torch.no_grad():
            logits = model(src, src_mask, prefix)                        # (B, T, V)
        probs = logits[:, -1].softmax(-1)
        ref_p, ref_id = probs.max(-1)
        got = fn(model, src.clone(), src_mask.clone(), prefix.clone())
        expect_pair(got, "(ids, probs)", what)
        ids, p = got
        expect_shape(ids, (B,), f"the ids for {what}")
        expect_shape(p, (B,), f"the probabilities for {what}")
        if T > 1 and torch.equal(ids, logits[:, 0].argmax(-1)) and not torch.equal(ids, ref_id):
            raise Hint(f"for {what}: you read position 0; logits[:, t] is the distribution of "
                       "the token AFTER prefix[:, :t+1], so the next token's is at the LAST "
                       "position, logits[:, -1]")
        if not torch.equal(ids, ref_id):
            raise Hint(f"for {what}: expected the ids {ref_id.tolist()}, got {ids.tolist()}")
        if (p > 1).any() or (p < 0).any():
            raise Hint(f"for {what}: {p.tolist()} are not probabilities; apply softmax to the "
                       "logits over the vocabulary (the last dimension)")
        expect_close(p.float(), ref_p, f"the probabilities for {what}", atol=1e-5)
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Chapter 3: dot-product attention

def _c3_concat_score_ref(query, keys, W, v):
    """e_i = v^T tanh(W [q; k_i]): query (B, d_q), keys (B, S, d_k) -> (B, S)."""
    q = query[:, None, :].expand(-1, keys.shape[1], -1)                 # (B, S, d_q)
    return torch.tanh(torch.cat([q, keys], dim=-1) @ W.T) @ v          # (B, S)


@grader("ex-03-concat-score", target="concat_score")
def check_concat_score(fn):
    """Checks ``concat_score(query, keys, W, v) -> e`` (Luong's concat score, before softmax)."""
    n = 0
    cases = [("query (2, 4), keys (2, 5, 4), W (3, 8)", 2, 5, 4, 4, 3),
             ("query (3, 2), keys (3, 4, 6), W (5, 8) (d_q != d_k)", 3, 4, 2, 6, 5),
             ("a batch of 1 with a single key", 1, 1, 3, 3, 4),
             ("large inputs (tanh saturates)", 2, 3, 4, 4, 3)]
    for k, (what, B, S, d_q, d_k, d_attn) in enumerate(cases):
        scale = 20.0 if k == 3 else 1.0
        query, keys = torch.randn(B, d_q) * scale, torch.randn(B, S, d_k) * scale
        W, v = torch.randn(d_attn, d_q + d_k) / (d_q + d_k) ** 0.5, torch.randn(d_attn)
        ref = _c3_concat_score_ref(query, keys, W, v)
        got = fn(query.clone(), keys.clone(), W.clone(), v.clone())
        expect_shape(got, (B, S), f"the scores on {what} (one score per key)")
        swapped = _c3_concat_score_ref(query, keys, W.roll(d_q, 1), v)  # [k; q] if d_q == d_k
        if d_q == d_k and torch.allclose(got, swapped, atol=1e-5) \
                and not torch.allclose(got, ref, atol=1e-5):
            raise Hint(f"on {what}: you concatenated [k_i; q]; the first d_q = {d_q} columns of W "
                       "act on the query, the last d_k on the key: use torch.cat([q, k_i])")
        if torch.allclose(got, (torch.cat([query[:, None, :].expand(-1, S, -1), keys], -1)
                                @ W.T) @ v, atol=1e-5) and not torch.allclose(got, ref, atol=1e-5):
            raise Hint(f"on {what}: the scores match v^T W [q; k_i] without the tanh; apply tanh "
                       "to the hidden layer W [q; k_i] before the dot product with v")
        sums = got.sum(-1)
        if S > 1 and (got >= 0).all() and torch.allclose(sums, torch.ones_like(sums), atol=1e-5):
            raise Hint(f"on {what}: the values are non-negative and sum to 1 over the keys: return "
                       "the scores e_i themselves, before the softmax")
        expect_close(got, ref, f"the scores on {what} (e_i = v^T tanh(W [q; k_i]))")
        n += 1
    # equal to the additive score with W split into [W_q | W_k]
    from .rnn import AdditiveAttention
    attn = AdditiveAttention(3, 5, 4)
    query, keys = torch.randn(2, 3), torch.randn(2, 6, 5)
    with torch.no_grad():
        W = torch.cat([attn.W_q.weight, attn.W_k.weight], dim=1)       # (4, 8)
        ref = attn.score(query[:, None, :], attn.project_keys(keys))[:, 0]  # (2, 6)
        got = fn(query, keys, W, attn.v.weight[0].clone())
    expect_close(got, ref, "the scores with W = [W_q | W_k] of an AdditiveAttention (they should "
                 "equal its additive scores)")
    return n + 1


def _c3_soft_lookup_ref(query, keys, values, beta):
    q = query / query.norm(dim=-1, keepdim=True)                       # (B, d_k)
    k = keys / keys.norm(dim=-1, keepdim=True)                         # (B, S, d_k)
    cos = torch.einsum("bd,bsd->bs", q, k)                             # (B, S)
    w = torch.softmax(beta * cos, dim=-1)                              # (B, S)
    return torch.einsum("bs,bsv->bv", w, values), w                    # (B, d_v), (B, S)


@grader("ex-03-soft-lookup", target="soft_lookup")
def check_soft_lookup(fn):
    """Checks ``soft_lookup(query, keys, values, beta) -> (result, weights)`` (cosine addressing)."""
    n = 0
    cases = [("query (2, 3), keys (2, 4, 3), values (2, 4, 5), beta = 1", 2, 4, 3, 5, 1.0),
             ("a batch of 1 with a single entry, beta = 2", 1, 1, 3, 2, 2.0),
             ("query (3, 4), keys (3, 6, 4), values (3, 6, 1), beta = 10", 3, 6, 4, 1, 10.0),
             ("beta = 1000 (almost a hard look-up)", 2, 5, 3, 2, 1000.0)]
    for what, B, S, d_k, d_v, beta in cases:
        query = torch.randn(B, d_k)
        keys = torch.randn(B, S, d_k) * torch.rand(B, S, 1).mul(4).add(0.5)  # norms 0.5x..4.5x
        values = torch.randn(B, S, d_v)
        r_ref, w_ref = _c3_soft_lookup_ref(query, keys, values, beta)
        got = fn(query.clone(), keys.clone(), values.clone(), beta)
        expect_pair(got, "(result, weights)", what)
        result, w = got
        expect_shape(w, (B, S), f"the weights on {what} (one weight per entry)")
        expect_shape(result, (B, d_v), f"the result on {what} (one value-sized vector)")
        if torch.isnan(w).any() or torch.isinf(w).any():
            raise Hint(f"on {what}: the weights contain NaN or inf; use torch.softmax, which "
                       "subtracts the maximum before exp()")
        sums = w.sum(-1)
        if not torch.allclose(sums, torch.ones(B), atol=1e-5):
            b = int((sums - 1).abs().argmax())
            raise Hint(f"on {what}: the weights of query {b} sum to {sums[b].item():.4f}, not 1: "
                       "take the softmax over the entries (the last dimension)")
        dot = torch.softmax(beta * torch.einsum("bd,bsd->bs", query, keys), -1)
        if S > 1 and torch.allclose(w, dot, atol=1e-5) and not torch.allclose(w, w_ref, atol=1e-5):
            raise Hint(f"on {what}: the weights match a softmax of beta * (q . k_i), the raw dot "
                       "product; the look-up compares directions: divide q and each k_i by their "
                       "norms (cosine similarity) first")
        unsharp = _c3_soft_lookup_ref(query, keys, values, 1.0)[1]
        if beta != 1 and S > 1 and torch.allclose(w, unsharp, atol=1e-5):
            raise Hint(f"on {what}: the weights ignore beta; multiply the cosine similarities by "
                       "beta before the softmax")
        expect_close(w, w_ref, f"the weights on {what} (softmax of beta * cos(q, k_i))")
        n += 1
        expect_close(result, r_ref, f"the result on {what} (sum_i w_i v_i)")
        n += 1
    return n


def _c3_soft_argmax_ref(scores, tau):
    w = torch.softmax(scores / tau, dim=-1)                            # (..., S)
    pos = torch.arange(scores.shape[-1], dtype=scores.dtype)           # (S,)
    return (w * pos).sum(-1)                                           # (...,)


@grader("ex-03-soft-argmax", target="soft_argmax")
def check_soft_argmax(fn):
    """Checks ``soft_argmax(scores, tau) -> expected position under softmax(scores / tau)``."""
    n = 0
    base = torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0])
    cases = [("scores [0.5, 2, -1, 1, 0], tau = 1", base, 1.0),
             ("the same scores, tau = 0.25", base, 0.25),
             ("the same scores, tau = 100 (almost uniform)", base, 100.0),
             ("the same scores, tau = 0.001 (almost the arg-max)", base, 0.001),
             ("scores of shape (3, 7), tau = 0.5", torch.randn(3, 7), 0.5),
             ("scores of shape (2, 4, 6), tau = 2", torch.randn(2, 4, 6), 2.0),
             ("a single score, tau = 1", torch.tensor([3.0]), 1.0)]
    for what, scores, tau in cases:
        ref = _c3_soft_argmax_ref(scores, tau)
        got = fn(scores.clone(), tau)
        if isinstance(got, torch.Tensor) and got.shape == scores.shape and scores.shape[-1] > 1:
            raise Hint(f"for {what}: you returned a tensor of the shape of the scores "
                       f"{tuple(scores.shape)}, the weights? Return the expected position "
                       f"sum_i alpha_i * i, one number per row: shape {tuple(ref.shape)}")
        expect_shape(got, ref.shape, f"the soft arg-max for {what}")
        if torch.isnan(got).any():
            raise Hint(f"for {what}: NaN; exp(scores / tau) overflows for small tau. Use "
                       "torch.softmax, which subtracts the maximum first")
        wrong_tau = _c3_soft_argmax_ref(scores, 1.0 / tau)
        if tau != 1 and torch.allclose(got, wrong_tau, atol=1e-4) \
                and not torch.allclose(got, ref, atol=1e-4):
            raise Hint(f"for {what}: you multiplied the scores by tau; divide them by tau: a "
                       "small temperature must sharpen the weights towards the arg-max")
        one_based = ref + 1
        if torch.allclose(got, one_based, atol=1e-4):
            raise Hint(f"for {what}: positions are counted from 0, like tensor indices: the "
                       "position of the first score is 0, not 1")
        expect_close(got, ref, f"the soft arg-max for {what}", atol=1e-4)
        n += 1
    # it must be differentiable: a gradient reaches the scores
    scores = torch.randn(2, 5, requires_grad=True)
    out = fn(scores, 1.0)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise Hint("no gradient reaches the scores (the result does not require grad): build it "
                   "from torch.softmax and a weighted sum, not argmax, .item() or numpy")
    out.sum().backward()
    if scores.grad is None or scores.grad.abs().max() == 0:
        raise Hint("the gradient with respect to the scores is zero: a hard arg-max is not "
                   "differentiable; weight the positions by softmax(scores / tau)")
    expect_close(scores.grad, torch.autograd.grad(_c3_soft_argmax_ref(scores, 1.0).sum(),
                                                  scores)[0],
                 "the gradient of sum(soft_argmax(scores, 1.0)) with respect to the scores")
    return n + 1


# ---------------------------------------------------------------------------------------------
# Chapter 9: training a translator

def _c9_smoothed_ref(logits, target, eps, pad_id):
    import torch.nn.functional as F
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=pad_id,
                           label_smoothing=eps)


@grader("ex-09-label-smoothing", target="smoothed_nll")
def check_smoothed_nll(fn):
    """Checks ``smoothed_nll(logits (B, T, V), target (B, T), eps, pad_id) -> scalar``."""
    n = 0
    cases = [("B=2, T=3, V=5, eps=0 (plain cross-entropy), no padding", (2, 3, 5), 0.0, 0.0),
             ("B=2, T=3, V=5, eps=0.1, no padding", (2, 3, 5), 0.1, 0.0),
             ("B=3, T=4, V=7, eps=0.1, with padding", (3, 4, 7), 0.1, 0.4),
             ("B=1, T=1, V=4, eps=0.2", (1, 1, 4), 0.2, 0.0),
             ("B=4, T=6, V=11, eps=0.3, with padding", (4, 6, 11), 0.3, 0.5)]
    for what, (B, T, V), eps, p_pad in cases:
        logits = torch.randn(B, T, V) * 3
        target = torch.randint(1, V, (B, T))
        if p_pad:
            target[:, 1:][torch.rand(B, T - 1) < p_pad] = 0
        ref = _c9_smoothed_ref(logits, target, eps, 0)
        got = fn(logits.clone(), target.clone(), eps, 0)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            raise Hint(f"for {what}: return one number, a 0-dimensional tensor (the mean over "
                       f"real tokens), got {getattr(got, 'shape', type(got).__name__)}")
        if p_pad:
            with_pad = _c9_smoothed_ref(logits, target, eps, -100)  # PAD counted as a class
            if torch.allclose(got, with_pad, atol=1e-4) and not torch.allclose(got, ref, atol=1e-4):
                raise Hint(f"for {what}: padded positions (target == pad_id) must not count: "
                           "leave them out of the sum and of the number you divide by")
        if eps:
            real = target != 0
            logp = logits.log_softmax(-1)[real]
            over_others = ((1 - eps) * -logp.gather(1, target[real][:, None])[:, 0]
                           - eps * (logp.sum(-1) - logp.gather(1, target[real][:, None])[:, 0])
                           / (V - 1)).mean()
            if torch.allclose(got, over_others, atol=1e-4) and not torch.allclose(got, ref, atol=1e-4):
                raise Hint(f"for {what}: you spread eps over the V - 1 wrong tokens; as in "
                           "the paper and PyTorch, spread it over all V tokens (the right one "
                           "gets 1 - eps + eps / V)")
            plain = _c9_smoothed_ref(logits, target, 0.0, 0)
            if torch.allclose(got, plain, atol=1e-5):
                raise Hint(f"for {what}: this is the plain cross-entropy; with eps > 0 the "
                           "target puts 1 - eps on the right token and eps / V on every token")
        expect_close(got.float(), ref, f"the loss for {what}", atol=1e-4)
        n += 1
    logits = torch.randn(2, 3, 5, requires_grad=True)
    fn(logits, torch.randint(1, 5, (2, 3)), 0.1, 0).backward()
    if logits.grad is None:
        raise Hint("no gradient reaches the logits: compute the loss with torch operations")
    return n + 1


def _c9_ngrams(tokens, n):
    from collections import Counter
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


@grader("ex-09-modified-precision", target="modified_precision")
def check_modified_precision(fn):
    """Checks ``modified_precision(hyp, ref, n) -> (matches, total)`` on token lists."""
    n_ok = 0
    cases = [("the classic: hyp 'the the the the the the the', ref 'the cat is on the mat', n=1",
              "the the the the the the the", "the cat is on the mat", 1, (2, 7)),
             ("hyp 'a dog runs', ref 'a dog runs fast', n=2", "a dog runs", "a dog runs fast", 2, (2, 2)),
             ("a hypothesis shorter than n: hyp 'dog', ref 'a dog', n=2", "dog", "a dog", 2, (0, 0)),
             ("no overlap: hyp 'x y z', ref 'a b c', n=1", "x y z", "a b c", 1, (0, 3)),
             ("repeated bigrams: hyp 'a b a b a b', ref 'a b c a b', n=2", "a b a b a b",
              "a b c a b", 2, (2, 5))]
    for what, hyp, ref, n, expected in cases:
        got = fn(hyp.split(), ref.split(), n)
        expect_pair(got, "(matches, total)", what)
        got = tuple(int(g) for g in got)
        if n == 1 and "classic" in what and got == (7, 7):
            raise Hint(f"for {what}: got {got}; clip each n-gram's count to the number of times "
                       "it occurs in the reference: 'the' occurs twice there, so it matches at "
                       "most twice")
        if got != expected:
            raise Hint(f"for {what}: expected (matches, total) = {expected}, got {got}")
        n_ok += 1
    # against sacreBLEU's own counts on random token sequences
    from sacrebleu.metrics import BLEU
    g = torch.Generator().manual_seed(9)
    words = "a b c d e f".split()
    for _ in range(20):
        hyp = [words[i] for i in torch.randint(0, 6, (int(torch.randint(1, 12, (1,), generator=g)),),
                                               generator=g)]
        ref = [words[i] for i in torch.randint(0, 6, (int(torch.randint(1, 12, (1,), generator=g)),),
                                               generator=g)]
        stats = BLEU(tokenize="none").corpus_score([" ".join(hyp)], [[" ".join(ref)]])
        for n in range(1, 5):
            got = tuple(int(x) for x in fn(hyp, ref, n))
            expected = (stats.counts[n - 1], stats.totals[n - 1])
            if got != expected:
                raise Hint(f"for hyp {' '.join(hyp)!r}, ref {' '.join(ref)!r}, n={n}: sacreBLEU "
                           f"counts (matches, total) = {expected}, you returned {got}")
            n_ok += 1
    return n_ok


@grader("ex-09-corpus-bleu", target="corpus_bleu")
def check_corpus_bleu(fn):
    """Checks ``corpus_bleu(hyps, refs) -> BLEU in 0..100`` against sacreBLEU (tokenize='none').

    Every case has at least one matching 4-gram, so sacreBLEU's smoothing never applies."""
    import math

    from sacrebleu.metrics import BLEU
    n = 0
    cases = [("one identical pair", ["a dog runs in the snow"], ["a dog runs in the snow"]),
             ("two sentences", ["a man is riding a bike on the road", "two dogs play in the grass"],
              ["a man rides a bike on a road", "two dogs play in the green grass"]),
             ("a short hypothesis (brevity penalty)", ["a man rides a bike"],
              ["a man rides a bike on the road today"]),
             ("a long hypothesis (no brevity penalty)", ["a man in a red shirt rides a bike on the road"],
              ["a man rides a bike on the road"]),
             ("three sentences of different lengths", ["the cat sat on the mat", "a b c d e",
                                                       "people walk down a busy street at night"],
              ["the cat sat on a mat", "a b c d f", "people are walking down a busy street at night"])]
    for what, hyps, refs in cases:
        expected = BLEU(tokenize="none").corpus_score(hyps, [refs]).score
        got = fn(hyps, refs)
        if isinstance(got, torch.Tensor):
            got = got.item()
        if not isinstance(got, (int, float)):
            raise Hint(f"for {what}: return a number, got {type(got).__name__}")
        if abs(got - expected / 100) < 1e-3 and expected > 1:
            raise Hint(f"for {what}: got {got:.4f}; report BLEU on sacreBLEU's 0..100 scale "
                       f"(expected {expected:.2f})")
        if "short" in what:
            precisions = BLEU(tokenize="none").corpus_score(hyps, [refs]).precisions
            without_bp = 100 * math.exp(sum(math.log(p / 100) for p in precisions) / 4)
            if abs(got - without_bp) < 1e-2:
                raise Hint(f"for {what}: the hypothesis is shorter than the reference; multiply by "
                           "the brevity penalty exp(1 - r / c) (c: hypothesis length, r: reference "
                           "length, summed over the corpus)")
        if abs(got - expected) > 1e-2:
            raise Hint(f"for {what}: sacreBLEU gives {expected:.2f}, you returned {got:.2f}. "
                       "Sum matches and totals over the whole corpus for each n = 1..4 before "
                       "dividing (corpus BLEU is not the mean of sentence BLEUs), take the "
                       "geometric mean of the four precisions, then the brevity penalty")
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Chapter 10: from translation to chatbots

def _c10_top_k_ref(logits, k):
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


@grader("ex-10-top-k", target="top_k_filter")
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
        ref = _c10_top_k_ref(before, k)
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


def _c10_temperature_ref(logits, tau):
    import torch.nn.functional as F
    if tau == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return (logits / tau).softmax(-1)


@grader("ex-10-temperature", target="temperature_softmax")
def check_temperature_softmax(fn):
    """Checks ``temperature_softmax(logits (..., V), tau) -> (..., V)``."""
    n = 0
    cases = [("shape (3, 7), tau=1", (3, 7), 1.0), ("shape (3, 7), tau=0.5", (3, 7), 0.5),
             ("shape (2, 4, 5), tau=2", (2, 4, 5), 2.0), ("shape (1, 9), tau=0.1", (1, 9), 0.1),
             ("shape (4, 6), tau=0 (greedy limit)", (4, 6), 0.0),
             ("shape (2, 3, 8), tau=0", (2, 3, 8), 0.0)]
    for what, shape, tau in cases:
        logits = torch.randn(*shape) * 2
        ref = _c10_temperature_ref(logits, tau)
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


@grader("ex-10-prompt-target", target="prompt_target")
def check_prompt_target(fn):
    """Checks ``prompt_target(src, tgt) -> (inputs, targets)`` (lists) against the package."""
    from . import BOS_ID, EOS_ID, PAD_ID
    from .lm import prompt_target_example
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


def _c10_causal_attention(q, k, v):
    import math
    T = q.shape[1]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


@grader("ex-10-cached-step", target="cached_attention_step")
def check_cached_attention_step(fn):
    """Checks ``cached_attention_step(q, k_new, v_new, cache) -> (B, d_k)`` over t calls."""
    import math
    n = 0
    for B, T, d_k in ((2, 6, 8), (1, 1, 4), (3, 9, 16)):
        what = f"B={B}, d_k={d_k}, {T} steps"
        q, k, v = torch.randn(B, T, d_k), torch.randn(B, T, d_k), torch.randn(B, T, d_k)
        ref = _c10_causal_attention(q, k, v)                              # (B, T, d_k)
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
