"""pytest configuration shared by the unit tests and nbval.

nbval compares every output of every notebook cell. Warnings and progress bars go to stderr and
differ from machine to machine, so stderr is left out of the comparison: nbval turns a stream
output into a dict keyed by the stream's name, and adding "stderr" to the keys it skips drops them.
"""
import nbval.plugin

_init = nbval.plugin.IPyNbFile.__init__


def _init_skipping_stderr(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.skip_compare = tuple(self.skip_compare) + ("stderr",)


nbval.plugin.IPyNbFile.__init__ = _init_skipping_stderr
