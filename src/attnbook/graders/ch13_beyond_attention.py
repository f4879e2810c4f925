"""Chapter 13 (beyond attention): the graders of one step of the online softmax, of one step of
the selective state-space model, and of the associative scan's combine operator.

``online_update(m, l, acc, s, v)`` folds one block of scores into the running state of each
query, as :func:`attnbook.beyond.online_softmax_attention` does: m (..., Bq, 1) the running
maximum, l (..., Bq, 1) the running sum of exp(score - m), acc (..., Bq, d_v) the running sum
of exp(score - m) v; s (..., Bq, Bk) the block's scores (-inf where a key is blocked) and
v (..., Bk, d_v) its values. It returns (m', l', acc'); after the last block, acc / l is the
attention output."""
from __future__ import annotations

import torch

from .core import Hint, expect_close, grader


def _c12_reference(m, l, acc, s, v, rescale_acc=True, rescale_l=True, shift=True, flip=False,
                   guard=True):
    """The update; the keyword arguments switch on the classic mistakes the hints name."""
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0) if guard else m_new
    p = torch.exp(s - m_safe) if shift else torch.exp(s)
    r = torch.exp(m_safe - m) if flip else torch.exp(m - m_safe)
    l_new = (l * r if rescale_l else l) + p.sum(-1, keepdim=True)
    acc_new = (acc * r if rescale_acc else acc) + p @ v
    return m_new, l_new, acc_new


MISTAKES = [
    (dict(rescale_acc=False), "the old weighted sum acc was not rescaled: when the maximum grows "
                              "from m to m', multiply acc by exp(m - m') before adding the block"),
    (dict(rescale_l=False), "the old sum l was not rescaled: multiply it by exp(m - m') before "
                            "adding the block's exponentials, as acc"),
    (dict(flip=True), "the rescaling factor is upside down: the old sums are scaled by "
                      "exp(m - m'), which is at most 1, not by exp(m' - m)"),
    (dict(shift=False), "the block's scores were exponentiated without subtracting the running "
                        "maximum: exp(s - m'), not exp(s), or large scores overflow"),
]


def _c12_state(shape_q, d_v):
    m = torch.full((*shape_q, 1), float("-inf"))
    return m, torch.zeros(*shape_q, 1), torch.zeros(*shape_q, d_v)


def _c12_fold(fn, s_blocks, v_blocks, what):
    """Fold every block with fn; the final (out, m, l)."""
    m, l, acc = _c12_state(s_blocks[0].shape[:-1], v_blocks[0].shape[-1])
    for j, (s, v) in enumerate(zip(s_blocks, v_blocks)):
        try:
            got = fn(m.clone(), l.clone(), acc.clone(), s, v)
        except (Hint, NotImplementedError):
            raise
        except Exception as e:
            raise Hint(f"on {what}, block {j}: your function raised {type(e).__name__}: {e}") from None
        if not (isinstance(got, tuple) and len(got) == 3):
            raise Hint(f"on {what}: return a tuple (m, l, acc), got {type(got).__name__}")
        m, l, acc = got
    return acc / l.masked_fill(l == 0, 1.0), m, l


def _c12_name_mistake(fn_out, s_blocks, v_blocks) -> str:
    for kw, hint in MISTAKES:
        wrong = _c12_fold(lambda *a: _c12_reference(*a, **kw), s_blocks, v_blocks, "")[0]
        if torch.allclose(fn_out.nan_to_num(7.0), wrong.nan_to_num(7.0), atol=1e-5, rtol=1e-4):
            return "; " + hint
    return ""


