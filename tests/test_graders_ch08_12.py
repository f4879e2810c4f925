"""The graders of chapters 8 to 10 pass the notebooks' reference solutions, fail stubs, and fail
typical mistakes with a hint that names the mistake. (tests/test_ch08.py has more pre-LN block and
parameter-count cases.)"""
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU

from attnbook import BOS_ID, EOS_ID, PAD_ID
from graderkit import assert_fails, assert_registered, grade, stub

LABELS = {"ex-08-pre-ln-block": "pre_ln_encoder_block", "ex-08-param-count": "transformer_params",
          "ex-08-next-token": "next_token", "ex-09-label-smoothing": "smoothed_nll",
          "ex-09-modified-precision": "modified_precision", "ex-09-corpus-bleu": "corpus_bleu",
          "ex-12-top-k": "top_k_filter", "ex-12-temperature": "temperature_softmax",
          "ex-12-prompt-target": "prompt_target", "ex-12-cached-step": "cached_attention_step"}


def test_graders_are_registered_with_their_targets():
    assert_registered(LABELS)


@pytest.mark.parametrize("label", LABELS)
def test_a_stub_fails(label):
    assert_fails(label, stub, "not implemented yet", LABELS[label])


# --- reference solutions (the notebooks' solution cells), with switches for typical mistakes ----

def pre_ln_encoder_block(block, x, src_mask, *, normed_residual=False):
    res = block.norm1(x) if normed_residual else x
    y = res + block.self_attn(block.norm1(x), key_mask=src_mask)[0]      # (B, S, d_model)
    res = block.norm2(y) if normed_residual else y
    return res + block.ff(block.norm2(y))


def transformer_params(V, d_model, h, d_ff, N, tied=True, norm_first=False, *, norms=True,
                       shared=1):
    attn = 4 * d_model * d_model + 4 * d_model
    ff = 2 * d_model * d_ff + d_ff + d_model
    ln = 2 * d_model if norms else 0
    embeddings = V * d_model * ((1 if tied else 2) if shared == 1 else shared)
    return embeddings + N * (attn + ff + 2 * ln + 2 * attn + ff + 3 * ln) + (2 * ln if norm_first
                                                                              else 0)


def next_token(model, src, src_mask, prefix, *, position=-1, log=False):
    with torch.no_grad():
        logits = model(src, src_mask, prefix)                            # (B, T, V)
    probs = logits[:, position].log_softmax(-1) if log else logits[:, position].softmax(-1)
    p, ids = probs.max(dim=-1)
    return ids, p


def smoothed_nll(logits, target, eps, pad_id, *, divide_by_all=False, pad_as_class=False,
                 spread_over_others=False):
    logp = logits.log_softmax(-1)                                        # (B, T, V)
    real = target != pad_id                                              # (B, T)
    if pad_as_class:
        real = torch.ones_like(real)
    nll = -logp.gather(-1, target[..., None]).squeeze(-1)                # (B, T)
    if spread_over_others:
        uniform = -(logp.sum(-1) + nll) / (logits.shape[-1] - 1)
    else:
        uniform = -logp.mean(-1)
    loss = ((1 - eps) * nll + eps * uniform) * real                      # (B, T), 0 at PAD
    return loss.sum() / (target.numel() if divide_by_all else real.sum())


def ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def modified_precision(hyp, ref, n, *, clip=True):
    h, r = ngrams(hyp, n), ngrams(ref, n)
    matches = sum(min(c, r[g]) if clip else c * (g in r) for g, c in h.items())
    return matches, sum(h.values())


def corpus_bleu(hyps, refs, *, scale=100, brevity=True):
    score = BLEU(tokenize="none").corpus_score(hyps, [refs])
    if not brevity:
        return 100 * math.exp(sum(math.log(p / 100) for p in score.precisions) / 4) * scale / 100
    return score.score * scale / 100


def mean_sentence_bleu(hyps, refs):
    return sum(corpus_bleu([h], [r]) for h, r in zip(hyps, refs)) / len(hyps)


