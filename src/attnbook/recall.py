"""Multi-query associative recall (MQAR; Arora et al. 2024, "Zoology"), and small decoder-only
models to compare on it: what a fixed-size state costs against attention's cache.

A sequence of length T holds n_pairs key-value pairs, then a query region in which every key
appears once more, in another order, among filler tokens. At each query the model must output
the value that followed that key in the pairs:

    k3 v7 k1 v2 k5 v9 _ _ k1 _ _ _ k5 _ k3 _      (n_pairs = 3, T = 16)
                          v2       v9    v7        what the model must say at the queries

Attention can look the key up in its cache of every earlier position; a recurrent model must
have kept all n_pairs values in its state, a fixed number of numbers whatever T is.

Tokens: ids 0-3 are the book's special tokens (never used here); keys are ids
4 .. 3 + n_keys, values the next n_values ids, and the filler is the one id after them.
"""
from __future__ import annotations

import time
import torch
import torch.nn.functional as F

from . import PAD_ID
from .batching import SeqBatch
from .beyond import GatedRecurrence, LinearAttention
from .loop import fit
from .mha import MultiHeadAttention
from .schedules import warmup_cosine_scheduler
from .ssm import LTISSM, SelectiveSSM
from .transformer import SelfAttentionStack, TransformerConfig


def vocab_size(n_keys: int, n_values: int) -> int:
    """The ids MQAR uses: 4 special ones, the keys, the values and the filler."""
    return 4 + n_keys + n_values + 1


def mqar_batch(batch_size: int, n_pairs: int, T: int, n_keys: int = 64, n_values: int = 64,
               generator: torch.Generator | None = None) -> SeqBatch:
    """``batch_size`` MQAR sequences of length T (see the module's docstring), a SeqBatch:
    ids (B, T), the pairs then the queries among filler tokens; targets (B, T), at a query its
    value, PAD elsewhere; scored (B, T), True at the queries, where the loss and accuracy count;
    mask all True (no padding).

    Each sequence draws n_pairs distinct keys (so each query has one answer) and a value for
    each, independently; the queries take n_pairs distinct positions of the query region, drawn
    uniformly, in a random order of the keys.
    """
    if n_pairs < 1 or n_pairs > n_keys:
        raise ValueError(f"need 1 <= n_pairs <= n_keys, got n_pairs={n_pairs}, n_keys={n_keys}")
    if T < 3 * n_pairs:
        raise ValueError(f"T = {T} is too short for {n_pairs} pairs and their queries: "
                         f"give T >= 3 * n_pairs = {3 * n_pairs}")
    g = generator
    keys = torch.rand(batch_size, n_keys, generator=g).argsort(-1)[:, :n_pairs] + 4  # (B, n)
    values = torch.randint(0, n_values, (batch_size, n_pairs), generator=g) + 4 + n_keys
    filler = 4 + n_keys + n_values
    ids = torch.full((batch_size, T), filler, dtype=torch.long)
    ids[:, 0:2 * n_pairs:2], ids[:, 1:2 * n_pairs:2] = keys, values
    region = T - 2 * n_pairs
    slots = torch.rand(batch_size, region, generator=g).argsort(-1)[:, :n_pairs] + 2 * n_pairs
    order = torch.rand(batch_size, n_pairs, generator=g).argsort(-1)           # (B, n)
    rows = torch.arange(batch_size)[:, None]
    ids[rows, slots] = keys.gather(1, order)
    targets = torch.full((batch_size, T), PAD_ID, dtype=torch.long)
    targets[rows, slots] = values.gather(1, order)
    queries = torch.zeros(batch_size, T, dtype=torch.bool)
    queries[rows, slots] = True
    return SeqBatch(ids, targets, mask=torch.ones_like(queries), scored=queries)


# ---------------------------------------------------------------------------------------------
# The models: one decoder-only stack, its mixers swapped

MIXERS = ("attention", "linear", "gated", "lti", "selective", "hybrid")


def recall_model(kind: str, vocab: int, d_model: int = 64, n_layers: int = 2, h: int = 4,
                 d_state: int = 16, d_conv: int = 4) -> SelfAttentionStack:
    """Chapter 12's decoder-only stack (``SelfAttentionStack(cfg, causal=True)``, sinusoidal
    positions, post-norm blocks with a feed-forward network) with the mixer ``kind`` in every
    block: "attention" (softmax, MultiHeadAttention), "linear" (LinearAttention), "gated"
    (GatedRecurrence with ``d_state`` channels), "lti" (LTISSM, S4D) or "selective"
    (SelectiveSSM, Mamba), each state-space layer with ``d_state`` numbers per channel; "hybrid"
    is selective in every block but the last, which keeps attention. ``d_conv``: the taps of
    the selective layers' short convolution (1: none).
    forward(ids (B, T)) -> logits (B, T, vocab).
    """
    if kind not in MIXERS:
        raise ValueError(f"unknown model {kind!r}: choose one of {MIXERS}")
    cfg = TransformerConfig(vocab_size=vocab, d_model=d_model, h=h, d_ff=4 * d_model,
                            n_layers=n_layers, dropout=0.0, max_len=4096)
    model = SelfAttentionStack(cfg, causal=True)
    for i, block in enumerate(model.blocks):
        mixer = kind
        if kind == "hybrid":
            mixer = "attention" if i == n_layers - 1 else "selective"
        block.self_attn = {"attention": lambda: MultiHeadAttention(d_model, h),
                           "linear": lambda: LinearAttention(d_model, h),
                           "gated": lambda: GatedRecurrence(d_model, d_state),
                           "lti": lambda: LTISSM(d_model, d_state),
                           "selective": lambda: SelectiveSSM(d_model, d_state,
                                                             d_conv=d_conv)}[mixer]()
    return model


