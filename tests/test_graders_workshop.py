"""The graders of the workshop (notebooks/14_workshop): each passes a correct answer written like
the package's, passes a correct answer in another style (loops, einsum, float64), and fails each
typical mistake with the hint that names it. (tests/test_homework.py checks the notebook's own
solutions and stubs.)"""
import math

import pytest
import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU

from attnbook import BOS_ID, EOS_ID, PAD_ID
from attnbook.attention import causal_mask, scaled_dot_product_attention
from attnbook.bleu import bleu
from attnbook.graders import workshop, workshop_blocks
from attnbook.batching import translation_loss
from graderkit import assert_fails, assert_registered, grade, stub

LABELS = {"ex-14-beam-search": "beam_search", "ex-14-decoder-block": "decoder_block",
          "ex-14-train-step": "train_step", "ex-14-kv-cache": "decode_step",
          "ex-14-bug-mask-fill": "masked_weights", "ex-14-bug-padding-axis": "padded_attention",
          "ex-14-bug-causal-leak": "lm_mask", "ex-14-bug-corpus-bleu": "corpus_bleu",
          "ex-14-bug-log-zero": "label_smoothed_loss"}


def test_graders_are_registered_with_their_targets():
    assert_registered(LABELS)


@pytest.mark.parametrize("label", LABELS)
def test_a_stub_fails(label):
    assert_fails(label, stub, "not implemented yet", LABELS[label])


# --- beam search ----------------------------------------------------------------------------

def beam_loops(log_probs, k, max_len, alpha, *, mistake=None):
    """Beam search in plain Python (float64 sums), one hypothesis per list entry."""
    pen = (lambda n: 1.0) if mistake == "no-penalty" else (lambda n: ((5 + n) / 6) ** alpha)
    alive, best = [(0.0, [BOS_ID])] * (k if mistake == "k-copies" else 1), None
    for t in range(1, max_len + 1):
        rows = log_probs(torch.tensor([h for _, h in alive])).double().tolist()
        cands = sorted([(s + lp, h + [v]) for (s, h), row in zip(alive, rows)
                        for v, lp in enumerate(row)], key=lambda c: -c[0])[:2 * k]
        for s, h in cands[:k]:
            n_pen = t - 1 if mistake == "no-eos-in-length" else t
            if h[-1] == EOS_ID and (best is None or s / pen(n_pen) > best[0]):
                best = (s / pen(n_pen), h[1:-1])
        pool = cands[:k] if mistake == "eos-slots" else cands
        alive = [c for c in pool if c[1][-1] != EOS_ID][:k]
        if best and (mistake == "first-eos" or not alive
                     or best[0] >= alive[0][0] / pen(max_len + 1)):
            break
    return (best[1], best[0]) if best else (alive[0][1][1:], alive[0][0] / pen(max_len))


def test_beam_search_reference_and_loops_pass():
    assert grade("ex-14-beam-search", workshop.reference_beam_search).passed
    result = grade("ex-14-beam-search", beam_loops)
    assert result.passed, result.message


def test_the_toy_beam_cases_agree_with_the_loops_and_exercise_the_length_penalty():
    for seed, k, max_len, alpha, eos_bias in workshop.BEAM_CASES:
        lp = workshop.markov_log_probs(seed, max_len=max_len, eos_bias=eos_bias)
        tokens, score = workshop.reference_beam_search(lp, k, max_len, alpha)
        assert (tokens, round(score, 4)) == (lambda r: (r[0], round(r[1], 4)))(
            beam_loops(lp, k, max_len, alpha))
        assert EOS_ID not in tokens and BOS_ID not in tokens


@pytest.mark.parametrize("mistake,fragment", [
    ("no-penalty", "length penalty is missing"), ("eos-slots", "keep their places in the beam"),
    ("first-eos", "stops at the first finished"), ("no-eos-in-length", "EOS included"),
    ("k-copies", "k copies of BOS")])
def test_beam_search_mistakes_get_their_hint(mistake, fragment):
    assert_fails("ex-14-beam-search", lambda *a: beam_loops(*a, mistake=mistake), fragment)


def test_beam_search_format_mistakes():
    assert_fails("ex-14-beam-search", lambda *a: beam_loops(*a)[0], "return a tuple")
    assert_fails("ex-14-beam-search",
                 lambda *a: (lambda t, s: ([BOS_ID, *t, EOS_ID], s))(*beam_loops(*a)),
                 "without BOS and EOS")
    assert_fails("ex-14-beam-search", lambda *a: (beam_loops(*a)[0], 0.0), "but the score")


