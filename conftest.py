"""pytest configuration shared by the unit tests and nbval.

nbval compares every output of every notebook cell. Warnings and progress bars go to stderr and
differ from machine to machine, so stderr is left out of the comparison: nbval turns a stream
output into a dict keyed by the stream's name, and adding "stderr" to the keys it skips drops them.

A notebook's outputs were made on one machine, whose arithmetic its metadata records
(``attnbook.reproduce``). On that arithmetic every output must match exactly. On another (an AVX2
laptop, Apple silicon, ``make test-portable``'s plain kernels) a cell whose metadata states a
tolerance for its printed numbers ("attnbook": {"numbers": {"abs": ..., "why": ...}}) passes when
its text is the committed text but for numbers, each within that tolerance.
"""
import nbval.plugin

from attnbook.reproduce import notebook_made_here, printed_numbers_agree

_init = nbval.plugin.IPyNbFile.__init__
_compare = nbval.plugin.IPyNbCell.compare_outputs


def _init_skipping_stderr(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.skip_compare = tuple(self.skip_compare) + ("stderr",)


def _printed(outputs) -> str:
    """The text a cell printed: its stdout and the text of its results, in order; of a result
    shown as Markdown (a rendered table), its Markdown, not its repr, which the committed
    notebook does not keep."""
    parts = []
    for out in outputs:
        if out.get("name") == "stdout":
            parts.append(out["text"])
        data = out.get("data", {})
        parts += [data["text/markdown"]] if "text/markdown" in data else \
            [v for k, v in data.items() if k == "text/plain"]
    return "\n".join(parts)


def _compare_within_tolerance(self, test, ref, skip_compare=None):
    if _compare(self, test, ref, skip_compare):
        return True
    spec = (self.cell.metadata.get("attnbook") or {}).get("numbers")
    if spec is None or notebook_made_here(self.parent.nb.metadata):
        return False                      # nbval's own report of the difference stands
    problem = printed_numbers_agree(self.sanitize(_printed(test)), self.sanitize(_printed(ref)),
                                    spec["abs"])
    if not problem:
        self.comparison_traceback = []
        return True
    self.comparison_traceback.append(
        f"printed numbers: {problem} (this machine's arithmetic is not the one that made the "
        f"committed outputs; the cell allows {spec['abs']}: {spec['why']})")
    return False


nbval.plugin.IPyNbFile.__init__ = _init_skipping_stderr
nbval.plugin.IPyNbCell.compare_outputs = _compare_within_tolerance


# The longest scopes first. make test runs two workers with --dist loadscope: a notebook or a
# test module goes to one worker whole, in the order collected, so a long one collected last
# (the notebooks come after tests/) can leave the other worker idle at the end. These took
# longest in a run of make test (November 2026); every other item keeps its place.
LONGEST_FIRST = ("notebooks/09_training.ipynb", "tests/test_registry.py", "tests/test_browser.py",
                 "notebooks/03_dot_product_attention.ipynb", "tests/test_gpu_run.py",
                 "notebooks/02_additive_attention.ipynb", "tests/test_experiments.py",
                 "tests/test_train.py", "notebooks/12_decoder_only.ipynb",
                 "notebooks/08_transformer.ipynb", "tests/test_live.py", "tests/test_speedrun.py",
                 "notebooks/11_full_size.ipynb", "tests/test_stored.py", "tests/test_gpu_branches.py")


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item):
        if item.path.suffix == ".ipynb":   # in notebooks/, or a reader's copy (make test)
            return rank.get(f"notebooks/{item.path.name}", len(rank))
        try:
            return rank.get(item.path.resolve().relative_to(root).as_posix(), len(rank))
        except ValueError:                 # outside the repository (a test's own planted files)
            return len(rank)
    items.sort(key=place)                  # stable: cells and tests keep their order
