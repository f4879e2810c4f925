"""The package's build: setuptools, as pyproject.toml configures it, plus one step.

A wheel of ``attnbook`` carries the book's committed results: ``results/`` of the repository is
copied into the built package as ``attnbook/results/``, so that a notebook opened on its own
(Colab, a download), whose set-up cell installs the package from the repository, shows the same
committed evidence as in a clone (``attnbook.store.find`` looks there after the working folder).
An editable install (``pip install -e .``, what ``make install`` does) reads ``results/`` of the
repository itself and copies nothing.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RESULTS = Path(__file__).resolve().parent / "results"


class BuildWithResults(build_py):
    def run(self):
        super().run()
        if not self.editable_mode and RESULTS.is_dir():
            shutil.copytree(RESULTS, Path(self.build_lib) / "attnbook" / "results",
                            dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithResults})
