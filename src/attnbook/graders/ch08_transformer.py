"""Chapter 8 (the Transformer): the graders of the pre-LN encoder block, of the parameter count
and of the next-token prediction."""
from __future__ import annotations

import torch

from ..transformer import EncoderBlock, Transformer, TransformerConfig
from ..batching import lengths_mask
from .core import Hint, expect_close, expect_pair, expect_shape, grader


def _ch08_pre_ln_block(d_model: int, h: int, d_ff: int):
    """A pre-LN EncoderBlock in eval mode whose two LayerNorms have different, non-trivial weights."""
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
        src_mask = None if lengths is None else lengths_mask(lengths, S)
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

