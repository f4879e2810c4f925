"""Every call merged twice: the check that the tests running an experiment's command make.

:func:`recording` makes every command's ``save`` (:func:`attnbook.experiments.registry.save`, the
one way a result is written) note what it was given; :func:`merged_again` then writes each file's
last call a second time, as a second identical call would, and asserts that the file's data is
what the first left: rows replaced by the same rows, derived fields (summaries, spreads, orders,
merged comparisons) made again the same, settings accepted. The second call's record is appended
to a file with rows; a file that one call makes whole is written again the same, its record
included. The file is put back as the first call left it.
"""
import copy
import importlib
import sys
from pathlib import Path

from attnbook import store
from attnbook.commands import COMMANDS
from attnbook.experiments import registry


def recording(monkeypatch) -> list:
    """Note every command's calls of ``save`` (a list of (args, kwargs), in order)."""
    saves, original = [], registry.save

    def save(*args, **kw):
        saves.append(copy.deepcopy((args, kw)))
        return original(*args, **kw)
    for module, _ in COMMANDS.values():
        importlib.import_module(module)
    for name, mod in list(sys.modules.items()):          # the commands, what they call, and
        if name.startswith("attnbook.") \
                and getattr(mod, "save", None) is original:  # registry.write_result's own call
            monkeypatch.setattr(mod, "save", save)
    return saves


def merged_again(saves: list) -> list:
    """Save the last noted call of each file again; assert the file unchanged but for that
    call's record appended (an experiment with rows). Returns the experiments checked."""
    last = {str(args[1]): (args, kw) for args, kw in saves}
    assert last, "no result was written through registry.save"
    for args, kw in last.values():
        name, target = args[0], Path(args[1])
        text = target.read_text()
        before = store.read(target)
        registry.save(*copy.deepcopy(args), **copy.deepcopy(kw))
        after = store.read(target)
        target.write_text(text)                     # as the first call left it, for the test
        if registry.EXPERIMENTS[name].rows is None:
            assert after == before, f"{target}: a second call changed the file"
            continue
        data = {k: v for k, v in after.items() if k != "calls"}
        assert data == {k: v for k, v in before.items() if k != "calls"}, \
            f"{target}: a second identical call changed the file's data"
        assert after["calls"][:-1] == before["calls"], target        # the call appended
        assert _but_rows(after["calls"][-1]) == _but_rows(before["calls"][-1]), target
    return sorted({args[0] for args, _ in last.values()})


def _but_rows(call: dict) -> dict:
    return {k: v for k, v in call.items() if k != "rows"}