def top_k_filter(logits, k, *, fill=float("-inf"), in_place=False, exactly_k=False):
    k = min(k, logits.shape[-1])
    if exactly_k:                # keeps k entries even when several tie with the k-th value
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k).indices, True)
        return logits.masked_fill(~keep, fill)
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill_(logits < kth, fill) if in_place else \
        logits.masked_fill(logits < kth, fill)


def temperature_softmax(logits, tau, *, multiply=False, dim=-1):
    if tau == 0 and not multiply:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return (logits * tau if multiply else logits / tau).softmax(dim=dim)


def prompt_target(src, tgt, *, keep_last=False, no_shift=False, prompt_in_loss=False):
    seq = [BOS_ID, *src, EOS_ID, *tgt, EOS_ID]
    n_prompt = len(src) + 2
    inputs = seq if keep_last else seq[:-1]
    if no_shift:
        return inputs, list(inputs)
    if prompt_in_loss:
        return inputs, seq[1:]
    return inputs, [PAD_ID] * (n_prompt - 1) + seq[n_prompt:]


def cached_attention_step(q, k_new, v_new, cache, *, scale=True, prepend=False, keep_dim=False):
    if "k" in cache:
        pair = (lambda old, new: [new[:, None], old]) if prepend else \
            (lambda old, new: [old, new[:, None]])
        cache["k"] = torch.cat(pair(cache["k"], k_new), dim=1)           # (B, t, d_k)
        cache["v"] = torch.cat(pair(cache["v"], v_new), dim=1)
    else:
        cache["k"], cache["v"] = k_new[:, None], v_new[:, None]          # (B, 1, d_k)
    scores = (cache["k"] @ q[:, :, None])[:, :, 0]                       # (B, t)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    out = scores.softmax(-1)[:, None] @ cache["v"]                       # (B, 1, d_k)
    return out if keep_dim else out[:, 0]


REFERENCES = {"ex-08-pre-ln-block": pre_ln_encoder_block,
              "ex-08-param-count": transformer_params, "ex-08-next-token": next_token,
              "ex-09-label-smoothing": smoothed_nll, "ex-09-modified-precision": modified_precision,
              "ex-09-corpus-bleu": corpus_bleu, "ex-12-top-k": top_k_filter,
              "ex-12-temperature": temperature_softmax, "ex-12-prompt-target": prompt_target,
              "ex-12-cached-step": cached_attention_step}


@pytest.mark.parametrize("label", LABELS)
def test_the_reference_solution_passes(label):
    result = grade(label, REFERENCES[label])
    assert result.passed, result.message


# --- typical mistake -> this hint -----------------------------------------------------------

def switched(fn, **switches):
    return lambda *args, **kwargs: fn(*args, **kwargs, **switches)


