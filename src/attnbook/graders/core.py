"""The graders' shared core: the result of a check, the registry, and the helpers every chapter's
checks use.

Writing a grader (in the module of its chapter)::

    @grader("ex-02-masked-softmax", target="masked_softmax")
    def check_masked_softmax(fn):
        ...                      # raise Hint("...") at the first failed check
        return n_checks          # the number of checks that passed

A check may also return ``(n_checks, note)``: the answer passes, and the note says what it does
differently from the reference (an accepted convention).

Graders draw their random inputs from a private, seeded generator and restore PyTorch's global
random state afterwards, so calling one never changes what a notebook computes next.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from ..attention import causal_mask


class Hint(Exception):
    """A failed check. The message says what was tested, what was expected and what came back."""


@dataclass
class GradeResult:
    label: str
    passed: bool
    message: str

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        return f"[{mark}] {self.label}: {self.message}"

    def __bool__(self) -> bool:
        return self.passed


@dataclass
class Grader:
    label: str      # the exercise's label in the book, e.g. "ex-02-masked-softmax"
    target: str     # the name the reader's code defines in the notebook, e.g. "masked_softmax"
    check: Callable  # raises Hint on failure, returns the number of checks passed (and a note)

    def grade(self, obj) -> GradeResult:
        """Run the checks on ``obj`` and return the result (never raises for a wrong answer)."""
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1234)
                n = self.check(obj)
        except Hint as h:
            return GradeResult(self.label, False, str(h))
        except NotImplementedError:
            return GradeResult(self.label, False,
                               f"`{self.target}` is not implemented yet: replace the "
                               "`raise NotImplementedError` with your code.")
        except Exception as e:  # the reader's code crashed: say where and on what
            return GradeResult(self.label, False,
                               f"`{self.target}` raised {type(e).__name__}: {e}")
        n, note = n if isinstance(n, tuple) else (n, "")
        return GradeResult(self.label, True, f"`{self.target}` passed {n} checks."
                           + (f" Note: {note}" if note else ""))


GRADERS: dict[str, Grader] = {}


def grader(label: str, target: str):
    """Register ``check`` as the grader of exercise ``label``; the returned function prints."""
    def decorate(check):
        if label in GRADERS:
            raise ValueError(f"two graders for exercise {label!r}")
        g = Grader(label, target, check)
        GRADERS[label] = g

        @functools.wraps(check)
        def run(obj) -> None:
            print(g.grade(obj).line())

        run.grader = g
        return run
    return decorate


# ---------------------------------------------------------------------------------------------
# Helpers for writing checks

def expect_shape(got, shape, what: str) -> None:
    """Raise a Hint unless ``got`` is a tensor of exactly ``shape``."""
    if not isinstance(got, torch.Tensor):
        raise Hint(f"{what}: expected a torch.Tensor of shape {tuple(shape)}, got {type(got).__name__}")
    if tuple(got.shape) != tuple(shape):
        raise Hint(f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}")


def expect_pair(got, names: str, what: str) -> None:
    """Raise a Hint unless ``got`` is a tuple of two, e.g. names="(context, alpha)"."""
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Hint(f"on {what}: return a tuple {names}, got {type(got).__name__}")


def expect_close(got, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Raise a Hint unless ``got`` matches ``expected`` in shape, dtype and value."""
    expect_shape(got, expected.shape, what)
    if got.dtype != expected.dtype:
        raise Hint(f"{what}: expected dtype {expected.dtype}, got {got.dtype}")
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        idx = tuple(torch.nonzero(torch.isnan(got))[0].tolist())
        raise Hint(f"{what}: NaN at index {idx}; the reference has no NaN there")
    if not torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
        diff = (got.double() - expected.double()).abs().nan_to_num(0.0)
        idx = tuple(torch.nonzero(diff == diff.max())[0].tolist())
        raise Hint(f"{what}: values differ; largest difference {diff.max().item():.3g} at index "
                   f"{idx}: expected {expected[idx].item():.6g}, got {got[idx].item():.6g}")


# The two off-by-one causal masks (chapters 4 to 6): their diagonal shift and what is wrong.
OFF_BY_ONE = {
    1: "the causal mask is off by one: your mask lets position t see t + 1, the next token, "
       "which is the very token it must predict (torch.tril(..., diagonal=1)); query t may see "
       "keys s <= t: diagonal=0",
    -1: "the causal mask blocks the diagonal: a position must see itself (key s = t), and "
        "query 0 then sees nothing at all (torch.tril(..., diagonal=-1)); query t may see keys "
        "s <= t: diagonal=0",
}


def shifted_causal_mask(T: int, S: int | None = None, shift: int = 1) -> torch.Tensor:
    """(T, S) bool: :func:`attnbook.attention.causal_mask` with its diagonal moved by ``shift``
    (True = may attend): +1 lets query t see key t + 1, -1 hides key t from it."""
    return causal_mask(T, S, offset=shift)
