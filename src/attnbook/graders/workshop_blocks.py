"""The workshop (notebooks/14_workshop), part 1 continued: the graders of a whole decoder block
and of the key/value cache of a whole decoder.

Both compare the reader's code with the package's (transformer.DecoderBlock, Transformer.decode
without a cache) on small random cases, in float32 and float64, so that any correct style passes
(einsum, loops, another dtype). Forward hooks refuse the package's own attention (or its cache),
which is what the exercises write out. When an answer is wrong the grader recomputes the typical
mistakes and names the one the answer matches.
"""
from __future__ import annotations

import math

import torch

from .. import BOS_ID
from ..attention import causal_mask, masked_softmax
from ..transformer import DecoderBlock, Transformer, TransformerConfig
from ..batching import lengths_mask
from .core import Hint, expect_close, expect_shape, grader

# ---------------------------------------------------------------------------------------------
# A whole decoder block


def _attend(attn, x, context, mask, *, scale=True, heads_view=False):
    """Multi-head attention from the weights of ``attn``; mask (B or 1, 1, T, S) or None."""
    B, T, d = x.shape
    S, h = context.shape[1], attn.h

    def split(z, L):
        return z.view(B, h, L, d // h) if heads_view else z.view(B, L, h, d // h).transpose(1, 2)
    q, k, v = split(attn.W_q(x), T), split(attn.W_k(context), S), split(attn.W_v(context), S)
    scores = q @ k.transpose(-2, -1) / (math.sqrt(d // h) if scale else 1.0)  # (B, h, T, S)
    out = masked_softmax(scores, mask) @ v                                     # (B, h, T, d_k)
    return attn.W_o(out.transpose(1, 2).reshape(B, T, d))


def _decoder_block(block, x, memory, tgt_mask, src_mask, mistake=None):
    """DecoderBlock (post-LN, eval) written out, or with one typical mistake."""
    T = x.shape[1]
    self_mask = causal_mask(T, device=x.device) if mistake != "no-causal" else None
    if tgt_mask is not None:
        pad = tgt_mask[:, None, None, :]
        self_mask = pad if self_mask is None else pad & self_mask
    cross_mask = src_mask[:, None, None, :] if src_mask is not None and \
        mistake != "no-src-mask" else None
    kw = dict(scale=mistake != "no-scale", heads_view=mistake == "heads-view")
    context = x if mistake == "cross-reads-x" else memory
    if mistake == "cross-reads-x" and tgt_mask is not None:
        cross_mask = tgt_mask[:, None, None, :]
    subs = [lambda z: _attend(block.self_attn, z, z, self_mask, **kw),
            lambda z: _attend(block.cross_attn, z, context, cross_mask, **kw), block.ff]
    for sub, norm in zip(subs, (block.norm1, block.norm2, block.norm3)):
        if mistake == "pre-ln":
            x = x + sub(norm(x))
        elif mistake == "residual-after-norm":
            x = norm(sub(x)) + x
        elif mistake == "no-residual":
            x = norm(sub(x))
        else:
            x = norm(x + sub(x))
    return x


BLOCK_MISTAKES = {
    "no-causal": "the self-attention has no causal mask: target position t sees the later target "
                 "tokens, which it must predict; combine tgt_mask with causal_mask(T)",
    "pre-ln": "this is pre-LN, x + Sublayer(LayerNorm(x)); the block (norm_first=False) is the "
              "paper's post-LN: x = LayerNorm(x + Sublayer(x))",
    "residual-after-norm": "the residual is added after the LayerNorm, LayerNorm(Sublayer(x)) + x; "
                           "post-LN normalises the sum: x = LayerNorm(x + Sublayer(x))",
    "no-residual": "the residual connections are missing: x = LayerNorm(x + Sublayer(x))",
    "no-src-mask": "the cross-attention ignores src_mask: padded source positions get weight; "
                   "mask the keys of the memory with src_mask",
    "no-scale": "the scores are not divided by sqrt(d_k), d_k = d_model / h",
    "heads-view": "the heads are split with view(B, h, L, d_k), which mixes positions and "
                  "heads; split with view(B, L, h, d_k).transpose(1, 2)",
    "cross-reads-x": "the cross-attention takes its keys and values from x; they come from "
                     "the encoder's output, memory",
}


def _forbid(module, what):
    """A pre-hook that fails when ``module`` is called: the exercise writes it out."""
    def hook(mod, args, kwargs):
        raise Hint(f"do not call {what}: this exercise writes it out from the weights W_q, "
                   "W_k, W_v, W_o (and the LayerNorms and block.ff)")
    return module.register_forward_pre_hook(hook, with_kwargs=True)


@grader("ex-14-decoder-block", target="decoder_block")
def check_decoder_block(fn):
    """Checks ``decoder_block(block, x, memory, tgt_mask, src_mask) -> (B, T, d_model)`` against
    DecoderBlock (post-LN, eval mode) at the real target positions."""
    n = 0
    cases = [("x (2, 5, 16), memory (2, 4, 16), h=4, target lengths [5, 3], source [4, 2]",
              16, 4, [5, 3], [4, 2], torch.float32),
             ("x (1, 1, 8), memory (1, 3, 8), h=2, one target token", 8, 2, [1], [3],
              torch.float32),
             ("float64, x (2, 4, 16), memory (2, 6, 16), h=2, source lengths [6, 3]", 16, 2,
              [4, 4], [6, 3], torch.float64),
             ("x (2, 3, 8), memory (2, 5, 8), h=2, tgt_mask = src_mask = None", 8, 2, None, None,
              torch.float32)]
    for what, d, h, t_len, s_len, dtype in cases:
        cfg = TransformerConfig(vocab_size=10, d_model=d, h=h, d_ff=2 * d, n_layers=1, dropout=0.0)
        block = DecoderBlock(cfg).to(dtype).eval()
        with torch.no_grad():
            for norm in (block.norm1, block.norm2, block.norm3):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.3)
        B = 2 if t_len is None else len(t_len)
        T, S = (3, 5) if t_len is None else (max(t_len), max(s_len))
        tgt_mask = None if t_len is None else lengths_mask(t_len, T)
        src_mask = None if s_len is None else lengths_mask(s_len, S)
        x, memory = torch.randn(B, T, d, dtype=dtype), torch.randn(B, S, d, dtype=dtype)
        with torch.no_grad():
            expected = block(x, memory, tgt_mask, src_mask)
            hooks = [_forbid(block, "block(...)"), _forbid(block.self_attn, "block.self_attn"),
                     _forbid(block.cross_attn, "block.cross_attn")]
            try:
                got = fn(block, x.clone(), memory.clone(), tgt_mask, src_mask)
            finally:
                for hk in hooks:
                    hk.remove()
        on = f"decoder_block on {what}"
        expect_shape(got, expected.shape, on)
        real = torch.ones(B, T, dtype=torch.bool) if tgt_mask is None else tgt_mask
        if torch.allclose(got[real], expected[real], atol=1e-5, rtol=1e-4):
            n += 1
            continue
        with torch.no_grad():
            for mistake, message in BLOCK_MISTAKES.items():
                wrong = _decoder_block(block, x, memory, tgt_mask, src_mask, mistake)
                if not torch.allclose(wrong[real], expected[real], atol=1e-5, rtol=1e-4) and \
                        torch.allclose(got[real], wrong[real], atol=1e-5, rtol=1e-4):
                    raise Hint(f"{on}: {message}")
        expect_close(got[real], expected[real], f"{on}, at the real target positions "
                     "(x = LayerNorm(x + Sublayer(x)) for self-attention, cross-attention, FFN)")
    return n


# ---------------------------------------------------------------------------------------------
# The key/value cache of a whole decoder


def _watch(model, record):
    """Hooks: fail if the package's cache is used, record how many positions get new keys."""
    def no_cache(mod, args, kwargs):
        if kwargs.get("cache") is not None:
            raise Hint("you passed cache= to the package's decoder (DecoderBlock or "
                       "MultiHeadAttention): that cache is what this exercise writes; keep your "
                       "own keys and values in the dict `cache`")
    hooks = []
    for block in model.decoder:
        for m in (block, block.self_attn, block.cross_attn):
            hooks.append(m.register_forward_pre_hook(no_cache, with_kwargs=True))
        hooks.append(block.self_attn.W_k.register_forward_hook(
            lambda mod, args, out: record.append(args[0].shape[1])))
    return hooks


@grader("ex-14-kv-cache", target="decode_step")
def check_decode_step(fn):
    """Checks ``decode_step(model, new_ids, memory, src_mask, cache) -> logits (B, V)`` step by
    step against ``model.decode`` on the whole prefix (no cache)."""
    n = 0
    for what, seed, B, S, T, dtype in [
            ("B=2, S=5 with padding, 6 steps", 0, 2, 5, 6, torch.float32),
            ("B=1, S=1, 3 steps", 1, 1, 1, 3, torch.float32),
            ("float64, B=3, S=4, 5 steps", 2, 3, 4, 5, torch.float64)]:
        torch.manual_seed(seed)
        model = Transformer(TransformerConfig(vocab_size=13, d_model=16, h=2, d_ff=32, n_layers=2,
                                              dropout=0.0, max_len=32)).to(dtype).eval()
        src = torch.randint(4, 13, (B, S))
        src_mask = lengths_mask([S] + [max(1, S - 2 - b) for b in range(B - 1)], S)
        ids = torch.cat([torch.full((B, 1), BOS_ID), torch.randint(4, 13, (B, T - 1))], 1)
        cache, record, variants = {}, [], {"no-offset": {}, "no-append": {}}
        with torch.no_grad():
            memory = model.encode(src, src_mask)
            for t in range(T):
                expected = model.decode(ids[:, :t + 1], memory, src_mask)[:, -1]   # (B, V)
                record.clear()
                hooks = _watch(model, record)
                try:
                    got = fn(model, ids[:, t:t + 1].clone(), memory, src_mask, cache)
                finally:
                    for hk in hooks:
                        hk.remove()
                wrong = {}
                for name, c in variants.items():   # the package's cache, with one mistake
                    if c and name == "no-offset":
                        c["length"] = 0
                    if c and name == "no-append":
                        for layer in c["layers"]:
                            layer["self"] = {}
                    wrong[name] = model.decode(ids[:, t:t + 1], memory, src_mask, cache=c)[:, -1]
                on = f"decode_step on {what}, step {t + 1} (new_ids = ids[:, {t}:{t + 1}])"
                expect_shape(got, (B, expected.shape[-1]), f"{on}: the logits of the new token")
                if t > 0 and record and max(record) > 1:
                    raise Hint(f"{on}: the keys of all {t + 1} positions were computed again: "
                               "store each layer's keys and values in the cache and compute "
                               "them for the new token only")
                if torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
                    continue
                if torch.allclose(got, wrong["no-offset"], atol=1e-5, rtol=1e-4):
                    raise Hint(f"{on}: the new token gets position 0: its positional encoding "
                               "needs the offset, the number of positions already decoded "
                               "(model.embed_tokens(new_ids, offset=...))")
                if torch.allclose(got, wrong["no-append"], atol=1e-5, rtol=1e-4):
                    raise Hint(f"{on}: the new token attends only to itself: append its keys and "
                               "values to those of the earlier positions in each layer's cache")
                expect_close(got, expected, f"{on}: expected model.decode(ids[:, :{t + 1}], "
                             "memory, src_mask)[:, -1]")
            n += 1
    return n