@pytest.mark.parametrize("label,wrong,fragments", [
    # chapter 8
    ("ex-08-pre-ln-block", switched(pre_ln_encoder_block, normed_residual=True),
     ["residual path carries LayerNorm(x)"]),
    ("ex-08-pre-ln-block", lambda b, x, m: pre_ln_encoder_block(b, x, m)[:, :1],
     ["expected shape"]),
    ("ex-08-param-count", switched(transformer_params, norms=False), ["LayerNorms are missing"]),
    ("ex-08-param-count", switched(transformer_params, shared=3),
     ["one shared (V, d_model) embedding"]),
    ("ex-08-param-count", lambda V, d, h, d_ff, N, tied=True, norm_first=False:
     transformer_params(V, d, h, d_ff, N, True, norm_first), ["counted once"]),
    ("ex-08-next-token", switched(next_token, position=0), ["you read position 0", "logits[:, -1]"]),
    ("ex-08-next-token", switched(next_token, log=True), ["not probabilities", "softmax"]),
    ("ex-08-next-token", lambda *a: next_token(*a)[::-1], ["expected the ids"]),
    ("ex-08-next-token", lambda *a: next_token(*a)[0], ["return a tuple (ids, probs)"]),
    # chapter 9
    ("ex-09-label-smoothing", switched(smoothed_nll, divide_by_all=True),
     ["averaged over padded positions too", "ignore PAD targets", "number of real tokens"]),
    ("ex-09-label-smoothing", switched(smoothed_nll, pad_as_class=True),
     ["averaged over padded positions too", "number of real tokens"]),
    ("ex-09-label-smoothing", switched(smoothed_nll, spread_over_others=True), ["V - 1"]),
    ("ex-09-label-smoothing", lambda lg, t, eps, pad: smoothed_nll(lg, t, 0.0, pad),
     ["plain cross-entropy"]),
    ("ex-09-label-smoothing", lambda lg, t, eps, pad: smoothed_nll(lg, t, eps, pad).item(),
     ["0-dimensional tensor"]),
    ("ex-09-modified-precision", switched(modified_precision, clip=False),
     ["clip each n-gram's count"]),
    ("ex-09-modified-precision", lambda h, r, n: modified_precision(h, r, n)[0],
     ["return a tuple (matches, total)"]),
    ("ex-09-modified-precision", lambda h, r, n: modified_precision(r, h, n),
     ["expected (matches, total)"]),
    ("ex-09-corpus-bleu", switched(corpus_bleu, scale=1), ["0..100 scale"]),
    ("ex-09-corpus-bleu", switched(corpus_bleu, brevity=False), ["brevity penalty"]),
    ("ex-09-corpus-bleu", mean_sentence_bleu, ["not the mean of sentence BLEUs"]),
    # chapter 12
    ("ex-12-top-k", switched(top_k_filter, in_place=True), ["input logits were changed"]),
    ("ex-12-top-k", switched(top_k_filter, fill=0.0), ["float('-inf')"]),
    ("ex-12-top-k", lambda lg, k: top_k_filter(lg, k).softmax(-1), ["sum to 1", "not probabilities"]),
    ("ex-12-top-k", switched(top_k_filter, exactly_k=True), ["ties", "equal to the k-th largest"]),
    ("ex-12-top-k", lambda lg, k: top_k_filter(lg, k + 1), ["logits kept per row"]),
    ("ex-12-temperature", switched(temperature_softmax, multiply=True), ["multiplied by tau"]),
    ("ex-12-temperature", lambda lg, tau: temperature_softmax(lg, 1.0 if tau else 0),
     ["temperature is missing"]),
    ("ex-12-temperature", lambda lg, tau: (lg / tau).softmax(-1), ["dividing by tau = 0"]),
    ("ex-12-temperature", lambda lg, tau: temperature_softmax(lg, tau, dim=0) if tau else
     temperature_softmax(lg, tau), ["sum to 1 over the last dimension"]),
    ("ex-12-prompt-target", switched(prompt_target, keep_last=True), ["without its last token"]),
    ("ex-12-prompt-target", switched(prompt_target, no_shift=True), ["shift by one"]),
    ("ex-12-prompt-target", switched(prompt_target, prompt_in_loss=True),
     ["kept the prompt in the loss"]),
    ("ex-12-cached-step", switched(cached_attention_step, scale=False), ["sqrt(d_k)"]),
    ("ex-12-cached-step", switched(cached_attention_step, prepend=True), ["*last* row"]),
    ("ex-12-cached-step", switched(cached_attention_step, keep_dim=True), ["not (B, 1, d_k)"]),
    ("ex-12-cached-step", lambda q, k, v, cache: cached_attention_step(q, k, v, {}),
     ["cache must hold"]),
])
def test_typical_mistakes_get_a_hint_that_names_them(label, wrong, fragments):
    assert_fails(label, wrong, *fragments)


def test_a_loss_averaged_over_padding_was_only_told_values_differ_before():
    """The hint names the mistake, where it used to print only the largest difference."""
    message = assert_fails("ex-09-label-smoothing", switched(smoothed_nll, divide_by_all=True))
    assert "values differ" not in message and "with padding" in message


def test_graders_leave_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    for label, fn in REFERENCES.items():
        grade(label, fn)
    assert torch.equal(state, torch.random.get_rng_state())
