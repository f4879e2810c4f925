"""Put a local copy of onnxruntime-web where the translator page loads it from.

    python tools/fetch_ort.py          # what `make book` and `make test` run; quick when the copy is there

The page (book/translator.md) runs the book's model in the reader's browser with onnxruntime-web
on one WebAssembly thread, which needs no special headers from the server. The three files it
loads come from the npm package ``onnxruntime-web@VERSION``, fetched with ``npm pack`` and checked
against the tarball's pinned sha256, into ``_build/vendor/ort/``; ``html_extra_path`` in
``_config.yml`` copies ``_build/vendor`` into the built HTML, so the page asks no other host for
anything. Without npm (or with a tarball that does not match) the book still builds and the
page says that its runtime is missing.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fetch_mathjax import npm_pack, replace_dir   # tools/ is the script's own folder

VERSION = "1.30.0"
SHA256 = "d2228df7e4616bc3348bf504ee888f3bec43789a273f0a63f3e68d203ce3bf71"   # of the npm tarball
ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "_build" / "vendor" / "ort"
# the single-threaded WebAssembly build: its loader, the module it imports, and the runtime (and
# package.json, which names its licence, MIT)
KEEP = ("package.json", "dist/ort.wasm.min.js", "dist/ort-wasm-simd-threaded.mjs",
        "dist/ort-wasm-simd-threaded.wasm")


def current() -> bool:
    marker = DEST / "VERSION"
    return marker.is_file() and marker.read_text().split() == ["onnxruntime-web", VERSION, SHA256]


def fetch() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tarball = npm_pack(f"onnxruntime-web@{VERSION}", tmp)
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if digest != SHA256:
            raise RuntimeError(f"onnxruntime-web@{VERSION} has sha256 {digest}, not the pinned "
                               f"{SHA256}: refusing it")
        staging = tmp / "ort"
        staging.mkdir()
        with tarfile.open(tarball) as tar:
            for name in KEEP:
                with tar.extractfile(f"package/{name}") as f, open(staging / Path(name).name, "wb") as g:
                    shutil.copyfileobj(f, g)
        (staging / "VERSION").write_text(f"onnxruntime-web {VERSION} {SHA256}\n")
        replace_dir(staging, DEST)


def main() -> int:
    if current():
        return 0
    try:
        fetch()
        print(f"onnxruntime-web {VERSION}: local copy in {DEST.relative_to(ROOT)}", file=sys.stderr)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, tarfile.TarError, KeyError) as e:
        print(f"note: no local copy of onnxruntime-web {VERSION} ({e}); the translator page will "
              "say that its runtime is missing. Install npm and run `make book` again.",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
