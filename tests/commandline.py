"""Run a command's ``main(argv)`` in the test's own process, as ``python -m`` would run it:
no new Python (and no second import of torch) for each case of a command's answers."""
import io
import sys


def run_main(main, argv, capsys, monkeypatch=None, stdin=None):
    """(exit status, stdout, stderr) of ``main(argv)``; argparse's own errors exit with
    SystemExit, whose code is the status. ``stdin`` (text) needs ``monkeypatch``."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
