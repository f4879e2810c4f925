"""Chapter 7: the look-back task and the graders of the positional-encoding exercises."""
import math

import pytest
import torch

from attnbook import PAD_ID
from attnbook.positional import sinusoidal_encoding
from attnbook.tasks import make_lookback_task
from attnbook.transformer import SelfAttentionStack, TransformerConfig
from graderkit import assert_fails, grade, stub  # noqa: F401


# --- the task -----------------------------------------------------------------------------------

def lookback_labels(x, mask, offset):
    """The rule, written independently: class x[t - offset] - 3 at real t >= offset, else 0."""
    B, T = x.shape
    y = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            if mask[b, t] and t >= offset:
                y[b, t] = int(x[b, t - offset]) - 3
    return y


@pytest.mark.parametrize("min_len,max_len,offset,n_symbols", [(8, 16, 2, 8), (1, 5, 1, 3),
                                                              (30, 30, 3, 10)])
def test_lookback_task_shapes_mask_and_labels(min_len, max_len, offset, n_symbols):
    make_batch = make_lookback_task(min_len, max_len, offset=offset, n_symbols=n_symbols)
    b = make_batch(64, torch.Generator().manual_seed(0))
    x, y, mask = b.ids, b.targets, b.mask
    assert torch.equal(b.scored, mask) and b.positions is None   # every real label counts
    lengths = mask.sum(1)
    assert x.dtype == y.dtype == torch.long and mask.dtype == torch.bool
    assert x.shape == y.shape == mask.shape == (64, int(lengths.max()))
    assert int(lengths.min()) >= min_len and int(lengths.max()) <= max_len
    # the book's mask convention: True at real tokens, which come first; False at padding
    assert torch.equal(mask, torch.arange(x.shape[1])[None, :] < lengths[:, None])
    assert (x[~mask] == PAD_ID).all() and (y[~mask] == 0).all()
    assert ((x[mask] >= 4) & (x[mask] < 4 + n_symbols)).all()
    assert (y >= 0).all() and (y <= n_symbols).all()
    assert torch.equal(y, lookback_labels(x, mask, offset))
    assert (y[:, :offset] == 0).all()


def test_lookback_task_is_reproducible_and_covers_all_lengths():
    make_batch = make_lookback_task(4, 9)
    a = make_batch(32, torch.Generator().manual_seed(5))
    b = make_batch(32, torch.Generator().manual_seed(5))
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("ids", "targets", "mask"))
    mask = make_batch(2000, torch.Generator().manual_seed(1)).mask
    assert set(mask.sum(1).tolist()) == set(range(4, 10))


def test_lookback_labels_depend_on_order_not_on_the_bag_of_tokens():
    """Shuffling a sequence does not shuffle its labels: a bag-of-tokens model cannot solve it."""
    batch = make_lookback_task(16, 16)(200, torch.Generator().manual_seed(0))
    x, y, mask = batch.ids, batch.targets, batch.mask
    g = torch.Generator().manual_seed(1)
    changed = 0
    for b in range(x.shape[0]):
        perm = torch.randperm(16, generator=g)
        y_shuffled = lookback_labels(x[b:b + 1, perm], mask[b:b + 1], offset=2)[0]
        changed += not torch.equal(y_shuffled, y[b, perm])
    assert changed == x.shape[0]


def test_lookback_task_rejects_bad_arguments():
    for kwargs in [dict(min_len=0, max_len=4), dict(min_len=5, max_len=4),
                   dict(min_len=2, max_len=4, offset=0), dict(min_len=2, max_len=4, n_symbols=1)]:
        with pytest.raises(ValueError):
            make_lookback_task(**kwargs)


