"""Put a local copy of MathJax 3 where the book's HTML loads it from, so that math renders offline.

    python tools/fetch_mathjax.py                  # what `make book` runs; quick when the copy is there
    python tools/fetch_mathjax.py --require-local  # fail instead of falling back to the CDN (CI does)

The book loads MathJax from ``_static/mathjax/tex-mml-chtml.js`` (``mathjax_path`` in
``_config.yml``). That file, with the fonts, TeX extensions and accessibility components it loads
on demand, is copied from the npm package ``mathjax@VERSION`` (fetched with ``npm pack``, so npm
must be installed) into ``_build/vendor/_static/mathjax/``; ``html_extra_path`` in ``_config.yml``
copies ``_build/vendor`` into the built HTML. (Not the book's own ``_static`` folder: Jupyter Book
adds every ``.js`` file found there to every page.)

Without npm the book still builds: the script writes a two-line ``tex-mml-chtml.js`` that loads
the same MathJax version from a CDN, and says so. That book needs the internet to show math.
With ``--require-local``, or in CI (``CI=true``), a failed download is an error instead.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "3.2.2"
ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "_build" / "vendor" / "_static" / "mathjax"
MARKER = DEST / "VERSION"  # "mathjax 3.2.2 npm" or "mathjax 3.2.2 cdn"
CDN = f"https://cdn.jsdelivr.net/npm/mathjax@{VERSION}/es5/tex-mml-chtml.js"
# What of the package's es5/ folder the book needs: the combined TeX+MathML -> CommonHTML file and
# what it loads on demand (fonts, TeX extensions such as boldsymbol, the menu's a11y components).
KEEP = ("tex-mml-chtml.js", "input/", "output/chtml/", "ui/", "a11y/", "sre/")

CDN_LOADER = f"""\
// MathJax from a CDN: npm was not available when this book was built (see README, "MathJax").
// Run `python tools/fetch_mathjax.py` with npm installed for a copy that works offline.
(function () {{
  var s = document.createElement("script");
  s.src = "{CDN}";
  s.async = true;
  document.head.appendChild(s);
}})();
"""


def current() -> str:
    """How the copy in DEST was made: 'npm', 'cdn' or '' (none, or another version)."""
    try:
        words = MARKER.read_text().split()
    except OSError:
        return ""
    ok = len(words) == 3 and words[1] == VERSION and (DEST / "tex-mml-chtml.js").is_file()
    return words[2] if ok else ""


def npm_pack(spec: str, folder: Path) -> Path:
    """Download the npm package ``spec`` (name@version) with `npm pack` into ``folder``: its
    tarball. RuntimeError when npm is missing or fails. (tools/fetch_ort.py uses it too.)"""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    run = subprocess.run([npm, "pack", spec, "--silent", "--pack-destination", str(folder)],
                         capture_output=True, text=True, timeout=600)
    tarballs = list(folder.glob("*.tgz"))
    if run.returncode != 0 or len(tarballs) != 1:
        raise RuntimeError(f"`npm pack {spec}` failed: {(run.stderr or run.stdout).strip()[-1000:]}")
    return tarballs[0]


def replace_dir(staging: Path, dest: Path) -> None:
    """Put the folder ``staging`` where ``dest`` is, replacing it."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), dest)


def fetch_npm() -> None:
    """Download mathjax@VERSION with `npm pack` and copy what the book needs into DEST."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tarball = npm_pack(f"mathjax@{VERSION}", tmp)
        staging = tmp / "mathjax"
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("package/")
                if name == "LICENSE":
                    target = "LICENSE"
                elif name.startswith("es5/") and name[4:].startswith(KEEP):
                    target = name[4:]
                else:
                    continue
                if not member.isfile():
                    continue
                out = staging / target
                out.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as f, open(out, "wb") as g:
                    shutil.copyfileobj(f, g)
        if not (staging / "tex-mml-chtml.js").is_file():
            raise RuntimeError(f"mathjax@{VERSION} has no es5/tex-mml-chtml.js")
        (staging / "VERSION").write_text(f"mathjax {VERSION} npm\n")
        replace_dir(staging, DEST)


def write_cdn_loader() -> None:
    if DEST.exists():
        shutil.rmtree(DEST)
    DEST.mkdir(parents=True)
    (DEST / "tex-mml-chtml.js").write_text(CDN_LOADER)
    MARKER.write_text(f"mathjax {VERSION} cdn\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--require-local", action="store_true",
                        help="fail if the local copy cannot be made (the default when CI=true)")
    args = parser.parse_args(argv)
    require_local = args.require_local or os.environ.get("CI", "").lower() == "true"
    if current() == "npm":
        return 0
    try:
        fetch_npm()
        print(f"MathJax {VERSION}: local copy in {DEST.relative_to(ROOT)}", file=sys.stderr)
        return 0
    except (RuntimeError, OSError, subprocess.TimeoutExpired, tarfile.TarError) as e:
        if require_local:
            print(f"error: could not make a local copy of MathJax {VERSION}: {e}. "
                  "Install npm (e.g. `sudo apt-get install npm`) and try again.", file=sys.stderr)
            return 1
        if current() != "cdn":
            write_cdn_loader()
        print(f"note: could not make a local copy of MathJax {VERSION} ({e}); the book will load "
              f"MathJax from {CDN} and needs the internet to show math. Install npm and run "
              "`make book` again for an offline book.", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
