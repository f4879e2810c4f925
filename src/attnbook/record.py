"""How a call was made: the provenance that every result file, benchmark and figure carries.

    with record("python -m attnbook benchmarks --section loop", threads=1) as call:
        ...                                    # the work
    call.wall_s, call.cpu_s, call.git_commit   # measured, and where the code came from

A :class:`Provenance` holds the command as typed, the git commit, the date, the hardware and
versions (:func:`attnbook.utils.versions`: processor, its capability such as AVX2 or AVX512,
GPU, torch, ...), threads and processes, the load average before and after, and the wall and
CPU time (children included).

The commit is git's answer, unless git cannot give one that holds the code: on a copy of the
repository without ``.git``, or with a stale one (its ``src/`` differs from the commit), a
recorded commit is used while ``src/attnbook`` still has the digest recorded with it
(:func:`write_commit`, :func:`recorded_commit`; the GPU call records one in ``.gpu_data/COMMIT``).

This module sits on the lowest floor of the package's tooling: it imports only the standard
library, torch and :mod:`attnbook.utils`, and everything that measures imports it.
"""
from __future__ import annotations

import hashlib
import os
import resource
import shlex
import subprocess
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from .utils import versions

ROOT = Path(__file__).resolve().parents[2]       # the repository, when attnbook runs from src/
COMMIT_FILE = ROOT / ".gpu_data" / "COMMIT"      # a recorded commit (see write_commit)
_TYPED: ContextVar[str] = ContextVar("typed", default="")     # see typed_as


class ProvenanceError(ValueError):
    """A provenance record that cannot be read; the message is one line: problem; fix."""


@dataclass
class Provenance:
    """How one call made (part of) a result file."""

    command: str                       # as typed: "python -m attnbook run board --seeds 0"
    git_commit: str                    # 40 hex digits: the commit the call ran at
    date: str                          # "2026-11-23 14:55 UTC" (converted records: as recorded)
    hardware: dict                     # utils.versions(): processor, GPU, python, torch, ...
    threads: int | None = None         # PyTorch threads (per process)
    processes: int | None = None       # processes at once
    load_before: list | None = None    # load average (1, 5, 15 min; older records: 1 min only)
    load_after: list | None = None
    wall_s: float | None = None
    cpu_s: float | None = None         # user + system time, this process and its children
    note: str = ""
    rows: list | None = None           # keys of the rows this call made; None: all of them
    recovered: str = ""                # for a converted record: how git_commit was found
    extra: dict = field(default_factory=dict)   # other measurements its command recorded

    @classmethod
    def from_dict(cls, d: dict) -> "Provenance":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown or not {"command", "git_commit", "date", "hardware"} <= set(d):
            raise ProvenanceError(f"not a provenance record (keys {sorted(d)}); write it with "
                                  "attnbook.record.record")
        return cls(**d)


# --- Where the code came from ------------------------------------------------------------------

def src_digest(root: Path | None = None) -> str:
    """sha256 of every Python file under ``root``/src/attnbook (names and contents; default: this
    repository): which code a copy of the repository holds, with or without its .git."""
    root = root or ROOT
    h = hashlib.sha256()
    for f in sorted((root / "src" / "attnbook").rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def write_commit(commit: str, path: Path | None = None) -> None:
    """Record ``commit`` with the digest of src/attnbook in ``path`` (default ``COMMIT_FILE``):
    what a copy of the repository that travels without a current .git names its code by."""
    path = path or COMMIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{commit} {src_digest()}\n")


def recorded_commit(path: Path | None = None) -> str | None:
    """The commit recorded in ``path`` (default ``COMMIT_FILE``) by :func:`write_commit`, while
    src/attnbook still holds the code recorded with it; else None."""
    path = path or COMMIT_FILE
    if path.is_file():
        recorded = path.read_text().split()
        if len(recorded) == 2 and recorded[1] == src_digest():
            return recorded[0]
    return None


def _git(root: Path) -> tuple[str, bool]:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "", False
    return head, bool(dirty)


def git_commit() -> tuple[str, bool]:
    """(the commit this repository's code comes from, whether src/ has changes that it lacks).

    In order: $ATTNBOOK_GIT_COMMIT (what a parent process passes to the processes it starts);
    git's HEAD while src/ is clean; else the recorded commit (:func:`recorded_commit`) while
    src/ still holds its code (a copy with a stale .git, or without one); else git's HEAD with
    its changes flagged ("", False where there is no git at all)."""
    if os.environ.get("ATTNBOOK_GIT_COMMIT"):
        return os.environ["ATTNBOOK_GIT_COMMIT"], False
    head, dirty = _git(ROOT)
    if head and not dirty:
        return head, False
    recorded = recorded_commit()
    if recorded:
        return recorded, False
    return head, dirty


# --- Measuring a call --------------------------------------------------------------------------

def _load() -> list | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _cpu_seconds() -> float:
    me, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def command_line(command: str, argv) -> str:
    """The command as typed: ``command_line("toy_seeds", ["--tiny"])`` ->
    'python -m attnbook toy_seeds --tiny' (one of the commands of ``python -m attnbook``)."""
    return shlex.join(["python", "-m", "attnbook", command, *map(str, argv)])


@contextmanager
def typed_as(command: str):
    """Within ``with typed_as(cmd):`` every :func:`record` names ``cmd``, the command as the user
    typed it (``python -m attnbook run NAME ...``), and keeps its own in ``extra["ran"]``."""
    token = _TYPED.set(command)
    try:
        yield
    finally:
        _TYPED.reset(token)


@contextmanager
def record(command: str, *, threads: int | None = None, processes: int = 1, note: str = ""):
    """Measure a call: ``with record(cmd, threads=1) as call: ...``; afterwards ``call`` (a
    :class:`Provenance`) has its wall and CPU time (children included) and the load after.
    Under ``python -m attnbook run`` the record's command is that one, as typed, and ``command``
    (the experiment's own command that it ran) is kept in ``extra["ran"]``."""
    commit, dirty = git_commit()
    typed = _TYPED.get()
    call = Provenance(command=typed or command, git_commit=commit,
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      hardware=versions(), threads=threads or torch.get_num_threads(),
                      processes=processes, load_before=_load(), note=note)
    if typed:
        call.extra["ran"] = command
    if dirty:
        call.extra["uncommitted_changes"] = True    # src/ differed from git_commit
    wall, cpu = time.perf_counter(), _cpu_seconds()
    try:
        yield call
    finally:
        call.wall_s = round(time.perf_counter() - wall, 3)
        call.cpu_s = round(_cpu_seconds() - cpu, 3)
        call.load_after = _load()
