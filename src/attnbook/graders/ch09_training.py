"""Chapter 9 (training a translator): the graders of the label-smoothed loss, the modified n-gram
precision and corpus BLEU.

sacreBLEU is imported inside the two BLEU graders, not here: it is in requirements.txt but not a
dependency of the package, and ``import attnbook.graders`` must work wherever the package is
installed alone (chapter 0 on Colab imports it)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import PAD_ID
from ..batching import translation_loss
from .core import Hint, expect_close, expect_pair, grader


# The reference loss is the package's, translation_loss (PAD_ID ignored, eps spread over all V
# tokens, the mean over real tokens): the grader always passes pad_id = PAD_ID.
AVERAGED_OVER_PAD = ("you averaged over padded positions too; ignore PAD targets (ignore_index="
                     "pad_id, or a mask) and divide by the number of real tokens, not by B * T")


def _c9_pad_mistakes(logits, target, eps, pad_id):
    """Two losses averaged over padded positions too: PAD counted as a class (no ignore_index),
    and the loss of the real tokens summed, then divided by every position, B * T.
    logits (B, T, V), target (B, T) -> two scalars."""
    V = logits.shape[-1]
    pad_as_class = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), label_smoothing=eps)
    per_token = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=pad_id,
                                label_smoothing=eps, reduction="none")  # (B * T,), 0 at PAD
    return pad_as_class, per_token.sum() / target.numel()


@grader("ex-09-label-smoothing", target="smoothed_nll")
def check_smoothed_nll(fn):
    """Checks ``smoothed_nll(logits (B, T, V), target (B, T), eps, pad_id) -> scalar``."""
    n = 0
    cases = [("B=2, T=3, V=5, eps=0 (plain cross-entropy), no padding", (2, 3, 5), 0.0, 0.0),
             ("B=2, T=3, V=5, eps=0.1, no padding", (2, 3, 5), 0.1, 0.0),
             ("B=3, T=4, V=7, eps=0.1, with padding", (3, 4, 7), 0.1, 0.4),
             ("B=1, T=1, V=4, eps=0.2", (1, 1, 4), 0.2, 0.0),
             ("B=4, T=6, V=11, eps=0.3, with padding", (4, 6, 11), 0.3, 0.5)]
    for what, (B, T, V), eps, p_pad in cases:
        logits = torch.randn(B, T, V) * 3
        target = torch.randint(1, V, (B, T))
        if p_pad:
            target[:, 1:][torch.rand(B, T - 1) < p_pad] = PAD_ID
        ref = translation_loss(logits, target, eps)
        got = fn(logits.clone(), target.clone(), eps, PAD_ID)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            raise Hint(f"for {what}: return one number, a 0-dimensional tensor (the mean over "
                       f"real tokens), got {getattr(got, 'shape', type(got).__name__)}")
        if p_pad and not torch.allclose(got, ref, atol=1e-4) and any(
                torch.allclose(got, wrong, atol=1e-4)
                for wrong in _c9_pad_mistakes(logits, target, eps, PAD_ID)):
            raise Hint(f"for {what}: {AVERAGED_OVER_PAD}")
        if eps:
            real = target != PAD_ID
            logp = logits.log_softmax(-1)[real]
            over_others = ((1 - eps) * -logp.gather(1, target[real][:, None])[:, 0]
                           - eps * (logp.sum(-1) - logp.gather(1, target[real][:, None])[:, 0])
                           / (V - 1)).mean()
            if torch.allclose(got, over_others, atol=1e-4) and not torch.allclose(got, ref, atol=1e-4):
                raise Hint(f"for {what}: you spread eps over the V - 1 wrong tokens; as in "
                           "the paper and PyTorch, spread it over all V tokens (the right one "
                           "gets 1 - eps + eps / V)")
            plain = translation_loss(logits, target)
            if torch.allclose(got, plain, atol=1e-5):
                raise Hint(f"for {what}: this is the plain cross-entropy; with eps > 0 the "
                           "target puts 1 - eps on the right token and eps / V on every token")
        expect_close(got.float(), ref, f"the loss for {what}", atol=1e-4)
        n += 1
    logits = torch.randn(2, 3, 5, requires_grad=True)
    fn(logits, torch.randint(1, 5, (2, 3)), 0.1, PAD_ID).backward()
    if logits.grad is None:
        raise Hint("no gradient reaches the logits: compute the loss with torch operations")
    return n + 1


@grader("ex-09-modified-precision", target="modified_precision")
def check_modified_precision(fn):
    """Checks ``modified_precision(hyp, ref, n) -> (matches, total)`` on token lists."""
    n_ok = 0
    cases = [("the classic: hyp 'the the the the the the the', ref 'the cat is on the mat', n=1",
              "the the the the the the the", "the cat is on the mat", 1, (2, 7)),
             ("hyp 'a dog runs', ref 'a dog runs fast', n=2", "a dog runs", "a dog runs fast", 2, (2, 2)),
             ("a hypothesis shorter than n: hyp 'dog', ref 'a dog', n=2", "dog", "a dog", 2, (0, 0)),
             ("no overlap: hyp 'x y z', ref 'a b c', n=1", "x y z", "a b c", 1, (0, 3)),
             ("repeated bigrams: hyp 'a b a b a b', ref 'a b c a b', n=2", "a b a b a b",
              "a b c a b", 2, (2, 5))]
    for what, hyp, ref, n, expected in cases:
        got = fn(hyp.split(), ref.split(), n)
        expect_pair(got, "(matches, total)", what)
        got = tuple(int(g) for g in got)
        if n == 1 and "classic" in what and got == (7, 7):
            raise Hint(f"for {what}: got {got}; clip each n-gram's count to the number of times "
                       "it occurs in the reference: 'the' occurs twice there, so it matches at "
                       "most twice")
        if got != expected:
            raise Hint(f"for {what}: expected (matches, total) = {expected}, got {got}")
        n_ok += 1
    # against sacreBLEU's own counts on random token sequences
    from sacrebleu.metrics import BLEU
    g = torch.Generator().manual_seed(9)
    words = "a b c d e f".split()
    for _ in range(20):
        hyp = [words[i] for i in torch.randint(0, 6, (int(torch.randint(1, 12, (1,), generator=g)),),
                                               generator=g)]
        ref = [words[i] for i in torch.randint(0, 6, (int(torch.randint(1, 12, (1,), generator=g)),),
                                               generator=g)]
        stats = BLEU(tokenize="none").corpus_score([" ".join(hyp)], [[" ".join(ref)]])
        for n in range(1, 5):
            got = tuple(int(x) for x in fn(hyp, ref, n))
            expected = (stats.counts[n - 1], stats.totals[n - 1])
            if got != expected:
                raise Hint(f"for hyp {' '.join(hyp)!r}, ref {' '.join(ref)!r}, n={n}: sacreBLEU "
                           f"counts (matches, total) = {expected}, you returned {got}")
            n_ok += 1
    return n_ok


@grader("ex-09-corpus-bleu", target="corpus_bleu")
def check_corpus_bleu(fn):
    """Checks ``corpus_bleu(hyps, refs) -> BLEU in 0..100`` against sacreBLEU (tokenize='none').

    Every case has at least one matching 4-gram, so sacreBLEU's smoothing never applies."""
    from sacrebleu.metrics import BLEU

    n = 0
    cases = [("one identical pair", ["a dog runs in the snow"], ["a dog runs in the snow"]),
             ("two sentences", ["a man is riding a bike on the road", "two dogs play in the grass"],
              ["a man rides a bike on a road", "two dogs play in the green grass"]),
             ("a short hypothesis (brevity penalty)", ["a man rides a bike"],
              ["a man rides a bike on the road today"]),
             ("a long hypothesis (no brevity penalty)", ["a man in a red shirt rides a bike on the road"],
              ["a man rides a bike on the road"]),
             ("three sentences of different lengths", ["the cat sat on the mat", "a b c d e",
                                                       "people walk down a busy street at night"],
              ["the cat sat on a mat", "a b c d f", "people are walking down a busy street at night"])]
    for what, hyps, refs in cases:
        expected = BLEU(tokenize="none").corpus_score(hyps, [refs]).score
        got = fn(hyps, refs)
        if isinstance(got, torch.Tensor):
            got = got.item()
        if not isinstance(got, (int, float)):
            raise Hint(f"for {what}: return a number, got {type(got).__name__}")
        if abs(got - expected / 100) < 1e-3 and expected > 1:
            raise Hint(f"for {what}: got {got:.4f}; report BLEU on sacreBLEU's 0..100 scale "
                       f"(expected {expected:.2f})")
        if "short" in what:
            precisions = BLEU(tokenize="none").corpus_score(hyps, [refs]).precisions
            without_bp = 100 * math.exp(sum(math.log(p / 100) for p in precisions) / 4)
            if abs(got - without_bp) < 1e-2:
                raise Hint(f"for {what}: the hypothesis is shorter than the reference; multiply by "
                           "the brevity penalty exp(1 - r / c) (c: hypothesis length, r: reference "
                           "length, summed over the corpus)")
        if abs(got - expected) > 1e-2:
            raise Hint(f"for {what}: sacreBLEU gives {expected:.2f}, you returned {got:.2f}. "
                       "Sum matches and totals over the whole corpus for each n = 1..4 before "
                       "dividing (corpus BLEU is not the mean of sentence BLEUs), take the "
                       "geometric mean of the four precisions, then the brevity penalty")
        n += 1
    return n

