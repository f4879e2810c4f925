"""The synthetic-task trainer learns an easy task and is reproducible."""
import torch

from attnbook.batching import SeqBatch
from attnbook.tasks import task_accuracy, train_on_task
from attnbook.transformer import SelfAttentionStack, TransformerConfig


def shift_task(batch_size, g, T=8, n=6):
    """Label of position t = the symbol at position t - 1 (0 for the first): needs attention."""
    x = torch.randint(4, 4 + n, (batch_size, T), generator=g)
    y = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), x[:, :-1] - 4 + 1], dim=1)
    real = torch.ones(batch_size, T, dtype=torch.bool)
    return SeqBatch(ids=x, targets=y, mask=real, scored=real)


def model(seed):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=10, d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0, max_len=16)
    return SelfAttentionStack(cfg, causal=True, n_out=7)


def test_learns_a_task_that_needs_attention_and_is_reproducible():
    a, b = model(0), model(0)
    before = task_accuracy(a, shift_task)[0]
    losses_a = train_on_task(a, shift_task, steps=150, lr=3e-3)
    losses_b = train_on_task(b, shift_task, steps=150, lr=3e-3)
    assert losses_a == losses_b
    tok, seq = task_accuracy(a, shift_task)
    assert before < 0.4 and tok > 0.95 and seq > 0.7
