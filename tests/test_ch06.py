"""Chapter 6: the Caesar-copy task, and the graders of the masking exercises (the reference passes,
a stub fails, plausible wrong answers fail with a hint that names the mistake)."""
import math

import pytest
import torch

from attnbook import BOS_ID, EOS_ID
from attnbook.attention import causal_mask
from attnbook.tasks import make_caesar_copy_task, task_accuracy, train_on_task
from attnbook.transformer import SelfAttentionStack, TransformerConfig
from graderkit import assert_fails, grade, stub  # noqa: F401


# --- the task ----------------------------------------------------------------------------------

def test_caesar_copy_shapes_layout_and_mask_convention():
    k, n = 4, 8
    b = make_caesar_copy_task(k, n)(16, torch.Generator().manual_seed(0))
    x, y, mask = b.ids, b.targets, b.mask
    T = 2 * k + 2
    assert x.shape == y.shape == mask.shape == (16, T)
    assert x.dtype == y.dtype == torch.long and mask.dtype == torch.bool
    assert mask.all() and b.scored.all()                # every position is real and counts
    assert torch.equal(y[:, :-1], x[:, 1:])             # targets are the inputs shifted by one
    assert (x[:, 0] == BOS_ID).all() and (y[:, -1] == EOS_ID).all()
    sep = 4 + n
    assert (x[:, k + 1] == sep).all() and (y[:, k] == sep).all()
    symbols = torch.cat([x[:, 1:k + 1], y[:, k + 1:-1]], 1)
    assert symbols.min() >= 4 and symbols.max() <= 3 + n   # vocabulary of n + 5 ids
    assert int(torch.cat([x, y]).max()) == n + 4


@pytest.mark.parametrize("shift", [0, 1, 3])
def test_caesar_copy_second_half_is_the_first_half_shifted(shift):
    k, n = 5, 6
    b = make_caesar_copy_task(k, n, shift)(32, torch.Generator().manual_seed(1))
    x, y = b.ids, b.targets
    first = x[:, 1:k + 1] - 4                           # a_1 .. a_k as 0 .. n-1
    second = y[:, k + 1:2 * k + 1] - 4                  # b_1 .. b_k
    assert torch.equal(second, (first + shift) % n)


def test_caesar_copy_labels_depend_on_the_prompt_and_batches_are_reproducible():
    task = make_caesar_copy_task(3, 8)
    first, again, other = (task(64, torch.Generator().manual_seed(s)) for s in (0, 0, 1))
    x1, y1, x2, y2, x3 = first.ids, first.targets, again.ids, again.targets, other.ids
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    # change a_1 in every row: the label that encodes it (b_1) changes with it
    x_changed = x1.clone()
    x_changed[:, 1] = (x1[:, 1] - 4 + 1) % 8 + 4
    b1 = lambda x: (x[:, 1] - 4 + 1) % 8 + 4            # noqa: E731  the rule: b_1 = a_1 + 1
    assert torch.equal(y1[:, 4], b1(x1)) and not torch.equal(b1(x_changed), y1[:, 4])
    # the symbols are spread over the alphabet (not a constant)
    assert len(torch.unique(x1[:, 1:4])) == 8


def test_caesar_copy_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k >= 1"):
        make_caesar_copy_task(0, 8)
    with pytest.raises(ValueError, match="n_symbols >= 2"):
        make_caesar_copy_task(3, 1)


def test_caesar_copy_is_learnable_by_a_causal_model_down_to_the_entropy_floor():
    """The first k labels are random: an honest model's loss stays near k ln n / (2k + 2)."""
    k, n = 2, 4
    task = make_caesar_copy_task(k, n)
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=n + 5, d_model=32, h=2, d_ff=64, n_layers=1, dropout=0.0,
                            max_len=16, tie_embeddings=False)
    model = SelfAttentionStack(cfg, causal=True)
    losses = train_on_task(model, task, steps=250, lr=3e-3, seed=0)
    floor = k * math.log(n) / (2 * k + 2)
    assert floor - 0.05 < sum(losses[-20:]) / 20 < floor + 0.15
    held_out = task(256, torch.Generator().manual_seed(5))
    x, y = held_out.ids, held_out.targets
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(-1)
    assert (pred[:, k:] == y[:, k:]).float().mean() > 0.95    # everything predictable is right
    assert task_accuracy(model, task)[0] < 0.9                 # the random half is not


# --- graders -----------------------------------------------------------------------------------


# ex-06-causal-mask: make_causal_mask(T, S=None) -> (T, S) bool

def causal_ref(T, S=None):
    S = T if S is None else S
    t = torch.arange(T)[:, None]
    i = torch.arange(S)[None, :]
    return i <= t + (S - T)


def test_causal_mask_reference_and_package_pass_and_stub_fails():
    assert grade("ex-06-causal-mask", causal_ref).passed
    assert grade("ex-06-causal-mask", causal_mask).passed
    result = grade("ex-06-causal-mask", stub)
    assert not result.passed and "not implemented yet" in result.message
    assert "make_causal_mask" in result.message


