"""Chapter 1 (the encoder-decoder bottleneck): the grader of the padded GRU encoder."""
from __future__ import annotations

import torch

from ..batching import lengths_mask
from .core import Hint, expect_close, expect_pair, expect_shape, grader


def _ref_gru_encode(x, mask, cell):
    """Reference: run ``cell`` over (B, S, I); state frozen at padding; H zero at padding."""
    B, S, _ = x.shape
    h = torch.zeros(B, cell.hidden_size, dtype=x.dtype)
    H = []
    for i in range(S):
        h = torch.where(mask[:, i, None], cell(x[:, i], h), h)
        H.append(h * mask[:, i, None])
    return torch.stack(H, 1), h


@grader("ex-01-gru-encode", target="gru_encode")
def check_gru_encode(fn):
    """Checks ``gru_encode(x, mask, cell) -> (H, h_last)`` on full and padded batches."""
    n = 0
    cases = [("a full batch (no padding)", [5, 5, 5], 5),
             ("a padded batch with lengths [5, 2, 1]", [5, 2, 1], 5),
             ("a batch of 1 sequence of length 1", [1], 1),
             ("a padded batch with lengths [2, 4]", [2, 4], 4)]
    for what, lengths, S in cases:
        B, I, Hd = len(lengths), 3, 4
        cell = torch.nn.GRUCell(I, Hd)
        x = torch.randn(B, S, I)
        mask = lengths_mask(lengths, S)
        with torch.no_grad():
            H_ref, h_ref = _ref_gru_encode(x, mask, cell)
            got = fn(x.clone(), mask.clone(), cell)
        expect_pair(got, "(H, h_last)", what)
        H, h_last = got
        expect_shape(H, (B, S, Hd), f"H on {what} (x of shape {(B, S, I)}, hidden size {Hd})")
        expect_shape(h_last, (B, Hd), f"h_last on {what}")
        pad = ~mask
        if pad.any() and H[pad].abs().max() > 0:
            b, i = (torch.nonzero(pad & (H.abs().amax(-1) > 0))[0]).tolist()
            raise Hint(f"on {what}: H[{b}, {i}] is a padded position (sequence {b} has "
                       f"{lengths[b]} real tokens) and must be all zeros, like the output of "
                       f"pad_packed_sequence; got a nonzero vector")
        expect_close(H, H_ref, f"H on {what}")
        n += 1
        b_bad = [b for b in range(B) if not torch.allclose(h_last[b], h_ref[b], atol=1e-5)]
        if b_bad:
            b = b_bad[0]
            zero = " (it is all zeros: did you take H[:, -1], which is padding?)" \
                if lengths[b] < S and not h_last[b].any() else ""
            raise Hint(f"on {what}: h_last[{b}] should be the state after token {lengths[b]} of "
                       f"sequence {b} (its last real token), i.e. H[{b}, {lengths[b] - 1}]; "
                       f"largest difference {(h_last[b] - h_ref[b]).abs().max().item():.3g}{zero}")
        n += 1
    return n