# --- a whole decoder block ------------------------------------------------------------------

def decoder_block(block, x, memory, tgt_mask, src_mask, *, mistake=None):
    """The notebook's style: heads by view/transpose, attention.scaled_dot_product_attention."""
    def attend(attn, z, context, mask):
        B, T, d = z.shape
        heads = lambda y: y.view(B, -1, attn.h, d // attn.h).transpose(1, 2)  # noqa: E731
        out, _ = scaled_dot_product_attention(heads(attn.W_q(z)), heads(attn.W_k(context)),
                                              heads(attn.W_v(context)), mask=mask)
        return attn.W_o(out.transpose(1, 2).reshape(B, T, d))
    self_mask = None if mistake == "no-causal" else causal_mask(x.shape[1])
    if tgt_mask is not None:
        pad = tgt_mask[:, None, None, :]
        self_mask = pad if self_mask is None else self_mask & pad
    cross_mask = None if src_mask is None or mistake == "no-src-mask" \
        else src_mask[:, None, None, :]
    if mistake == "pre-ln":
        x = x + attend(block.self_attn, block.norm1(x), block.norm1(x), self_mask)
        x = x + attend(block.cross_attn, block.norm2(x), memory, cross_mask)
        return x + block.ff(block.norm3(x))
    x = block.norm1(x + attend(block.self_attn, x, x, self_mask))
    x = block.norm2(x + attend(block.cross_attn, x, memory, cross_mask))
    return block.norm3(x + block.ff(x))


def decoder_block_einsum(block, x, memory, tgt_mask, src_mask, *, mistake=None):
    """Another style: einsum over explicit heads, -inf fill and softmax, in float64 inside."""
    def attend(attn, z, context, mask):
        h = attn.h
        def w(lin, y):
            return F.linear(y.double(), lin.weight.double(), lin.bias.double())
        split = lambda y: y.unflatten(-1, (h, -1))                   # (B, L, h, d_k)  # noqa: E731
        if mistake == "heads-view":
            split = lambda y: y.reshape(y.shape[0], h, y.shape[1], -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(w(attn.W_q, z)), split(w(attn.W_k, context)), split(w(attn.W_v, context))
        scale = 1.0 if mistake == "no-scale" else q.shape[-1] ** -0.5
        scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).flatten(2)
        return w(attn.W_o, out).to(z.dtype)
    T = x.shape[1]
    self_mask = torch.ones(T, T, dtype=torch.bool).tril()
    if tgt_mask is not None:
        self_mask = self_mask & tgt_mask[:, None, None, :]
    cross_mask = None if src_mask is None else src_mask[:, None, None, :]
    if mistake == "cross-reads-x":
        memory, cross_mask = x, None if tgt_mask is None else tgt_mask[:, None, None, :]
    if mistake == "residual-after-norm":
        x = block.norm1(attend(block.self_attn, x, x, self_mask)) + x
        x = block.norm2(attend(block.cross_attn, x, memory, cross_mask)) + x
        return block.norm3(block.ff(x)) + x
    if mistake == "no-residual":
        x = block.norm1(attend(block.self_attn, x, x, self_mask))
        x = block.norm2(attend(block.cross_attn, x, memory, cross_mask))
        return block.norm3(block.ff(x))
    x = block.norm1(x + attend(block.self_attn, x, x, self_mask))
    x = block.norm2(x + attend(block.cross_attn, x, memory, cross_mask))
    return block.norm3(x + block.ff(x))


def test_decoder_block_reference_and_einsum_pass():
    for fn in (decoder_block, decoder_block_einsum):
        result = grade("ex-14-decoder-block", fn)
        assert result.passed, result.message


def test_the_graders_written_out_block_is_the_package_block():
    cfg = workshop_blocks.TransformerConfig(vocab_size=9, d_model=8, h=2, d_ff=16, dropout=0.0)
    block = workshop_blocks.DecoderBlock(cfg).eval()
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    tgt_mask = workshop_blocks.lengths_mask([4, 2], 4)
    src_mask = workshop_blocks.lengths_mask([3, 1], 3)
    with torch.no_grad():
        assert torch.allclose(workshop_blocks._decoder_block(block, x, memory, tgt_mask, src_mask),
                              block(x, memory, tgt_mask, src_mask), atol=1e-5)


@pytest.mark.parametrize("fn,mistake,fragment", [
    (decoder_block, "no-causal", "no causal mask"), (decoder_block, "pre-ln", "this is pre-LN"),
    (decoder_block, "no-src-mask", "ignores src_mask"),
    (decoder_block_einsum, "no-scale", "sqrt(d_k)"),
    (decoder_block_einsum, "heads-view", "view(B, L, h, d_k).transpose(1, 2)"),
    (decoder_block_einsum, "residual-after-norm", "added after the LayerNorm"),
    (decoder_block_einsum, "no-residual", "residual connections are missing"),
    (decoder_block_einsum, "cross-reads-x", "from x")])
def test_decoder_block_mistakes_get_their_hint(fn, mistake, fragment):
    assert_fails("ex-14-decoder-block", lambda *a: fn(*a, mistake=mistake), fragment)


def test_decoder_block_may_not_call_the_packages_attention():
    assert_fails("ex-14-decoder-block", lambda block, *a: block(*a), "do not call block(...)")
    assert_fails("ex-14-decoder-block",
                 lambda b, x, m, tm, sm: b.norm3(x + b.ff(b.norm2(x + b.cross_attn(x, m)[0]))),
                 "do not call block.cross_attn")


# --- one training step ----------------------------------------------------------------------

def train_step(model, batch, optimizer, scheduler, clip=1.0, label_smoothing=0.1, *, mistake=None):
    return workshop.reference_train_step(model, batch, optimizer, scheduler, clip,
                                         label_smoothing, mistake=mistake)


def train_step_by_hand(model, batch, optimizer, scheduler, clip=1.0, label_smoothing=0.1):
    """Another style: the smoothed loss written out in float64, gradients cleared by setting them
    to None, clipping by hand."""
    model.train()
    for p in model.parameters():
        p.grad = None
    logp = model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask).double().log_softmax(-1)
    real = batch.tgt_out != PAD_ID
    nll = -logp.gather(-1, batch.tgt_out[..., None])[..., 0]
    loss = (((1 - label_smoothing) * nll - label_smoothing * logp.mean(-1))[real]).mean()
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()
                          if p.grad is not None))
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(min(1.0, clip / (float(norm) + 1e-6)))
    optimizer.step()
    scheduler.step()
    return float(loss)


