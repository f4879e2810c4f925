"""State-space layers (attnbook.ssm): one layer as a recurrence, a convolution, in chunks, as a
scan, a parallel scan and an attention-like matrix, each form checked equal to the others."""
import pytest
import torch

from attnbook.ssm import (LTISSM, SelectiveSSM, combine, discretize, lti_chunked, lti_convolution,
                          lti_recurrence, selective_matrix, selective_scan,
                          selective_scan_parallel, ssm_kernel)

F64 = dict(dtype=torch.float64)


def lti(d=3, d_state=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = -torch.rand(d, d_state, generator=g, **F64) * 2 - 0.1        # negative: decaying
    delta = torch.rand(d, generator=g, **F64) * 0.5 + 0.05
    b, c = torch.randn(d, d_state, generator=g, **F64), torch.randn(d, d_state, generator=g, **F64)
    Abar, bbar = discretize(delta, A, b)
    return Abar, bbar, c


def selective(Bsz=2, T=13, d=3, d_state=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = -torch.rand(d, d_state, generator=g, **F64) * 2 - 0.1
    delta = torch.rand(Bsz, T, d, generator=g, **F64) * 0.5
    b = torch.randn(Bsz, T, d_state, generator=g, **F64)
    c = torch.randn(Bsz, T, d_state, generator=g, **F64)
    u = torch.randn(Bsz, T, d, generator=g, **F64)
    return u, delta, A, b, c


def generated(layer, x):
    """The layer's outputs one position at a time with step(), (B, T, d_model), and the shapes
    its state had along the way."""
    h, outs, states = None, [], set()
    for t in range(x.shape[1]):
        out, h = layer.step(x[:, t], h)
        outs.append(out)
        states.add(tuple(tuple(a.shape) for a in h) if isinstance(h, tuple) else tuple(h.shape))
    return torch.stack(outs, 1), states


def test_zero_order_hold_is_the_exact_solution_of_the_continuous_system():
    """For one channel, exp of the augmented matrix [[A, b], [0, 0]] * delta holds
    (Abar, bbar) in its last column: the textbook zero-order hold."""
    A = torch.tensor([-0.7, -2.0, -0.05], **F64)
    b, delta = torch.tensor([0.3, -1.2, 2.0], **F64), torch.tensor(0.4, **F64)
    Abar, bbar = discretize(delta, A, b)
    M = torch.zeros(4, 4, **F64)
    M[:3, :3], M[:3, 3] = torch.diag(A), b
    E = torch.linalg.matrix_exp(M * delta)
    torch.testing.assert_close(Abar, torch.diagonal(E[:3, :3]))
    torch.testing.assert_close(bbar, E[:3, 3])
    Abar0, bbar0 = discretize(torch.tensor(0.0, **F64), A, b)          # no time passes
    assert torch.equal(Abar0, torch.ones(3, **F64)) and torch.equal(bbar0, torch.zeros(3, **F64))
    with pytest.raises(ValueError, match="A must be negative"):
        discretize(delta, torch.tensor([-1.0, 0.0], **F64), b[:2])


@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 20])
def test_time_invariant_recurrence_equals_convolution_equals_chunks(chunk):
    Abar, bbar, c = lti()
    u = torch.randn(2, 13, 3, generator=torch.Generator().manual_seed(1), **F64)
    y = lti_recurrence(u, Abar, bbar, c)                                  # (B, T, d)
    K = ssm_kernel(Abar, bbar, c, 13)                                     # (d, T)
    torch.testing.assert_close(lti_convolution(u, K), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lti_chunked(u, Abar, bbar, c, chunk), y, rtol=1e-10, atol=1e-10)
    # the kernel is the response to a single 1 at the start
    impulse = torch.zeros(1, 13, 3, **F64)
    impulse[:, 0] = 1
    torch.testing.assert_close(lti_recurrence(impulse, Abar, bbar, c)[0].T, K)


def test_a_kernel_too_short_and_a_bad_chunk_are_refused():
    Abar, bbar, c = lti()
    u = torch.randn(1, 8, 3, **F64)
    with pytest.raises(ValueError, match="5 taps for a sequence of 8"):
        lti_convolution(u, ssm_kernel(Abar, bbar, c, 5))
    with pytest.raises(ValueError, match="chunk must be at least 1"):
        lti_chunked(u, Abar, bbar, c, 0)
    with pytest.raises(ValueError, match="u must have 3 dimensions"):
        lti_recurrence(u[0], Abar, bbar, c)


@pytest.mark.parametrize("T", [1, 2, 7, 8, 13])
def test_selective_scan_equals_parallel_scan_equals_the_matrix(T):
    u, delta, A, b, c = selective(T=T)
    Abar, bbar = discretize(delta, A, b[:, :, None, :])                  # (B, T, d, d_state)
    y = selective_scan(u, Abar, bbar, c)
    torch.testing.assert_close(selective_scan_parallel(u, Abar, bbar, c), y, rtol=1e-10, atol=1e-10)
    M = selective_matrix(delta, A, b, c)                                 # (B, d, T, T)
    torch.testing.assert_close(torch.einsum("bdts,bsd->btd", M, u), y, rtol=1e-10, atol=1e-10)
    assert torch.all(M.triu(1) == 0)                                 # causal: nothing from later


