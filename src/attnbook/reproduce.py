"""Checking a run made here against a committed one, on any reader's machine.

The book commits what its experiments measured (``results/``) and what its notebooks printed, and
its checks compare a run made now with them. How closely the two can agree depends on the
arithmetic (:func:`attnbook.utils.arithmetic`):

* **On the arithmetic that made the result** (the same processor, vector kernels and PyTorch), a
  deterministic CPU run reproduces it bit for bit, so the check is **exact**: any difference
  means that the code, the data or the settings changed since.
* **On another arithmetic** (an AVX2 laptop against the AVX-512 server that made the file, Apple
  silicon, Colab), float32 sums are rounded in another order and differ in their last bits, and
  training amplifies that: after a few hundred steps the run can be as far from the committed one
  as a run with another seed. There the check allows a **tolerance from the committed result's
  own seed spread**: ``K_RANGE`` times the largest difference between two of its seeds, taken
  over the quantities of one kind (:func:`kind`: the exact match at every length, the final
  loss, the attention statistics, a BLEU score).

A failed check says which rule it used, the quantity furthest beyond its tolerance, both
machines, and the two possibilities: another machine's arithmetic that took the run further than
a seed would, or a real change.
"""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .utils import arithmetic, recorded_arithmetic

# A run made with other arithmetic is, at worst, another draw of the seed noise: its distance
# from the committed seed is then about the distance between two seeds, which three seeds
# measure only roughly (`python -m attnbook run arithmetics`: chapters 1-3's reversal runs with
# PyTorch's AVX2 and plain kernels came to at most about 2 times the largest difference between
# their committed seeds). Three times that leaves room, and still fails a change that moves a run
# further than its seeds ever scatter.
K_RANGE = 3


class NotReproduced(AssertionError):
    """A run made here is further from the committed one than its tolerance allows."""


@dataclass(frozen=True)
class Tolerance:
    """How far a quantity of a run made here may be from the committed one, and why (``rule``,
    in words: "3 x the largest difference between two of its seeds in exact, 0.08 (seeds 0, 1,
    2)")."""

    value: float
    rule: str


@dataclass(frozen=True)
class Agreement:
    """A check that passed: the largest absolute difference between the two runs (0.0:
    identical), and the quantity that came closest to its tolerance, with that tolerance."""

    distance: float
    quantity: str
    tolerance: Tolerance

    def __str__(self) -> str:          # short: a chapter prints it (the rule is .tolerance.rule)
        if self.distance == 0:
            return "identical, bit for bit"
        return (f"{self.distance:.2g} apart at most, within the tolerance ({self.quantity}: "
                f"{self.tolerance.value:.2g})")


def kind(quantity: str) -> str:
    """The kind of a quantity, which shares one tolerance: "exact@20" -> "exact",
    "align.band" -> "align", "final_loss" -> "final_loss"."""
    return quantity.split("@")[0].split(".")[0]


def exact(why: str = "the same arithmetic as the committed run") -> Tolerance:
    """No difference allowed."""
    return Tolerance(0.0, f"exact: {why}")


def from_seeds(runs: Sequence[Mapping[str, float]], k: float = K_RANGE, floor: float = 0.0,
               seeds: Sequence[int] | None = None) -> dict[str, Tolerance]:
    """Each quantity's tolerance: ``k`` times the largest difference between two of ``runs``
    (the committed seeds' quantities, at least two) over the quantities of its :func:`kind`, or
    ``floor`` where that is larger."""
    if len(runs) < 2:
        raise ValueError(f"a seed spread needs at least two seeds, got {len(runs)}")
    named = (f"seeds {', '.join(map(str, seeds))}" if seeds is not None
             else f"{len(runs)} seeds")
    out = {}
    for group in dict.fromkeys(kind(q) for q in runs[0]):
        names = [q for q in runs[0] if kind(q) == group]
        spread = max(abs(float(a[q]) - float(b[q])) for a, b in itertools.combinations(runs, 2)
                     for q in names)
        what = f"the largest difference between two of its seeds in {group}, {spread:.3g} ({named})"
        tol = (Tolerance(k * spread, f"{k:g} x {what}") if k * spread >= floor
               else Tolerance(floor, f"the floor {floor:g}, above {k:g} x {what}"))
        out |= dict.fromkeys(names, tol)
    return out


def band(value: float, why: str) -> Tolerance:
    """A stated tolerance with its justification, where no seed spread was measured."""
    return Tolerance(value, f"the stated band {value:g}: {why}")


def describe(arith: Mapping) -> str:
    """ "AMD EPYC, AVX512, torch 2.13.0+cpu" (and any caps) for an :func:`arithmetic` dict."""
    caps = [f"{k}={v}" for k, v in (arith.get("isa_caps") or {}).items()]
    return ", ".join([arith.get("cpu") or "an unrecorded processor",
                      arith.get("cpu_capability") or "unrecorded kernels",
                      f"torch {arith.get('torch')}", *caps])