def test_encoder_without_positions_is_permutation_equivariant_and_causal_is_not():
    """The chapter's starting point, on the package's SelfAttentionStack."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=12, d_model=16, h=2, d_ff=32, n_layers=2, dropout=0.0,
                            positional="none")
    batch = make_lookback_task(10, 10)(4, torch.Generator().manual_seed(0))
    x, mask = batch.ids, batch.mask
    perm = torch.randperm(10)
    encoder = SelfAttentionStack(cfg, causal=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(encoder(x[:, perm], mask), encoder(x, mask)[:, perm])
        causal = SelfAttentionStack(cfg, causal=True).eval()
        causal.load_state_dict(encoder.state_dict())
        assert not torch.allclose(causal(x[:, perm], mask), causal(x, mask)[:, perm], atol=1e-3)
        for positional in ["sinusoidal", "learned"]:
            torch.manual_seed(0)
            cfg_pos = TransformerConfig(**{**cfg.to_dict(), "positional": positional})
            model = SelfAttentionStack(cfg_pos, causal=False).eval()
            if positional == "learned":
                torch.nn.init.normal_(model.pos.embedding.weight)
            assert not torch.allclose(model(x[:, perm], mask), model(x, mask)[:, perm], atol=1e-3)


# --- graders --------------------------------------------------------------------------------------


# ex-07-sinusoid-table: sinusoid_table(T, d_model, base=10000.0) -> (T, d_model) float32

def table(T, d_model, base=10000.0, *, start=0, exponent_2j=True, layout="interleaved",
          check_odd=True, dtype=torch.float32, use_base=True):
    """The reference solution; the keyword-only switches turn it into typical wrong answers."""
    if check_odd and d_model % 2:
        raise ValueError("d_model must be even")
    b = base if use_base else 10000.0
    p = torch.arange(start, start + T, dtype=torch.float64)[:, None]
    j = torch.arange(d_model // 2, dtype=torch.float64)
    omega = b ** (-(2 * j if exponent_2j else j) / d_model)
    sin, cos = torch.sin(p * omega), torch.cos(p * omega)
    if layout == "halves":
        out = torch.cat([sin, cos], dim=1)
    else:
        first, second = (cos, sin) if layout == "swapped" else (sin, cos)
        out = torch.stack([first, second], dim=-1).reshape(T, -1)
    return out.to(dtype)


def test_sinusoid_table_reference_passes():
    assert grade("ex-07-sinusoid-table", table).passed
    result = grade("ex-07-sinusoid-table", lambda T, d, base=10000.0: sinusoidal_encoding(T, d, base))
    assert result.passed, result.message


def test_sinusoid_table_stub_fails():
    assert_fails("ex-07-sinusoid-table", stub, "not implemented yet", "sinusoid_table")


@pytest.mark.parametrize("wrong,fragments", [
    (dict(layout="halves"), ["all the sines come first", "interleave"]),
    (dict(layout="swapped"), ["swapped", "column 2j is sin"]),
    (dict(start=1), ["positions start at 1"]),
    (dict(exponent_2j=False), ["frequencies are wrong", "2j"]),
    (dict(use_base=False), ["use the `base` argument"]),
    (dict(check_odd=False), ["odd d_model", "ValueError"]),
    (dict(dtype=torch.float64), ["float32"]),
])
def test_sinusoid_table_wrong_answers_get_precise_hints(wrong, fragments):
    assert_fails("ex-07-sinusoid-table", lambda T, d, base=10000.0: table(T, d, base, **wrong),
                 *fragments)


# ex-07-rope: apply_rope(x, positions) -> (..., T, d)

def rope(x, positions, *, sign=1.0, halves=False, exponent_2j=True, ignore_positions=False,
         add_instead=False, in_place=False, shift=0):
    """The reference solution; the keyword-only switches turn it into typical wrong answers."""
    d = x.shape[-1]
    if ignore_positions:
        positions = torch.arange(x.shape[-2])
    j = torch.arange(d // 2, dtype=torch.float64)
    omega = 10000.0 ** (-(2 * j if exponent_2j else j) / d)
    angle = sign * (positions.to(torch.float64)[:, None] + shift) * omega          # (T, d/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    if add_instead:
        pe = torch.stack([sin, cos], dim=-1).flatten(-2)
        return x + pe
    if halves:
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    out = x if in_place else torch.empty_like(x)
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def test_rope_reference_passes():
    result = grade("ex-07-rope", rope)
    assert result.passed, result.message


def test_rope_stub_fails():
    assert_fails("ex-07-rope", stub, "not implemented yet", "apply_rope")


@pytest.mark.parametrize("wrong,fragments", [
    (dict(add_instead=True), ["keeps the length", "do not add the sinusoids"]),
    (dict(sign=-1.0), ["rotated the wrong way"]),
    (dict(halves=True), ["paired with j + d/2", "(2j, 2j+1)"]),
    (dict(exponent_2j=False), ["frequencies are wrong", "2j"]),
    (dict(ignore_positions=True), ["`positions` was ignored"]),
    (dict(in_place=True), ["changed in place"]),
    (dict(shift=1), ["positions [0, 0, 0, 0]", "unchanged"]),
])
def test_rope_wrong_answers_get_precise_hints(wrong, fragments):
    assert_fails("ex-07-rope", lambda x, positions: rope(x, positions, **wrong), *fragments)


def test_rope_score_depends_only_on_offset_check_catches_absolute_angles():
    """Rotating by a function of the position that is not linear breaks the relative property."""
    def squared(x, positions):
        return rope(x, positions.to(torch.float64) ** 2)
    assert_fails("ex-07-rope", squared, "depend only on the offset")


def test_graders_leave_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    grade("ex-07-rope", rope)
    grade("ex-07-sinusoid-table", table)
    assert torch.equal(torch.rand(3), expected)
    assert math.isclose(float(sinusoidal_encoding(2, 2)[1, 0]), math.sin(1.0), rel_tol=1e-6)