@grader("ex-13-online-softmax", target="online_update")
def check_online_update(fn) -> int:
    g = torch.Generator().manual_seed(11)
    n = 0
    cases = [("2 heads, 5 queries, 3 blocks of 4 keys", (2, 5), 4, 3, 3.0),
             ("1 query, 1 block of 1 key", (1,), 1, 1, 1.0),
             ("scores near 1000 (exp would overflow)", (3,), 4, 2, 1.0)]
    for what, shape_q, Bk, n_blocks, scale in cases:
        s_blocks = [torch.randn(*shape_q, Bk, generator=g) * scale for _ in range(n_blocks)]
        if "1000" in what:
            s_blocks = [s + 1000.0 for s in s_blocks]
        v_blocks = [torch.randn(*shape_q[:-1], Bk, 6, generator=g) for _ in range(n_blocks)]
        s_all, v_all = torch.cat(s_blocks, -1), torch.cat(v_blocks, -2)
        want = torch.softmax(s_all, -1) @ v_all
        out, m, l = _c12_fold(fn, s_blocks, v_blocks, what)
        try:
            expect_close(out, want, f"acc / l after the last block ({what})", atol=1e-4)
        except Hint as h:
            raise Hint(str(h) + _c12_name_mistake(out, s_blocks, v_blocks)) from None
        expect_close(m, s_all.amax(-1, keepdim=True), f"m after the last block ({what}): the "
                     "largest score seen so far")
        n += 2
    # a query whose first block is entirely blocked: m stays -inf, and nothing may become NaN
    s1 = torch.tensor([[float("-inf"), float("-inf")], [0.5, float("-inf")]])
    s2 = torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    v1, v2 = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    want = torch.softmax(torch.cat([s1, s2], -1), -1) @ torch.cat([v1, v2], -2)
    out, m, l = _c12_fold(fn, [s1, s2], [v1, v2], "a query whose first block is all blocked")
    if torch.isnan(out).any() or torch.isnan(l).any():
        raise Hint("a query whose first block is all blocked (-inf scores) got NaN: there m and "
                   "m' are both -inf, and exp(m - m') = exp(-inf + inf) is NaN; use 0 in place "
                   "of a maximum that is still -inf")
    expect_close(out, want, "acc / l for a query whose first block is all blocked", atol=1e-5)
    return n + 1


# ---------------------------------------------------------------------------------------------
# The selective state-space step and the scan's combine operator (attnbook.ssm)

def _ssm_reference(h, u, delta, A, b, c, how="zoh"):
    """One step of the selective SSM; ``how`` switches on the classic mistakes the hints name.
    h (B, d, n); u, delta (B, d); A (d, n); b, c (B, n) -> (h', y (B, d))."""
    dA = delta[..., None] * A                                     # (B, d, n)
    if how == "no-delta":                                         # the step forgotten
        Abar, bbar = torch.exp(A).expand_as(dA), b[:, None, :].expand_as(dA)
    elif how == "euler":                                          # first order: "after"
        Abar, bbar = 1 + dA, delta[..., None] * b[:, None, :]
    else:
        Abar, bbar = torch.exp(dA), torch.expm1(dA) / A * b[:, None, :]
    h_new = Abar * h + bbar * u[..., None]
    read = h if how == "old-state" else h_new
    return h_new, (read * c[:, None, :]).sum(-1)


SSM_MISTAKES = [
    ("no-delta", "the step delta is missing: discretise first, Abar = exp(delta * A) and "
                 "bbar = (exp(delta * A) - 1) / A * b, then take the step with them"),
    ("euler", "that is Euler's step, Abar = 1 + delta * A and bbar = delta * b: a first-order "
              "approximation, exact only as delta goes to 0; the zero-order hold is exact: "
              "Abar = exp(delta * A), bbar = (exp(delta * A) - 1) / A * b"),
    ("old-state", "y was read from the old state: update h first, then y = sum_n c[n] h'[n]"),
]


def _ssm_case(g, B, d, n, scale=1.0):
    A = -torch.rand(d, n, generator=g, dtype=torch.float64) * 3 - 0.1
    return (torch.randn(B, d, n, generator=g, dtype=torch.float64),       # h
            torch.randn(B, d, generator=g, dtype=torch.float64),          # u
            torch.rand(B, d, generator=g, dtype=torch.float64) * scale,   # delta
            A, torch.randn(B, n, generator=g, dtype=torch.float64),       # b
            torch.randn(B, n, generator=g, dtype=torch.float64))          # c