def compare(what: str, fresh: Mapping[str, float], committed: Mapping[str, float],
            tolerance: Tolerance | Mapping[str, Tolerance], *, made_on: Mapping, source: str,
            remake: str = "") -> Agreement:
    """Check that the quantities ``fresh`` (name -> value, made here) are each within their
    ``tolerance`` (one for all, or one per name, :func:`from_seeds`) of ``committed`` (the same
    names, from ``source``: "seed 0 of 'additive' in toy_seeds.json"); returns the
    :class:`Agreement`.

    ``made_on`` is the :func:`~attnbook.utils.arithmetic` the committed values were made with:
    where it is this machine's, the check is exact. Raises :class:`NotReproduced` naming the
    quantity furthest beyond its tolerance, the rule, both machines and what to do; ``remake``
    is the command that makes the committed values again.
    """
    if set(fresh) != set(committed):
        raise NotReproduced(f"{what}: this run measured {sorted(fresh)} but {source} holds "
                            f"{sorted(committed)}; they are not the same experiment")
    here = arithmetic()
    made_here = dict(made_on) == here
    allowed = {q: exact() if made_here else
               tolerance if isinstance(tolerance, Tolerance) else tolerance[q] for q in fresh}
    gaps = {q: abs(float(fresh[q]) - float(committed[q])) for q in fresh}
    ratio = {q: gaps[q] / allowed[q].value if allowed[q].value
             else float("inf") if gaps[q] > 0 else 0.0 for q in fresh}
    name = max(ratio, key=ratio.get, default="")
    if not fresh or gaps[name] <= allowed[name].value:
        return Agreement(max(gaps.values(), default=0.0), name,
                         allowed[name] if fresh else exact())
    head = (f"{what}: {name} is {float(fresh[name]):.4g} here and {float(committed[name]):.4g} "
            f"in {source}, {gaps[name]:.3g} apart, beyond the tolerance "
            f"{allowed[name].value:.3g} ({allowed[name].rule}).")
    if made_here:
        raise NotReproduced(f"{head} This machine computes as the one that made it "
                            f"({describe(here)}), so the code, the data or the settings changed "
                            "since" + (f": remake it with `{remake}`" if remake else ""))
    raise NotReproduced(f"{head} It was made on {describe(made_on)}; this machine is "
                        f"{describe(here)}. Either this machine's arithmetic took the run "
                        "further from it than another seed would go, or the code, the data or "
                        "the settings changed. To tell, make it here"
                        + (f" (`{remake}`; `git diff` then shows both)" if remake else "")
                        + ": see the book's page 'Numbers on your machine'")


def check_result(result, what: str, fresh: Mapping[str, float], committed: Mapping[str, float],
                 tolerance: Tolerance | Mapping[str, Tolerance], source: str,
                 row: str | None = None, remake: str = "") -> Agreement:
    """:func:`compare` against a committed result file (a
    :class:`~attnbook.store.Result`): exact where the call that made ``row`` (its
    last call, without ``row``) ran with this machine's arithmetic, within ``tolerance``
    elsewhere; a failure names ``remake``, or else the command of that call."""
    call = result.call_of(row) if row is not None else result.calls[-1]
    return compare(what, fresh, committed, tolerance, made_on=recorded_arithmetic(call),
                   source=source, remake=remake or call.command)


# --- Notebook outputs -------------------------------------------------------------------------
#
# A notebook's committed outputs were printed on one machine, whose arithmetic() the notebook's
# metadata records ("attnbook": {"outputs_made_with": ...}, written by
# tools/execute_notebooks.py). On that arithmetic the test suite compares every output exactly;
# elsewhere a cell that prints numbers from training may differ within the tolerance its
# metadata states ("attnbook": {"numbers": {"abs": 0.15, "why": "..."}}), and the chapters'
# hidden checks of the numbers their prose quotes hold only where outputs_made_here().

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def notebook_made_here(metadata: Mapping) -> bool:
    """Whether a notebook whose metadata is ``metadata`` had its outputs made with this
    machine's arithmetic."""
    return (metadata.get("attnbook") or {}).get("outputs_made_with") == arithmetic()


def outputs_made_here(notebook: str) -> bool:
    """Whether the committed outputs of ``notebook`` ("05_multi_head_attention", found in the
    working folder or its ``notebooks/``, as when the book's notebooks run) were made with this
    machine's arithmetic. False for a notebook opened on its own (Colab, a download): then its
    outputs are another machine's."""
    for folder in (Path.cwd(), Path.cwd() / "notebooks"):
        path = folder / f"{notebook}.ipynb"
        if path.is_file():
            return notebook_made_here(json.loads(path.read_text(encoding="utf-8"))["metadata"])
    return False


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def printed_numbers_agree(here: str, committed: str, tolerance: float) -> str:
    """'' when the printed text ``here`` is ``committed`` but for numbers, each within
    ``tolerance`` of the committed one; else what differs, in one line."""
    words = lambda text: [" ".join(w.split()) for w in NUMBER.split(text)]   # noqa: E731
    words_here, words_then = words(here), words(committed)     # numpy pads numbers with spaces
    if words_here != words_then:
        first = next((a, b) for a, b in zip(words_here + [""], words_then + [""]) if a != b)
        return f"the text differs beyond its numbers: {first[0]!r} here, {first[1]!r} committed"
    for a, b in zip(NUMBER.findall(here), NUMBER.findall(committed)):
        if abs(_number(a) - _number(b)) > tolerance + 1e-12:
            return f"{a} here and {b} committed differ by more than the tolerance {tolerance:g}"
    return ""