def test_a_selective_ssm_with_constant_inputs_is_the_time_invariant_one():
    Bsz, T, d, n = 2, 9, 3, 4
    u, _, A, _, _ = selective(Bsz, T, d, n)
    g = torch.Generator().manual_seed(5)
    delta = torch.rand(d, **F64) + 0.1
    b, c = torch.randn(n, generator=g, **F64), torch.randn(n, generator=g, **F64)
    Abar, bbar = discretize(delta, A, b)                                 # (d, d_state)
    y = lti_convolution(u, ssm_kernel(Abar, bbar, c.expand(d, n), T))
    M = selective_matrix(delta.expand(Bsz, T, d), A, b.expand(Bsz, T, n), c.expand(Bsz, T, n))
    torch.testing.assert_close(torch.einsum("bdts,bsd->btd", M, u), y, rtol=1e-10, atol=1e-10)
    # ... whose matrix is a Toeplitz one: M[t, s] depends on t - s only (the kernel)
    K = ssm_kernel(Abar, bbar, c.expand(d, n), T)
    torch.testing.assert_close(M[0, :, 5, 2], K[:, 3])


def test_combine_is_associative_and_order_matters():
    g = torch.Generator().manual_seed(2)
    x, y, z = [(torch.rand(3, generator=g, **F64), torch.randn(3, generator=g, **F64))
               for _ in range(3)]
    left, right = combine(combine(x, y), z), combine(x, combine(y, z))
    torch.testing.assert_close(left, right)
    swapped = combine(y, x)
    assert not torch.allclose(swapped[1], combine(x, y)[1])              # not commutative


def test_the_selective_layer_both_scans_causal_and_step_by_step():
    torch.manual_seed(0)
    layer = SelectiveSSM(d_model=8, d_state=4, expand=2).double()
    x = torch.randn(2, 11, 8, **F64)
    y, weights = layer(x)
    assert y.shape == (2, 11, 8) and weights is None
    layer.scan = "sequential"
    torch.testing.assert_close(layer(x)[0], y, rtol=1e-10, atol=1e-10)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 5, 8, **F64)                              # change the future only
    torch.testing.assert_close(layer(x2)[0][:, :6], y[:, :6])
    outs, states = generated(layer, x)
    assert states == {((2, 16, 3), (2, 16, 4))}       # (B, d, d_conv - 1), (B, d, d_state), any t
    torch.testing.assert_close(outs, y, rtol=1e-10, atol=1e-10)


def test_padding_keeps_the_state_and_bad_input_is_refused():
    torch.manual_seed(0)
    layer = SelectiveSSM(d_model=8, d_state=4, d_conv=1).double()      # no convolution
    x = torch.randn(1, 6, 8, **F64)
    mask = torch.tensor([[True, True, False, False, True, True]])
    padded = layer(x, key_mask=mask)[0]
    real = layer(x[:, [0, 1, 4, 5]])[0]                                  # the same, without padding
    torch.testing.assert_close(padded[:, [0, 1, 4, 5]], real)
    outs, states = generated(layer, x)                                   # no window to keep
    assert states == {((1, 8, 0), (1, 8, 4))}
    torch.testing.assert_close(outs, layer(x)[0], rtol=1e-10, atol=1e-10)
    # with the convolution, padding on the right leaves the real positions as they were
    conv = SelectiveSSM(d_model=8, d_state=4).double()
    right = torch.tensor([[True] * 4 + [False] * 2])
    torch.testing.assert_close(conv(x, key_mask=right)[0][:, :4], conv(x[:, :4])[0])
    with pytest.raises(ValueError, match="d_conv must be at least 1"):
        SelectiveSSM(8, d_conv=0)
    with pytest.raises(ValueError, match=r"expected x \(B, T, 8\)"):
        layer(x[0])
    with pytest.raises(ValueError, match="key_mask must be a"):
        layer(x, key_mask=mask.float())
    with pytest.raises(ValueError, match="always causal"):
        layer(x, causal=False)
    with pytest.raises(ValueError, match="scan must be"):
        SelectiveSSM(8, scan="fft")


def test_the_time_invariant_layer_is_causal_and_steps_as_it_convolves():
    torch.manual_seed(0)
    layer = LTISSM(d_model=8, d_state=4, expand=2).double()
    x = torch.randn(2, 10, 8, **F64)
    y, weights = layer(x)
    assert y.shape == (2, 10, 8) and weights is None
    x2 = x.clone()
    x2[:, 7:] = 0                                                        # change the future only
    torch.testing.assert_close(layer(x2)[0][:, :7], y[:, :7])
    outs, states = generated(layer, x)
    assert states == {(2, 16, 4)}
    torch.testing.assert_close(outs, y, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="always causal"):
        layer(x, causal=False)
