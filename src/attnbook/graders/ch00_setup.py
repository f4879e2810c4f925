"""Chapter 0 (setting up): the grader of the padding exercise."""
from __future__ import annotations

import torch

from ..batching import pad as reference
from .core import Hint, expect_pair, expect_shape, grader


@grader("ex-00-pad", target="pad_batch")
def check_pad_batch(pad_batch):
    """Checks ``pad_batch(seqs, pad_id=0) -> (ids, mask)``, both (B, L): ids long, padded with
    ``pad_id`` on the right; mask bool, True at real tokens."""
    cases = [
        ("three sequences of lengths 3, 1, 2", [[5, 6, 7], [8], [9, 10]], 0),
        ("a batch of one", [[4, 5, 6, 7]], 0),
        ("sequences of length 1", [[9], [4]], 0),
        ("equal lengths (no padding at all)", [[4, 5], [6, 7]], 0),
        ("pad_id=99", [[5, 6, 7], [8]], 99),
    ]
    g = torch.Generator().manual_seed(0)
    for n in (2, 8, 32):
        lengths = torch.randint(1, 20, (n,), generator=g).tolist()
        seqs = [torch.randint(4, 1000, (L,), generator=g).tolist() for L in lengths]
        cases.append((f"{n} random sequences of lengths {min(lengths)}..{max(lengths)}", seqs, 0))
    checks = 0
    for what, seqs, pad_id in cases:
        out = pad_batch(seqs, pad_id=pad_id)
        expect_pair(out, "(ids, mask)", what)
        ids, mask = out
        exp_ids, exp_mask = reference(seqs, pad_id=pad_id)
        expect_shape(ids, exp_ids.shape, f"ids on {what}")
        expect_shape(mask, exp_mask.shape, f"mask on {what}")
        if ids.dtype != torch.long:
            raise Hint(f"ids on {what}: expected dtype torch.long (embedding layers need it), got {ids.dtype}")
        if mask.dtype != torch.bool:
            raise Hint(f"mask on {what}: expected dtype torch.bool, got {mask.dtype}")
        if not torch.equal(mask, exp_mask):
            b = int(torch.nonzero((mask != exp_mask).any(1))[0])
            raise Hint(f"mask on {what}, row {b}: expected {exp_mask[b].tolist()}, got "
                       f"{mask[b].tolist()} (True at real tokens, False at padding)")
        if not torch.equal(ids, exp_ids):
            b = int(torch.nonzero((ids != exp_ids).any(1))[0])
            raise Hint(f"ids on {what}, row {b}: expected {exp_ids[b].tolist()}, got {ids[b].tolist()}")
        checks += 1
    return checks