@grader("ex-13-selective-step", target="selective_step")
def check_selective_step(fn) -> int:
    g = torch.Generator().manual_seed(13)
    n = 0
    for what, shape, scale in [("2 sequences, 3 channels, state 4", (2, 3, 4), 1.0),
                               ("large steps (delta up to 5)", (1, 2, 3), 5.0),
                               ("1 sequence, 1 channel, state 1", (1, 1, 1), 1.0)]:
        args = _ssm_case(g, *shape, scale)
        got = fn(*(a.clone() for a in args))
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Hint(f"on {what}: return a tuple (h, y), got {type(got).__name__}")
        want = _ssm_reference(*args)
        for i, name in enumerate(("the new state h", "the output y")):
            try:
                expect_close(got[i], want[i], f"{name} ({what})", atol=1e-8, rtol=1e-6)
            except Hint as h:
                named = [hint for how, hint in SSM_MISTAKES
                         if torch.allclose(got[i], _ssm_reference(*args, how=how)[i], atol=1e-8)]
                raise Hint(str(h) + ("; " + named[0] if named else "")) from None
            n += 1
    # a step of length 0: no time passes, the state stays, nothing is written
    h, u, _, A, b, c = _ssm_case(g, 2, 3, 4)
    got = fn(h.clone(), u, torch.zeros(2, 3, dtype=torch.float64), A, b, c)
    expect_close(got[0], h, "the new state after a step of delta = 0 (it must be the old one)")
    return n + 1


def _combine_reference(first, then, how="right"):
    (a1, b1), (a2, b2) = first, then
    if how == "swapped":
        return a1 * a2, a1 * b2 + b1
    if how == "undecayed":
        return a1 * a2, b1 + b2
    return a1 * a2, a2 * b1 + b2


COMBINE_MISTAKES = [
    ("swapped", "the order of composition is reversed: `first` runs first, so its b passes "
                "through then's gate: (a1 a2, a2 b1 + b2), not a1 b2 + b1"),
    ("undecayed", "first's b was not decayed by then's gate: after h -> a1 h + b1, the second "
                  "step multiplies all of it by a2: a2 (a1 h + b1) + b2"),
]


@grader("ex-13-combine", target="combine")
def check_combine(fn) -> int:
    g = torch.Generator().manual_seed(14)
    step = lambda: (torch.rand(2, 3, generator=g, dtype=torch.float64),   # noqa: E731
                    torch.randn(2, 3, generator=g, dtype=torch.float64))
    x, y, z = step(), step(), step()
    got = fn(x, y)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Hint(f"return a tuple (a, b), got {type(got).__name__}")
    want = _combine_reference(x, y)
    try:
        expect_close(got[0], want[0], "the combined a", atol=1e-10)
        expect_close(got[1], want[1], "the combined b", atol=1e-10)
    except Hint as h:
        named = [hint for how, hint in COMBINE_MISTAKES
                 if torch.allclose(got[1], _combine_reference(x, y, how)[1], atol=1e-10)]
        raise Hint(str(h) + ("; " + named[0] if named else "")) from None
    left, right = fn(fn(x, y), z), fn(x, fn(y, z))
    expect_close(right[1], left[1], "combine(x, combine(y, z)) against combine(combine(x, y), z) "
                 "(combine must be associative)", atol=1e-10)
    # a scan built on it: folding 9 steps from h_0 = 0 gives the recurrence's h_9
    steps = [step() for _ in range(9)]
    h = torch.zeros(2, 3, dtype=torch.float64)
    for a, b in steps:
        h = a * h + b
    acc = steps[0]
    for s in steps[1:]:
        acc = fn(acc, s)
    expect_close(acc[1], h, "nine steps folded with combine, against the recurrence's h_9",
                 atol=1e-10)
    return 4
