"""Chapter 6 (masking and cross-attention): the graders of the causal mask, the decoder's
combined mask and the leak detector.

Masks are bool, True = may attend (book/notation.md): the causal mask is
:func:`attnbook.attention.causal_mask`, True where key s <= t + (S - T)."""
from __future__ import annotations

import torch

from ..attention import causal_mask
from ..transformer import SelfAttentionStack, TransformerConfig
from ..batching import lengths_mask
from .core import OFF_BY_ONE, Hint, expect_shape, grader, shifted_causal_mask


def _first_difference(got: torch.Tensor, ref: torch.Tensor) -> tuple:
    """The index of the first entry where two tensors of the same shape differ."""
    return tuple(torch.nonzero(got != ref)[0].tolist())


@grader("ex-06-causal-mask", target="make_causal_mask")
def check_make_causal_mask(make_causal_mask):
    """Checks ``make_causal_mask(T, S=None) -> (T, S)`` bool, True where key i <= t + (S - T)."""
    n = 0
    cases = [(5, None), (2, None), (4, 4), (1, None), (2, 5), (1, 3), (4, 7)]
    for T, S in cases:
        args = (T,) if S is None else (T, S)
        call = f"make_causal_mask({', '.join(map(str, args))})"
        ref = causal_mask(T, S)
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
            (None if square else torch.ones_like(ref).tril(0),
             f"with S = {S} keys and T = {T} queries, the queries are the *last* T positions (as "
             "when decoding with a cache of earlier keys): query t sits at position t + S - T and "
             "may see keys i <= t + (S - T). Your mask treats it as position t"),
        ] + [(shifted_causal_mask(T, S, shift), hint) for shift, hint in OFF_BY_ONE.items()]
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
        pad_mask = lengths_mask(lengths, T)                         # (B, T)
        if what.startswith("left"):
            pad_mask = pad_mask.flip(1)
        keys = pad_mask[:, None, None, :]                            # (B, 1, 1, T)
        queries = pad_mask[:, None, :, None]                         # (B, 1, T, 1)
        causal = causal_mask(T)                                 # (T, T)
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
        ] + [(keys & shifted_causal_mask(T, shift=shift), f"the causal part: {hint}")
             for shift, hint in OFF_BY_ONE.items()]
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
    """(description, model, leaks?) triples: honest models and models that see the future.

    A leak from token a into position b < a shows only when the tokens after some t in b..a-1
    change; the leaks into positions T // 2 and 0 share no such t, so a detector that tests a
    single split point (the middle, say) misses one of them."""
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
        ("a causal model whose output at position 0 also reads token 1",
         _Peek(stack(True), 1, 0, vocab_size).eval(), True),
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
                    where = (f"Only position {model.to} reads the future (token {model.frm}): "
                             "a detector that tests one split point or one position misses it. "
                             if isinstance(model, _Peek) else "")
                    hint = (f"it leaks, but your function said it does not. {where}For every "
                            "position t, change the tokens after t (all of them, to tokens that "
                            "really differ) and compare the outputs at positions 0..t")
                else:
                    hint = ("it does not leak, but your function said it does. Outputs at "
                            "positions after t may change when tokens after t change; compare only "
                            "positions 0..t, with a tolerance (torch.allclose) rather than ==")
                raise Hint(f"leaks_future(model, T={T}, vocab_size={vocab_size}) on {what}: "
                           f"{hint}")
            n += 1
    return n