def test_train_step_reference_and_by_hand_pass():
    for fn in (train_step, train_step_by_hand):
        result = grade("ex-14-train-step", fn)
        assert result.passed, result.message


@pytest.mark.parametrize("mistake,fragment", [
    ("pad-in-mean", "averaged over PAD"), ("no-zero-grad", "optimizer.zero_grad()"),
    ("no-clip", "not clipped"), ("no-train", "model.train()"),
    ("no-scheduler", "scheduler.step()")])
def test_train_step_mistakes_get_their_hint(mistake, fragment):
    assert_fails("ex-14-train-step", lambda *a: train_step(*a, mistake=mistake), fragment)


def test_train_step_returns_a_float():
    def returns_tensor(model, batch, optimizer, scheduler, clip=1.0, label_smoothing=0.1):
        model.train()
        optimizer.zero_grad()
        loss = translation_loss(model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask),
                                batch.tgt_out, label_smoothing)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        return loss
    assert_fails("ex-14-train-step", returns_tensor, "loss.item()")


# --- the key/value cache of a whole decoder -------------------------------------------------

def decode_step(model, new_ids, memory, src_mask, cache, *, mistake=None):
    """The notebook's style: per-layer dicts of (B, h, t, d_k) keys and values."""
    t = cache.get("length", 0)
    x = model.embed_tokens(new_ids, offset=0 if mistake == "no-offset" else t)   # (B, 1, d)
    B, d = x.shape[0], x.shape[2]

    def attend(attn, q, k, v, mask):
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
        return attn.W_o(out.transpose(1, 2).reshape(B, -1, d))
    for i, block in enumerate(model.decoder):
        layer, a, c = cache.setdefault(i, {}), block.self_attn, block.cross_attn
        heads = a.split_heads
        k, v = heads(a.W_k(x)), heads(a.W_v(x))
        if "k" in layer and mistake != "no-append":
            k, v = torch.cat([layer["k"], k], 2), torch.cat([layer["v"], v], 2)
        layer["k"], layer["v"] = k, v
        x = block.norm1(x + attend(a, heads(a.W_q(x)), k, v, None))
        if "mk" not in layer:
            layer["mk"], layer["mv"] = heads(c.W_k(memory)), heads(c.W_v(memory))
        x = block.norm2(x + attend(c, heads(c.W_q(x)), layer["mk"], layer["mv"],
                                   src_mask[:, None, None, :]))
        x = block.norm3(x + block.ff(x))
    cache["length"] = t + 1
    return model.out(model.dec_norm(x))[:, -1]


