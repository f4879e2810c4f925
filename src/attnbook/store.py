"""The one results format: every file under ``results/`` is a JSON object

    {"experiment": NAME, "format": FORMAT, "calls": [Provenance, ...], ...the data...}

``calls`` holds one :class:`~attnbook.record.Provenance` record per call of ``python -m attnbook run NAME`` (or of
the command it runs) that made or changed the file, oldest first: the command as typed, the git
commit it ran at, date, hardware and versions, threads, processes at once, load average before and
after, wall and CPU time (children included), a note, and which rows it made. The data keys are the
experiment's own (``runs``, ``variants``, ``settings``, ...), as the notebooks read them.

* :func:`attnbook.record.record` measures a call; :func:`result` builds a file from data and its
  call;
* :func:`merge` adds a call's rows to an existing file by key: a row with the same key is replaced,
  others are kept, the call is appended; other settings are refused (:class:`ResultError`);
* :func:`write` writes atomically; :func:`load` is the one loader the notebooks use: a
  :class:`Result` (the data as a dict) with ``.calls`` and ``.rebuild``, the commands that made it.

Errors are :class:`ResultError` (a ValueError) with a one-line message "problem; fix".
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import asdict
from pathlib import Path

from .record import Provenance, ProvenanceError

FORMAT = "attnbook-result/1"
ROOT = Path(__file__).resolve().parents[2]      # the repository, when attnbook runs from src/


class ResultError(ValueError):
    """A result file that cannot be used or merged; the message is one line: problem; fix."""


class MissingResult(ResultError, FileNotFoundError):
    """A result file that does not exist."""


def result(experiment: str, data: dict, call: Provenance) -> dict:
    """A result file: its experiment, the format, its one call, and the data."""
    clash = {"experiment", "format", "calls"} & set(data)
    if clash:
        raise ResultError(f"data keys {sorted(clash)} are the format's own; rename them")
    return {"experiment": experiment, "format": FORMAT, "calls": [asdict(call)], **data}


def _key(row, by) -> str:
    return "/".join(str(row[k]) for k in by)


def merge(old: dict, new: dict, rows: str, by=(), same=()) -> dict:
    """``new`` (a file of one call) merged into ``old`` by key, as a new dict.

    ``rows`` names the data key holding the rows: a list of dicts keyed by the fields ``by``
    (``rows="runs", by=("name", "seed")``), or, with ``by`` empty, a dict keyed by its keys
    (``rows="exercises"``); ``rows=""`` with ``by`` = data keys: those top-level parts are the
    rows. A row of ``new`` replaces the row of ``old`` with its key, others are kept in order,
    ``new``'s call is appended (with the keys of its rows) and the other data keys come from
    ``new``; the data keys in ``same`` must be equal in both, else ResultError (nothing written).
    """
    if old.get("experiment") != new.get("experiment") or old.get("format") != FORMAT:
        raise ResultError(f"cannot merge into a file of experiment {old.get('experiment')!r}, "
                          f"format {old.get('format')!r}, the results of "
                          f"{new.get('experiment')!r}; "
                          "give the experiment's own result file")
    check_same(old, new, same)
    out = {**old, **{k: v for k, v in new.items() if k != "calls"}}
    if rows == "":
        made = [k for k in by if k in new]
        out.update({k: new[k] for k in made})
        out.update({k: old[k] for k in by if k in old and k not in new})
    elif not by:
        made = list(new[rows])
        out[rows] = {**old.get(rows, {}), **new[rows]}
    else:
        made = [_key(r, by) for r in new[rows]]
        kept = [r for r in old.get(rows, []) if _key(r, by) not in set(made)]
        out[rows] = kept + list(new[rows])
    calls = [dict(c) for c in new["calls"]]
    for c in calls:
        c["rows"] = made
    out["calls"] = [*old["calls"], *calls]
    return out


def check_same(old: dict, new: dict, same) -> None:
    """ResultError (one line) unless ``old`` and ``new`` hold equal values under the keys
    ``same``: the settings that every row of a file shares."""
    for key in same:
        if old.get(key) != new.get(key):
            raise ResultError(f"{key} differ from those of the file (file: "
                              f"{json.dumps(old.get(key))[:80]}, this call: "
                              f"{json.dumps(new.get(key))[:80]}); run with the file's {key}, or "
                              "write to another file")


def figure_metadata(res: dict) -> dict:
    """The metadata of a figure drawn from result ``res`` (matplotlib's ``savefig(metadata=)``):
    its provenance record, as JSON, under "Description" (an SVG's dc:description, a PNG's text
    chunk), so that a figure under results/ carries it too; {} for data without one."""
    if "calls" not in res:
        return {}
    return {"Description": json.dumps({k: res[k] for k in ("experiment", "format", "calls")},
                                      separators=(",", ":"))}


def figure_provenance(path: Path) -> dict | None:
    """The provenance record a figure written with :func:`figure_metadata` carries (PNG or SVG),
    or None."""
    path = Path(path)
    if path.suffix == ".png":
        text = _png_text(path.read_bytes()).get("Description")
    else:
        import html

        found = re.search(r"<dc:description>(.*?)</dc:description>", path.read_text(), re.S)
        text = html.unescape(found.group(1)) if found else None
    return json.loads(text) if text else None


def _png_text(data: bytes) -> dict:
    """The text chunks (tEXt, zTXt, iTXt) of a PNG file's bytes, as {keyword: text}."""
    out, i = {}, 8                                       # after the 8-byte signature
    while i + 8 <= len(data):
        n, kind = int.from_bytes(data[i:i + 4], "big"), data[i + 4:i + 8]
        body = data[i + 8:i + 8 + n]
        key, _, rest = body.partition(b"\0")
        if kind == b"tEXt":
            out[key.decode("latin-1")] = rest.decode("latin-1")
        elif kind == b"zTXt":
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            compressed, text = rest[0], rest[2:].split(b"\0", 2)[2]
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text
                                          ).decode("utf-8")
        i += 12 + n
    return out