def state_numbers(model: SelfAttentionStack, T: int) -> int:
    """How many numbers the model carries per sequence while it generates, after T tokens: what
    its mixers remember of the past. Attention's key/value cache grows with T (2 T d_model per
    layer); linear attention keeps a d_k x d_v matrix and a d_k normaliser per head; the gated
    recurrence d_state numbers; a state-space layer d x d_state, and the selective one also the
    last d_conv - 1 inputs of its convolution, d x (d_conv - 1)."""
    total = 0
    for block in model.blocks:
        m = block.self_attn
        if isinstance(m, LinearAttention):          # (a MultiHeadAttention, so asked first)
            total += m.h * (m.d_k * m.d_v + m.d_k)
        elif isinstance(m, MultiHeadAttention):
            total += 2 * T * m.d_model
        elif isinstance(m, GatedRecurrence):
            total += m.d_state
        elif isinstance(m, SelectiveSSM):                # the scan's state, the conv's window
            total += m.d * m.d_state + m.d * (m.d_conv - 1)
        elif isinstance(m, LTISSM):
            total += m.d * m.d_state
        else:
            raise TypeError(f"no state size known for a {type(m).__name__}")
    return total


def recall_loss(model, b: SeqBatch) -> torch.Tensor:
    """Cross-entropy at the queries only: the rest of the sequence has nothing to predict.
    No sequence has padding, so the model reads the ids alone."""
    return F.cross_entropy(model(b.ids)[b.scored], b.targets[b.scored])


@torch.no_grad()
def recall_accuracy(model, b: SeqBatch) -> float:
    """The fraction of the batch's queries whose value the model puts first, in eval mode."""
    was_training = model.training
    model.eval()
    right = model(b.ids).argmax(-1)[b.scored] == b.targets[b.scored]
    model.train(was_training)
    return right.float().mean().item()


def train_recall(model, n_pairs: int, T: int, steps: int, n_keys: int = 64, n_values: int = 64,
                 batch_size: int = 64, lr: float = 1e-3, warmup: int = 50, seed: int = 0,
                 clip: float = 1.0) -> list[float]:
    """Train on fresh MQAR batches (a generator seeded with ``seed``) with Adam, a warm-up then
    cosine decay; returns the loss of every step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = warmup_cosine_scheduler(opt, warmup, steps)
    return fit(model, lambda step: mqar_batch(batch_size, n_pairs, T, n_keys, n_values, g),
               recall_loss, steps, opt, sched, clip)


# ---------------------------------------------------------------------------------------------
# What generating costs: a growing cache against a fixed state

@torch.no_grad()
def generation_cost(kind: str, lengths, d_model: int = 256, h: int = 4, d_state: int = 16,
                    steps: int = 32, seed: int = 0, device: str = "cpu") -> list[dict]:
    """Time and memory of generating one more token after t tokens, for one mixer layer and one
    sequence: "attention" (MultiHeadAttention with its key/value cache) or "selective"
    (SelectiveSSM.step with its state).

    For each t in ``lengths`` (increasing) the layer first reads t random inputs (attention in
    one causal pass that fills the cache; the state-space layer one step at a time, as it would
    have generated them), then generates ``steps`` more positions one at a time; the row gives
    the median seconds of those steps and the bytes of the cache or state after the t tokens.
    The book's cache grows with ``torch.cat``, which copies it at every step. On a GPU
    (``device="cuda"``) each step is timed to its end (``torch.cuda.synchronize``). Returns one
    dict a length: {"mixer", "t", "s_per_token", "state_bytes"}.
    """
    torch.manual_seed(seed)
    if kind == "attention":
        layer = MultiHeadAttention(d_model, h).eval()
    elif kind == "selective":
        layer = SelectiveSSM(d_model, d_state).eval()
    else:
        raise ValueError(f"generation_cost measures 'attention' or 'selective', got {kind!r}")
    layer = layer.to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    rows = []
    for t in lengths:
        x = torch.randn(1, t + steps, d_model).to(device)         # (1, t + steps, d_model)
        cache, state = {}, None
        if kind == "attention":
            layer(x[:, :t], causal=True, cache=cache)               # the cache: (1, h, t, d_k) x 2
        else:
            for i in range(t):
                _, state = layer.step(x[:, i], state)               # (window, h)
        held = [cache["k"], cache["v"]] if kind == "attention" else list(state)
        held = sum(a.numel() * a.element_size() for a in held)      # bytes, after t tokens
        times = []
        for i in range(t, t + steps):
            sync()
            start = time.perf_counter()
            if kind == "attention":
                layer(x[:, i:i + 1], causal=True, cache=cache)
            else:
                _, state = layer.step(x[:, i], state)
            sync()
            times.append(time.perf_counter() - start)
        rows.append({"mixer": kind, "t": t, "s_per_token": sorted(times)[len(times) // 2],
                     "state_bytes": held})
    return rows
