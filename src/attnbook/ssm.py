"""State-space layers: one layer written as a recurrence, a convolution and an
attention-like matrix.

A state-space model (SSM) reads a sequence of numbers u_1 .. u_T through a hidden state of
``d_state`` numbers, one such model per channel (the last dimension of ``u``, of width ``d``):

    h_t = Abar_t * h_{t-1} + bbar_t * u_t        the state      (B, d, d_state)
    y_t = sum_n c_t[n] h_t[n]                     the output     (B, d)

The papers call the input and output vectors B and C; here they are ``b`` and ``c``, because B
is the batch size in the book's notation (book/notation.md). The state matrix A is diagonal and
negative, so every state channel decays.

* **Discretisation** (:func:`discretize`): the continuous system h'(t) = A h(t) + b u(t), held
  constant for a step of length delta (zero-order hold), gives exactly
  Abar = exp(delta A) and bbar = (exp(delta A) - 1) / A * b (Gu et al., S4 and S4D).
* **Time-invariant** (S4D): delta, b and c are parameters, the same at every position. Then
  y = K * u, a causal convolution with the kernel K_k = sum_n c[n] Abar[n]^k bbar[n]
  (:func:`ssm_kernel`, :func:`lti_convolution`, by FFT: chapter 10's convolutions, as long as
  the sequence). :func:`lti_recurrence` and :func:`lti_chunked` compute the same y step by step
  and in blocks.
* **Selective** (Mamba): delta_t, b_t and c_t are computed from the input at each position, so
  the layer chooses what to write and what to forget; no single kernel exists any more. The
  recurrence is a scan: :func:`selective_scan` (one step per position) and
  :func:`selective_scan_parallel` (an associative scan in log2 T rounds, with
  :func:`combine`). :func:`selective_matrix` writes the same layer as one T x T matrix applied
  to u, lower-triangular like causal attention, with c_t as the query, b_s as the key and the
  decay between them as the mask (the state-space duality of Mamba-2, Dao and Gu 2024).

:class:`LTISSM` (S4D) and :class:`SelectiveSSM` (Mamba) are mixers called like
:class:`attnbook.mha.MultiHeadAttention` (``forward(x, key_mask=None, causal=True) -> (y, None)``);
their ``step`` generates one token at a time with a state whose size does not grow with the
sequence.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .beyond import check_recurrent_call


def _check(name: str, x: torch.Tensor, dims: int) -> None:
    if x.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(x.shape)}")


def discretize(delta: torch.Tensor, A: torch.Tensor, b: torch.Tensor):
    """Zero-order hold: (Abar, bbar) = (exp(delta A), (exp(delta A) - 1) / A * b).

    Exact for a diagonal A (each state channel is its own first-order system, solved over one
    step with the input held constant). delta broadcasts against A's first dimension: (..., d)
    with A (d, d_state) gives (..., d, d_state); b broadcasts against the result. A must be
    negative (a decaying state); delta = 0 gives Abar = 1 and bbar = 0: no time passes.
    """
    if (A >= 0).any():
        raise ValueError("A must be negative (each state channel decays): got a value >= 0")
    dA = delta[..., None] * A                                      # (..., d, d_state)
    Abar = torch.exp(dA)
    return Abar, torch.expm1(dA) / A * b                            # bbar: (..., d, d_state)


# ---------------------------------------------------------------------------------------------
# Time-invariant (S4D): one kernel for every position

def lti_recurrence(u: torch.Tensor, Abar: torch.Tensor, bbar: torch.Tensor,
                   c: torch.Tensor) -> torch.Tensor:
    """y from h_t = Abar h_{t-1} + bbar u_t, h_0 = 0, one step per position.

    u: (B, T, d); Abar, bbar, c: (d, d_state). Returns y (B, T, d). The state is (B, d, d_state)
    whatever T is: what a recurrent layer carries while it generates.
    """
    _check("u", u, 3)
    h = u.new_zeros(u.shape[0], *Abar.shape)                       # (B, d, d_state)
    ys = []
    for t in range(u.shape[1]):
        h = Abar * h + bbar * u[:, t, :, None]                      # (B, d, d_state)
        ys.append((h * c).sum(-1))                                  # (B, d)
    return torch.stack(ys, dim=1)                                   # (B, T, d)


def ssm_kernel(Abar: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor, T: int) -> torch.Tensor:
    """K_k = sum_n c[n] Abar[n]^k bbar[n], k = 0 .. T-1: the response to one input at k = 0.

    Abar, bbar, c: (d, d_state) -> K (d, T).
    """
    k = torch.arange(T, device=Abar.device, dtype=Abar.dtype)      # (T,)
    powers = Abar[..., None] ** k                                   # (d, d_state, T)
    return ((c * bbar)[..., None] * powers).sum(1)                  # (d, T)


def lti_convolution(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """y_t = sum_{k=0}^{t} K_k u_{t-k}: a causal convolution as long as the sequence.

    u: (B, T, d); K: (d, T') with T' >= T. Computed with the FFT, zero-padded to 2T so that the
    circular convolution does not wrap round: O(T log T) per channel. Returns y (B, T, d).
    """
    _check("u", u, 3)
    T = u.shape[1]
    if K.shape[-1] < T:
        raise ValueError(f"the kernel has {K.shape[-1]} taps for a sequence of {T}")
    n = 2 * T
    U = torch.fft.rfft(u.transpose(1, 2), n=n)                      # (B, d, T + 1)
    Kf = torch.fft.rfft(K[:, :T], n=n)                              # (d, T + 1)
    return torch.fft.irfft(U * Kf, n=n)[..., :T].transpose(1, 2)    # (B, T, d)


def lti_chunked(u: torch.Tensor, Abar: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                chunk: int) -> torch.Tensor:
    """The same y in blocks of ``chunk`` positions: inside a block, the convolution with the
    first ``chunk`` taps of the kernel; from the blocks before, only their final state,
    decayed by Abar once per step (y_t gets sum_n c[n] Abar[n]^(j+1) h[n] at the block's j-th
    position). The memory of a recurrence, the parallel work of a convolution.
    """
    _check("u", u, 3)
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    B, T, d = u.shape
    K = ssm_kernel(Abar, bbar, c, chunk)                            # (d, chunk)
    j = torch.arange(1, chunk + 1, device=u.device, dtype=Abar.dtype)
    decay = Abar[..., None] ** j                                    # (d, d_state, chunk)
    h = u.new_zeros(B, *Abar.shape)                                 # (B, d, d_state)
    ys = []
    for t0 in range(0, T, chunk):
        uc = u[:, t0:t0 + chunk]                                    # (B, L, d)
        L = uc.shape[1]
        carried = torch.einsum("dn,bdn,dnl->bld", c, h, decay[..., :L])    # (B, L, d)
        ys.append(lti_convolution(uc, K) + carried)
        # the state after the block: the old one decayed L steps, plus the block's inputs
        weights = decay[..., :L].flip(-1) / Abar[..., None]        # Abar^(L-1-k): (d, d_state, L)
        h = decay[None, ..., L - 1] * h + torch.einsum("dnl,dn,bld->bdn", weights, bbar, uc)
    return torch.cat(ys, dim=1)                                     # (B, T, d)


# ---------------------------------------------------------------------------------------------
# Selective (Mamba): delta, b and c chosen by the input at every position

def selective_scan(u: torch.Tensor, Abar: torch.Tensor, bbar: torch.Tensor,
                   c: torch.Tensor) -> torch.Tensor:
    """y from h_t = Abar_t h_{t-1} + bbar_t u_t, y_t = sum_n c_t[n] h_t[n], one step at a time.

    u: (B, T, d); Abar, bbar: (B, T, d, d_state) (from :func:`discretize` with delta (B, T, d)
    and b (B, T, 1, d_state)); c: (B, T, d_state). Returns y (B, T, d).
    """
    _check("u", u, 3)
    _check("Abar", Abar, 4)
    h = u.new_zeros(u.shape[0], *Abar.shape[2:])                   # (B, d, d_state)
    ys = []
    for t in range(u.shape[1]):
        h = Abar[:, t] * h + bbar[:, t] * u[:, t, :, None]          # (B, d, d_state)
        ys.append((h * c[:, t, None, :]).sum(-1))                   # (B, d)
    return torch.stack(ys, dim=1)                                   # (B, T, d)


def combine(first, then):
    """Two steps of h -> a h + b, ``first`` then ``then``, as one: (a1, b1) then (a2, b2) is
    h -> a2 (a1 h + b1) + b2 = (a1 a2) h + (a2 b1 + b2). Associative, not commutative."""
    (a1, b1), (a2, b2) = first, then
    return a1 * a2, a2 * b1 + b2


def selective_scan_parallel(u: torch.Tensor, Abar: torch.Tensor, bbar: torch.Tensor,
                            c: torch.Tensor) -> torch.Tensor:
    """The same y with an associative scan: ceil(log2 T) rounds, each combining every position
    with the one ``offset`` before it (Hillis and Steele), offset = 1, 2, 4, ... After the round
    with offset o, position t holds the composition of the steps t - 2o + 1 .. t, so at the end
    it holds steps 1 .. t applied to h_0 = 0: its b part is h_t. Work T log T, depth log T.
    """
    _check("u", u, 3)
    _check("Abar", Abar, 4)
    a, b = Abar, bbar * u[..., None]                                # (B, T, d, d_state) each
    offset = 1
    while offset < u.shape[1]:
        a_new, b_new = combine((a[:, :-offset], b[:, :-offset]), (a[:, offset:], b[:, offset:]))
        a = torch.cat([a[:, :offset], a_new], dim=1)
        b = torch.cat([b[:, :offset], b_new], dim=1)
        offset *= 2
    return (b * c[:, :, None, :]).sum(-1)                           # (B, T, d)


def selective_matrix(delta: torch.Tensor, A: torch.Tensor, b: torch.Tensor,
                     c: torch.Tensor) -> torch.Tensor:
    """The selective SSM as one matrix per channel: y_t = sum_{s <= t} M[t, s] u_s with

        M[t, s] = sum_n c_t[n] exp(A[n] (delta_{s+1} + ... + delta_t)) bbar_s[n]

    c_t plays the query, bbar_s the key and the decay between positions s and t the causal
    mask, multiplied in, not added: attention without a softmax (Dao and Gu 2024).

    delta: (B, T, d); A: (d, d_state); b, c: (B, T, d_state). Returns M (B, d, T, T), zero above
    the diagonal; ``torch.einsum("bdts,bsd->btd", M, u)`` is the layer's output.
    """
    _check("delta", delta, 3)
    _, bbar = discretize(delta, A, b[:, :, None, :])               # (B, T, d, d_state)
    L = torch.cumsum(delta, dim=1)[..., None] * A                  # (B, T, d, d_state): log decays
    gap = L[:, :, None] - L[:, None, :]                             # (B, t, s, d, d_state)
    T = delta.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=delta.device).tril()   # (T, T): s <= t
    decay = torch.exp(gap.masked_fill(~causal[:, :, None, None], -math.inf))
    return torch.einsum("btn,btsdn,bsdn->bdts", c, decay, bbar)     # (B, d, T, T)


class LTISSM(nn.Module):
    """An S4D-style time-invariant state-space mixer: (B, T, d_model) -> (B, T, d_model).

        u_t = silu(W_u x_t)                          the channels          (B, T, d)
        y = K * u + D * u                            one kernel per channel, a skip
        out_t = W_o (y_t * silu(W_g x_t))            gated, read out       (B, T, d_model)

    delta, b and c are parameters: every position is treated alike, so the whole layer is a
    convolution with the kernel K (:func:`ssm_kernel`), computed here by FFT. A is S4D-Real's,
    A[:, n] = -(n + 1); delta starts between 0.001 and 0.1, b at 1 and c at random (S4D).
    Causal by construction; at a position where key_mask is False nothing is written (u = 0),
    but time passes: the state decays there as everywhere, since the layer cannot tell the
    positions apart. :meth:`step` generates with a state of d x d_state numbers.
    """

    def __init__(self, d_model: int, d_state: int = 16, expand: int = 1):
        super().__init__()
        d = expand * d_model
        self.d_model, self.d, self.d_state = d_model, d, d_state
        self.W_u, self.W_g = nn.Linear(d_model, d), nn.Linear(d_model, d)
        self.W_o = nn.Linear(d, d_model)
        self.log_neg_A = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(d, 1))
        self.log_delta = nn.Parameter(torch.empty(d).uniform_(math.log(1e-3), math.log(1e-1)))
        self.b = nn.Parameter(torch.ones(d, d_state))
        self.c = nn.Parameter(torch.randn(d, d_state) * d_state ** -0.5)
        self.D = nn.Parameter(torch.ones(d))

    def discrete(self):
        """(Abar, bbar), each (d, d_state): the layer's one step, the same at every position."""
        return discretize(torch.exp(self.log_delta), -torch.exp(self.log_neg_A), self.b)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, causal: bool = True,
                need_weights: bool = False, cache: dict | None = None):
        check_recurrent_call(self, x, context, key_mask, causal, need_weights, cache,
                             "use step() to generate: its state is the cache")
        u = F.silu(self.W_u(x))                                     # (B, T, d)
        if key_mask is not None:
            u = u * key_mask[..., None]                             # padding writes nothing
        Abar, bbar = self.discrete()
        y = lti_convolution(u, ssm_kernel(Abar, bbar, self.c, x.shape[1])) + self.D * u
        return self.W_o(y * F.silu(self.W_g(x))), None              # (B, T, d_model)

    def step(self, x_t: torch.Tensor, h: torch.Tensor | None = None):
        """One position: x_t (B, d_model), state h (B, d, d_state) or None -> (out_t, new h)."""
        u = F.silu(self.W_u(x_t))                                   # (B, d)
        Abar, bbar = self.discrete()
        h = Abar * (0 if h is None else h) + bbar * u[..., None]   # (B, d, d_state)
        y = (h * self.c).sum(-1) + self.D * u                       # (B, d)
        return self.W_o(y * F.silu(self.W_g(x_t))), h