def write(path: Path, res: dict) -> Path:
    """Write result ``res`` to ``path`` atomically (a crash leaves the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


class Result(dict):
    """A result's data (a dict), with ``.experiment``, ``.calls`` (Provenance records),
    ``.path`` and ``.rebuild``: the commands that made it, one line each."""

    def __init__(self, res: dict, path: Path):
        if res.get("format") != FORMAT or "calls" not in res:
            raise ResultError(f"{path} is not in the results format {FORMAT}; make it again "
                              "with its command (`python -m attnbook run --list`)")
        super().__init__({k: v for k, v in res.items() if k not in ("experiment", "format",
                                                                     "calls")})
        self.experiment = res["experiment"]
        try:
            self.calls = [Provenance.from_dict(c) for c in res["calls"]]
        except ProvenanceError as e:
            raise ResultError(f"{path}: {e}") from None
        self.path = path

    def call_of(self, key: str) -> "Provenance":
        """The last call that made row (or part) ``key``."""
        for call in reversed(self.calls):
            if call.rows is None or key in call.rows:
                return call
        raise ResultError(f"no call of {self.path} made {key!r}; make it with `python -m "
                          f"attnbook run {self.experiment} --only {key}`")

    @property
    def rebuild(self) -> str:
        return "\n".join(dict.fromkeys(c.command for c in self.calls))


# Where the committed results are when no folder above the working one has them: beside the
# package in a wheel (setup.py copies results/ into it: a notebook opened on its own, whose
# set-up cell installed the package), or the repository's results/ (an editable install).
SHIPPED = (Path(__file__).resolve().parent / "results", ROOT / "results")


def find(relative: str) -> Path | None:
    """``results/<relative>``: in the working folder or a parent (a clone of the book, or results a
    reader made), else the committed copy that came with the package (:data:`SHIPPED`)."""
    folders = [folder / "results" for folder in [Path.cwd(), *Path.cwd().parents]] + list(SHIPPED)
    return next((f / relative for f in folders if (f / relative).is_file()), None)


def read(path: Path) -> dict:
    """The JSON object in ``path``; ResultError (one line) if missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingResult(f"no result file {path}; make it with `python -m attnbook run "
                          "NAME` (see `python -m attnbook run --list`)") from None
    except (OSError, ValueError) as e:
        raise ResultError(f"{path} is not a JSON result ({type(e).__name__}); restore it with "
                          f"`git checkout -- {path}` or make it again") from None


def load(relative: str) -> Result:
    """The committed result ``results/<relative>`` (e.g. "cpu/board.json"), found in this folder
    or a parent: how the notebooks load what a longer command measured."""
    path = find(relative)
    if path is None:
        raise MissingResult(f"results/{relative} not found, neither above the working folder nor "
                            "in the installed package; reinstall the package from the book's "
                            "repository (the notebook's set-up cell), or make the file "
                            "(`python -m attnbook run --list` names the command)")
    return Result(read(path), path)


def how_made(*relatives: str) -> None:
    """Print how the committed results ``results/<relative>`` were made, call by call: the
    command, commit, machine, threads and processes, torch, date, wall time and notes (the
    chapters' folded "How these numbers were made" boxes)."""
    for relative in relatives:
        for i, call in enumerate(load(relative).calls):
            hw = call.hardware
            where = hw.get("gpu") or f"{hw['cpu']} ({hw['cpu_count']} cores)"
            print(f"results/{relative}, call {i}: {call.command}\n  commit {call.git_commit[:8]}, "
                  f"{where}, {call.threads} thread(s) x {call.processes} process(es), torch "
                  f"{hw['torch']}, {call.date}" + (f", {call.wall_s / 60:.0f} min" if call.wall_s else "")
                  + (" (its working tree had uncommitted changes)"
                     if call.extra.get("uncommitted_changes") else ""))
            for note in (call.note, call.recovered):
                if note:
                    print("  note:", note)


HEX40 = re.compile(r"[0-9a-f]{40}")