def decode_step_einsum(model, new_ids, memory, src_mask, cache):
    """Another style: a list of (K, V) per layer in (B, t, h, d_k) layout, einsum, no modules
    called for the projections."""
    t = len(cache["kv"][0][0]) if cache else 0
    x = model.embed_tokens(new_ids, offset=t)[:, 0]                             # (B, d)
    cache.setdefault("kv", [[[], []] for _ in model.decoder])
    cache.setdefault("mem", [None] * len(model.decoder))
    lin = lambda m, y: y @ m.weight.T + m.bias                                  # noqa: E731

    def attend(attn, q, K, V, mask):
        h = attn.h
        qh = q.unflatten(-1, (h, -1))                                           # (B, h, d_k)
        s = torch.einsum("bhd,bshd->bhs", qh, K) / math.sqrt(qh.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask[:, None, :], float("-inf"))
        return lin(attn.W_o, torch.einsum("bhs,bshd->bhd", s.softmax(-1), V).flatten(1))
    for i, block in enumerate(model.decoder):
        a, c = block.self_attn, block.cross_attn
        ks, vs = cache["kv"][i]
        ks.append(lin(a.W_k, x).unflatten(-1, (a.h, -1)))
        vs.append(lin(a.W_v, x).unflatten(-1, (a.h, -1)))
        x = block.norm1(x + attend(a, lin(a.W_q, x), torch.stack(ks, 1), torch.stack(vs, 1), None))
        if cache["mem"][i] is None:
            cache["mem"][i] = (lin(c.W_k, memory).unflatten(-1, (c.h, -1)),
                               lin(c.W_v, memory).unflatten(-1, (c.h, -1)))
        x = block.norm2(x + attend(c, lin(c.W_q, x), *cache["mem"][i], src_mask))
        x = block.norm3(x + block.ff(x))
    return model.out(model.dec_norm(x))


def test_decode_step_reference_and_einsum_pass():
    for fn in (decode_step, decode_step_einsum):
        result = grade("ex-14-kv-cache", fn)
        assert result.passed, result.message


@pytest.mark.parametrize("mistake,fragment", [("no-offset", "position 0"),
                                              ("no-append", "attends only to itself")])
def test_decode_step_mistakes_get_their_hint(mistake, fragment):
    assert_fails("ex-14-kv-cache", lambda *a: decode_step(*a, mistake=mistake), fragment)


def test_decode_step_must_cache_and_may_not_borrow_the_packages_cache():
    def uncached(model, new_ids, memory, src_mask, cache):
        cache["ids"] = torch.cat([cache["ids"], new_ids], 1) if "ids" in cache else new_ids
        return model.decode(cache["ids"], memory, src_mask)[:, -1]

    def borrowed(model, new_ids, memory, src_mask, cache):
        return model.decode(new_ids, memory, src_mask, cache=cache)[:, -1]
    assert_fails("ex-14-kv-cache", uncached, "computed again")
    assert_fails("ex-14-kv-cache", borrowed, "passed cache=")
    assert_fails("ex-14-kv-cache", lambda *a: decode_step(*a)[:, None], "expected shape")


# --- the bug gallery ------------------------------------------------------------------------

def masked_weights(scores, mask, *, fill=float("-inf")):
    return scores.masked_fill(~mask, fill).softmax(-1)


def padded_attention(q, k, v, key_mask, *, axis=1, fill=float("-inf")):
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])                     # (B, T, S)
    mask = key_mask[:, None, :] if axis == 1 else key_mask[:, :, None]
    return scores.masked_fill(~mask, fill).softmax(-1) @ v


def padded_attention_einsum(q, k, v, key_mask):
    scores = torch.einsum("btd,bsd->bts", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~key_mask.unsqueeze(1), torch.finfo(q.dtype).min)
    return torch.einsum("bts,bsd->btd", scores.softmax(-1), v)


def lm_mask(T, *, diagonal=0):
    return torch.ones(T, T, dtype=torch.bool).tril(diagonal)


def corpus_bleu(hyps, refs):
    return BLEU().corpus_score(hyps, [refs]).score


def label_smoothed_loss(logits, tgt_out, eps):
    return translation_loss(logits, tgt_out, eps)