@pytest.mark.parametrize("wrong,fragments", [
    (lambda T, S=None: ~causal_ref(T, S), ["swapped"]),
    (lambda T, S=None: torch.ones(T, T if S is None else S, dtype=torch.bool).triu(),
     ["upper triangle", "torch.tril"]),
    (lambda T, S=None: torch.ones(T, T if S is None else S, dtype=torch.bool).tril(-1),
     ["diagonal", "see itself"]),
    (lambda T, S=None: torch.ones(T, T if S is None else S, dtype=torch.bool).tril(1),
     ["off by one"]),
    (lambda T, S=None: torch.ones(T, T if S is None else S, dtype=torch.bool).tril(),
     ["cache", "t + (S - T)"]),
    (lambda T, S=None: causal_ref(T, S).float(), ["torch.bool"]),
    (lambda T, S=None: torch.ones(T, T, dtype=torch.bool).tril(), ["expected shape (2, 5)"]),
])
def test_causal_mask_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-06-causal-mask", wrong, *fragments)


# ex-06-decoder-mask: make_decoder_mask(pad_mask (B, T)) -> (B, 1, T, T)

def decoder_ref(pad_mask):
    T = pad_mask.shape[1]
    return pad_mask[:, None, None, :] & causal_ref(T)


def test_decoder_mask_reference_passes_and_stub_fails():
    assert grade("ex-06-decoder-mask", decoder_ref).passed
    result = grade("ex-06-decoder-mask", stub)
    assert not result.passed and "not implemented yet" in result.message


def _tril(T):
    return causal_ref(T)


@pytest.mark.parametrize("wrong,fragments", [
    (lambda m: ~decoder_ref(m), ["swapped"]),
    (lambda m: m[:, None, :, None] & _tril(m.shape[1]),
     ["whole rows, those of padded queries", "keys"]),
    (lambda m: m[:, None, :, None] & m[:, None, None, :] & _tril(m.shape[1]),
     ["whole rows, those of padded queries", "NaN"]),
    (lambda m: m[:, None, None, :].expand(-1, 1, m.shape[1], -1).clone(),
     ["future keys are visible"]),
    (lambda m: _tril(m.shape[1]).expand(m.shape[0], 1, -1, -1).clone(),
     ["padded keys are visible"]),
    (lambda m: m[:, None, None, :] | _tril(m.shape[1]), ["use &"]),
    (lambda m: m[:, None, None, :] & _tril(m.shape[1]).T, ["upper triangle"]),
    (lambda m: m[:, None, :] & _tril(m.shape[1]), ["(3, 1, 5, 5)", "heads"]),
    (lambda m: m[:, None, None, :], ["padding mask alone", "&"]),
    (lambda m: decoder_ref(m).long(), ["torch.bool"]),
])
def test_decoder_mask_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-06-decoder-mask", wrong, *fragments)


def test_decoder_mask_that_modifies_its_input_fails():
    def in_place(m):
        ref = decoder_ref(m)          # the right answer ...
        m[:, -1] = False              # ... but the caller's padding mask is changed
        return ref
    assert_fails("ex-06-decoder-mask", in_place, "modified")


# ex-06-leak-detector: leaks_future(model, T, vocab_size) -> bool

def leaks_ref(model, T, vocab_size):
    ids = torch.randint(0, vocab_size, (4, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids)
        for t in range(T - 1):
            changed = ids.clone()
            changed[:, t + 1:] = (ids[:, t + 1:] + 1) % vocab_size
            if not torch.allclose(model(changed)[:, :t + 1], out[:, :t + 1], atol=1e-5):
                return True
    return False


def leaks_compare_everything(model, T, vocab_size):
    """Wrong: compares all positions, so the later ones (which may change) always differ."""
    ids = torch.randint(0, vocab_size, (4, T))
    changed = ids.clone()
    changed[:, T // 2:] = (ids[:, T // 2:] + 1) % vocab_size
    return not torch.allclose(model(ids), model(changed))


def leaks_next_token_only(model, T, vocab_size):
    """Wrong: only changes the token right after t, so it misses a leak from further ahead."""
    ids = torch.randint(0, vocab_size, (4, T))
    out = model(ids)
    for t in range(T - 1):
        changed = ids.clone()
        changed[:, t + 1] = (ids[:, t + 1] + 1) % vocab_size
        if not torch.allclose(model(changed)[:, t], out[:, t], atol=1e-5):
            return True
    return False


def leaks_first_position_only(model, T, vocab_size):
    """Wrong: only checks position 0, so it misses a leak into a later position."""
    ids = torch.randint(0, vocab_size, (4, T))
    changed = ids.clone()
    changed[:, 1:] = (ids[:, 1:] + 1) % vocab_size
    return not torch.allclose(model(ids)[:, 0], model(changed)[:, 0], atol=1e-5)


def leaks_no_real_change(model, T, vocab_size):
    """Wrong: the 'perturbed' sequence is the same sequence."""
    ids = torch.randint(0, vocab_size, (4, T))
    return not torch.allclose(model(ids), model(ids.clone()))


def test_leak_detector_reference_passes_and_stub_fails():
    assert grade("ex-06-leak-detector", leaks_ref).passed
    result = grade("ex-06-leak-detector", stub)
    assert not result.passed and "not implemented yet" in result.message


@pytest.mark.parametrize("wrong,fragments", [
    (leaks_compare_everything, ["causal SelfAttentionStack (no leak)", "compare only positions"]),
    (leaks_next_token_only, ["reads the last token", "all of them"]),
    (leaks_first_position_only, ["also reads token", "For every position"]),
    (leaks_no_real_change, ["without the causal mask", "really differ"]),
    (lambda model, T, V: "no", ["return True or False"]),
])
def test_leak_detector_wrong_answers_get_a_precise_hint(wrong, fragments):
    assert_fails("ex-06-leak-detector", wrong, *fragments)


def test_graders_leave_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    grade("ex-06-leak-detector", leaks_ref)
    assert torch.equal(torch.rand(3), expected)
