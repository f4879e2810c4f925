"""Homework graders: one checking function per coding exercise of the book.

A grader tests the reader's function or module against a reference on random inputs and edge
cases (a batch of 1, length 1, masked positions, other dtypes) and reports either one success
line or a precise hint: which input, which shape or value, what was expected and what came back.
It never just says "wrong" and never passes a stub.

Writing a grader::

    @grader("ex-01-gru-step", target="gru_step")
    def check_gru_step(fn):
        ...                      # raise Hint("...") at the first failed check
        return n_checks          # the number of checks that passed

In a notebook the reader calls ``check_gru_step(gru_step)``, which prints one line. The grading
command (``python -m attnbook.homework``) looks graders up by exercise label in ``GRADERS`` and
calls ``GRADERS[label].grade(obj)``, which returns a :class:`GradeResult` instead of printing.

Graders draw their random inputs from a private, seeded generator and restore PyTorch's global
random state afterwards, so calling one never changes what a notebook computes next.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch


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
    label: str      # the exercise's label in the book, e.g. "ex-01-gru-step"
    target: str     # the name the reader's code defines in the notebook, e.g. "gru_step"
    check: Callable  # raises Hint on failure, returns the number of checks passed

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
        return GradeResult(self.label, True, f"`{self.target}` passed {n} checks.")


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


# ---------------------------------------------------------------------------------------------
# Chapter 0: setting up

@grader("ex-00-pad", target="pad_batch")
def check_pad_batch(pad_batch):
    from .batching import pad as reference

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
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Hint(f"on {what}: return a tuple (ids, mask), got {type(out).__name__}")
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