def label_smoothed_loss_by_hand(logits, tgt_out, eps):
    logp = logits.double().log_softmax(-1)
    real = tgt_out != PAD_ID
    per_token = -(1 - eps) * logp.gather(-1, tgt_out[..., None])[..., 0] - eps * logp.mean(-1)
    return per_token[real].sum() / real.sum()


def label_smoothed_loss_buggy(logits, tgt_out, eps, *, clamp=False, all_positions=False):
    probs = logits.softmax(-1)
    if clamp:
        probs = probs.clamp_min(1e-9)
    V = logits.shape[-1]
    target = torch.full_like(probs, eps / V).scatter(-1, tgt_out[..., None], 1 - eps + eps / V)
    per_token = -(target * probs.log()).sum(-1)
    real = torch.ones_like(tgt_out, dtype=torch.bool) if all_positions else tgt_out != PAD_ID
    return per_token[real].mean()


@pytest.mark.parametrize("label,fn", [
    ("ex-14-bug-mask-fill", masked_weights),
    ("ex-14-bug-mask-fill", lambda s, m: masked_weights(s, m, fill=-1e9)),
    ("ex-14-bug-mask-fill", lambda s, m: masked_weights(s, m, fill=torch.finfo(s.dtype).min)),
    ("ex-14-bug-padding-axis", padded_attention),
    ("ex-14-bug-padding-axis", padded_attention_einsum),
    ("ex-14-bug-causal-leak", lm_mask),
    ("ex-14-bug-causal-leak", lambda T: torch.arange(T)[None, :] <= torch.arange(T)[:, None]),
    ("ex-14-bug-corpus-bleu", corpus_bleu),
    ("ex-14-bug-corpus-bleu", lambda h, r: bleu(h, r)["bleu"]),
    ("ex-14-bug-log-zero", label_smoothed_loss),
    ("ex-14-bug-log-zero", label_smoothed_loss_by_hand)])
def test_gallery_fixes_pass(label, fn):
    result = grade(label, fn)
    assert result.passed, result.message


def mean_sentence_bleu(hyps, refs):
    return sum(corpus_bleu([h], [r]) for h, r in zip(hyps, refs)) / len(hyps)


@pytest.mark.parametrize("label,fn,fragment", [
    ("ex-14-bug-mask-fill", lambda s, m: masked_weights(s, m, fill=-1e-12),
     "-1e-12 is almost zero"),
    ("ex-14-bug-mask-fill", lambda s, m: masked_weights(s, ~m), "inverted"),
    ("ex-14-bug-mask-fill", lambda s, m: s.softmax(-1) * m, "zeroed after the softmax"),
    ("ex-14-bug-mask-fill", lambda s, m: s.masked_fill_(~m, float("-inf")).softmax(-1), "in place"),
    ("ex-14-bug-padding-axis", lambda *a: padded_attention(*a, axis=2), "query axis"),
    ("ex-14-bug-padding-axis", lambda *a: padded_attention(*a, axis=2, fill=-1e9), "query axis"),
    ("ex-14-bug-causal-leak", lambda T: lm_mask(T, diagonal=1), "off by one"),
    ("ex-14-bug-causal-leak", lambda T: lm_mask(T).T, "upper triangle"),
    ("ex-14-bug-causal-leak", lambda T: ~lm_mask(T), "inverted"),
    ("ex-14-bug-causal-leak", lambda T: lm_mask(T).float(), "bool"),
    ("ex-14-bug-corpus-bleu", mean_sentence_bleu, "mean of the sentences' scores"),
    ("ex-14-bug-corpus-bleu", lambda h, r: corpus_bleu(h, r) / 100, "0..100 scale"),
    ("ex-14-bug-corpus-bleu", lambda h, r: BLEU(tokenize="none").corpus_score(h, [r]).score,
     "13a"),
    ("ex-14-bug-log-zero", label_smoothed_loss_buggy, "log(0)"),
    ("ex-14-bug-log-zero", lambda *a: label_smoothed_loss_buggy(*a, clamp=True), "clamping"),
    ("ex-14-bug-log-zero", lambda lg, t, eps: F.cross_entropy(lg.flatten(0, 1), t.flatten(),
                                                              label_smoothing=eps),
     "PAD position too"),
    ("ex-14-bug-log-zero", lambda *a: label_smoothed_loss(*a).item(), "0-dimensional tensor"),
    ("ex-14-bug-log-zero", lambda *a: label_smoothed_loss(*a).detach(), "detached")])
def test_gallery_bugs_and_half_fixes_get_their_hint(label, fn, fragment):
    assert_fails(label, fn, fragment)

