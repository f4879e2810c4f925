"""Chapter 6's graders on typical mistakes with masks and leaks: a causal mask off by one is named
as such (not "set blocked scores to -inf"), and a leak detector that tests a single split point
is caught by a model that leaks elsewhere. (tests/test_ch06.py has the chapter's other grader
tests.)"""
import pytest
import torch

from attnbook.attention import causal_mask
from graderkit import assert_fails, grade


def tril(T, S=None, shift=0):
    """torch.tril with the diagonal of a (T, S) causal mask moved by ``shift``."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool).tril(S - T + shift)


# --- ex-06-causal-mask and ex-06-decoder-mask: off by one --------------------------------------

@pytest.mark.parametrize("shift,fragments", [
    (1, ["off by one", "lets position t see t + 1"]),
    (-1, ["blocks the diagonal", "must see itself"]),
])
def test_causal_mask_off_by_one_is_named_also_with_more_keys_than_queries(shift, fragments):
    assert_fails("ex-06-causal-mask", lambda T, S=None: tril(T, S, shift), *fragments)

    def square_right_but_shifted_with_a_cache(T, S=None):
        return causal_mask(T) if S is None or S == T else tril(T, S, shift)
    message = assert_fails("ex-06-causal-mask", square_right_but_shifted_with_a_cache, *fragments)
    assert "make_causal_mask(2, 5)" in message          # the first case with S != T


@pytest.mark.parametrize("shift,fragments", [
    (1, ["the causal part", "off by one", "t + 1"]),
    (-1, ["the causal part", "blocks the diagonal"]),
])
def test_decoder_mask_off_by_one_is_named(shift, fragments):
    assert_fails("ex-06-decoder-mask", lambda m: m[:, None, None, :] & tril(m.shape[1], shift=shift),
                 *fragments)


# --- ex-06-leak-detector: detectors that look at one split point only --------------------------

def leaks_at_split(model, T, vocab_size, t):
    """Change the tokens after t (all of them) and compare the outputs at positions 0..t."""
    ids = torch.randint(0, vocab_size, (4, T), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, t + 1:] = (ids[:, t + 1:] + 1) % vocab_size
    with torch.no_grad():
        return not torch.allclose(model(ids)[:, :t + 1], model(changed)[:, :t + 1], atol=1e-5)


def leaks_ref(model, T, vocab_size):
    return any(leaks_at_split(model, T, vocab_size, t) for t in range(T - 1))


def test_leak_detector_reference_passes_on_every_model():
    result = grade("ex-06-leak-detector", leaks_ref)
    assert result.passed, result.message
    assert "passed 14 checks" in result.message        # 7 models, 2 sizes


@pytest.mark.parametrize("wrong,fragments", [
    (lambda model, T, V: leaks_at_split(model, T, V, T // 2),
     ["position 0 also reads token 1", "Only position 0 reads the future (token 1)",
      "one split point", "For every position t"]),
    (lambda model, T, V: leaks_at_split(model, T, V, T - 2),
     ["position 4 also reads token 5", "Only position 4 reads the future (token 5)"]),
    (lambda model, T, V: leaks_at_split(model, T, V, 0),
     ["position 4 also reads token 5", "Only position 4 reads the future"]),
])
def test_single_split_detectors_are_told_which_leak_they_missed(wrong, fragments):
    assert_fails("ex-06-leak-detector", wrong, *fragments)


def test_the_leak_hint_of_a_model_that_sees_everything_names_no_position():
    never = assert_fails("ex-06-leak-detector", lambda model, T, V: False, "without the causal mask")
    assert "Only position" not in never