class SelectiveSSM(nn.Module):
    """A Mamba-style selective state-space mixer: (B, T, d_model) -> (B, T, d_model).

        u_t = silu(conv(W_u x)_t)                    the channels          (B, T, d)
        delta_t = softplus(W_delta x_t)              the step per channel  (B, T, d)
        b_t, c_t = W_b x_t, W_c x_t                  write, read           (B, T, d_state)
        y_t = SSM(u)_t + D * u_t                     the scan, a skip      (B, T, d)
        out_t = W_o (y_t * silu(W_g x_t))            gated, read out       (B, T, d_model)

    A is S4D-Real's, A[:, n] = -(n + 1), learned as log(-A); delta starts between 0.001 and
    0.1, as in Mamba. ``conv`` is Mamba's short causal convolution, one filter of ``d_conv``
    taps per channel: u_t mixes the inputs t - d_conv + 1 .. t, so a token can be written
    together with the one before it (a key with its value); ``d_conv=1`` leaves it out. The
    layer is causal by construction. At a position where key_mask is False, delta is 0: no time
    passes, the state is kept and nothing is written; the convolution still counts positions,
    so with ``d_conv > 1`` pad on the right (or use d_conv=1). ``scan`` chooses the form:
    "sequential" (one step per position) or "parallel" (the associative scan); both give the
    same output.
    """

    def __init__(self, d_model: int, d_state: int = 16, expand: int = 1, d_conv: int = 4,
                 scan: str = "parallel"):
        super().__init__()
        if scan not in ("sequential", "parallel"):
            raise ValueError(f"scan must be 'sequential' or 'parallel', got {scan!r}")
        if d_conv < 1:
            raise ValueError(f"d_conv must be at least 1 (1: no convolution), got {d_conv}")
        d = expand * d_model
        self.d_model, self.d, self.d_state, self.scan = d_model, d, d_state, scan
        self.d_conv = d_conv
        self.W_u, self.W_g = nn.Linear(d_model, d), nn.Linear(d_model, d)
        self.conv = nn.Conv1d(d, d, d_conv, groups=d)               # one filter per channel
        self.W_delta = nn.Linear(d_model, d)
        self.W_b, self.W_c = nn.Linear(d_model, d_state), nn.Linear(d_model, d_state)
        self.W_o = nn.Linear(d, d_model)
        self.log_neg_A = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        with torch.no_grad():   # softplus(bias) log-uniform in [0.001, 0.1]
            dt = torch.exp(torch.empty(d).uniform_(math.log(1e-3), math.log(1e-1)))
            self.W_delta.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _inputs(self, x: torch.Tensor, key_mask: torch.Tensor | None = None,
                window: torch.Tensor | None = None):
        """u, Abar, bbar, c of the positions of x (B, T, d_model), and the convolution's next
        window; ``window``: the last d_conv - 1 values of W_u x before them, (B, d, d_conv - 1),
        or None (zeros: the start)."""
        v = self.W_u(x).transpose(1, 2)                             # (B, d, T)
        if window is None:
            window = v.new_zeros(*v.shape[:2], self.d_conv - 1)
        seen = torch.cat([window, v], -1)                           # (B, d, d_conv - 1 + T)
        u = F.silu(self.conv(seen)).transpose(1, 2)                 # (B, T, d)
        delta = F.softplus(self.W_delta(x))                         # (B, T, d)
        if key_mask is not None:
            delta = delta * key_mask[..., None]                     # padding: no time passes
        A = -torch.exp(self.log_neg_A)                              # (d, d_state)
        Abar, bbar = discretize(delta, A, self.W_b(x)[..., None, :])  # (B, T, d, d_state)
        window = seen[..., seen.shape[-1] - (self.d_conv - 1):]     # (B, d, d_conv - 1)
        return u, Abar, bbar, self.W_c(x), window                   # c: (B, T, d_state)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, causal: bool = True,
                need_weights: bool = False, cache: dict | None = None):
        check_recurrent_call(self, x, context, key_mask, causal, need_weights, cache,
                             "use step() to generate: its state is the cache")
        u, Abar, bbar, c, _ = self._inputs(x, key_mask)
        scan = selective_scan if self.scan == "sequential" else selective_scan_parallel
        y = scan(u, Abar, bbar, c) + self.D * u                     # (B, T, d)
        return self.W_o(y * F.silu(self.W_g(x))), None              # (B, T, d_model)

    def step(self, x_t: torch.Tensor, state: tuple | None = None):
        """One position: x_t (B, d_model) and the state, or None (the start) -> (out_t
        (B, d_model), the new state). The state is (window, h): the convolution's last
        d_conv - 1 inputs (B, d, d_conv - 1) and the scan's h (B, d, d_state). Its size does not
        depend on how many tokens came before: generating costs the same at every position."""
        window, h = (None, None) if state is None else state
        u, Abar, bbar, c, window = self._inputs(x_t[:, None], window=window)   # one position
        h = torch.zeros_like(bbar[:, 0]) if h is None else h
        h = Abar[:, 0] * h + bbar[:, 0] * u[:, 0, :, None]          # (B, d, d_state)
        y = (h * c[:, 0, None, :]).sum(-1) + self.D * u[:, 0]       # (B, d)
        return self.W_o(y * F.silu(self.W_g(x_t))), (window, h)
