"""Multi30k, Task 1: aligned image-caption translations in German, English and French.

    >>> from attnbook.data import load_multi30k
    >>> pairs = load_multi30k("train", src="de", tgt="en")
    >>> len(pairs), pairs[0]
    (29000, ('Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.',
             'Two young, White males are outside near many bushes.'))

Where the files come from, in this order:

1. a folder given as ``data_dir=...`` or in the environment variable ``MULTI30K_DIR``
   (an offline copy; CI and development machines use ``../shared/data/multi30k``);
2. the cache folder (``$ATTNBOOK_CACHE/multi30k``, by default ``~/.cache/attnbook/multi30k``),
   filled on first use by downloading the raw ``.gz`` files from the official
   ``multi30k/dataset`` GitHub repository.

Every file is checked against a pinned sha256 sum before it is read, so a truncated download or a
different version of the data set is caught instead of silently changing the book's results.
Command line (``commands/data.py``): ``python -m attnbook data download`` fetches all files;
``python -m attnbook data verify DIR`` checks a folder.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("de", "en", "fr")
ENV_DIR = "MULTI30K_DIR"
ENV_CACHE = "ATTNBOOK_CACHE"
URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"

# sha256 of the raw files of data/task1/raw in multi30k/dataset (commit a3d2e0d).
SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}
SIZES = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}


class DataError(RuntimeError):
    """The data could not be loaded; the message says why and how to fix it."""


def cache_dir() -> Path:
    """The book's cache folder: ``$ATTNBOOK_CACHE`` or ``~/.cache/attnbook``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "attnbook")


def file_name(split: str, lang: str) -> str:
    """The file name of one side of one split, e.g. ``train.de.gz``; checks both arguments."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: Multi30k Task 1 has the splits "
                        f"{', '.join(SPLITS)}")
    if lang not in LANGUAGES:
        raise DataError(f"unknown language {lang!r}: Multi30k Task 1 has the languages "
                        f"{', '.join(LANGUAGES)}")
    return f"{split}.{lang}.gz"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, name: str | None = None) -> None:
    """Raise DataError unless ``path`` has the pinned sha256 sum of file ``name``."""
    name = name or path.name
    got = sha256(path)
    if got != SHA256[name]:
        raise DataError(
            f"checksum mismatch for {path}: expected sha256 {SHA256[name]}, got {got}. "
            "The file is damaged (an interrupted download?) or is not the published Multi30k "
            f"file. Delete it and run `python -m attnbook data download`, or copy the file "
            f"again from {URL.format(name=name)}")


def download(name: str, dest: Path, timeout: float = 60.0) -> Path:
    """Download one raw file into ``dest`` (atomically), verify it and return its path."""
    url = URL.format(name=name)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / name
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, \
                tempfile.NamedTemporaryFile(dir=dest, delete=False, suffix=".part") as tmp:
            shutil.copyfileobj(response, tmp)
    except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"could not download {url} ({e}). Without network access, put the nine Multi30k "
            f"files ({', '.join(sorted(SHA256))}) in a folder and point the book at it: "
            f"`export {ENV_DIR}=/path/to/folder` or `load_multi30k(..., data_dir=...)`. "
            f"Get them from {URL.format(name='')} on a machine with network access.") from e
    tmp_path = Path(tmp.name)
    try:
        verify(tmp_path, name)
    except DataError:
        tmp_path.unlink(missing_ok=True)
        raise
    tmp_path.replace(target)
    return target


def locate(split: str, lang: str, data_dir: str | os.PathLike | None = None,
           download_missing: bool = True) -> Path:
    """The verified local path of one raw file, downloading it into the cache if needed."""
    name = file_name(split, lang)
    folder = data_dir if data_dir is not None else os.environ.get(ENV_DIR)
    if folder:
        path = Path(folder).expanduser() / name
        if not path.is_file():
            source = "data_dir" if data_dir is not None else f"${ENV_DIR}"
            raise DataError(
                f"{path} not found: {source} points at {folder}, which should hold the raw "
                f"Multi30k files ({', '.join(sorted(SHA256))}). Copy them there from "
                f"{URL.format(name='')}, or "
                + ("give no data folder" if data_dir is not None else f"unset {ENV_DIR}")
                + " to download them into the cache.")
        verify(path, name)
        return path
    path = cache_dir() / "multi30k" / name
    if path.is_file():
        verify(path, name)
        return path
    if not download_missing:
        raise DataError(f"{path} is not in the cache; run `python -m attnbook data download` "
                        f"or set {ENV_DIR} to a folder that holds the files.")
    return download(name, path.parent)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a gzip-compressed UTF-8 text file, without their line breaks."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
            text = f.read()
    except FileNotFoundError:
        raise DataError(f"{path} not found") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path} is not a readable gzip-compressed UTF-8 text file ({e}). "
                        "Delete it and download it again.") from e
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line break ends the last line; it does not start a new one
    return [line.rstrip("\r") for line in lines]


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> list[tuple[str, str]]:
    """Read two line-aligned gzip files into (source, target) pairs.

    Line i of one file must be the translation of line i of the other. Raises DataError when the
    two files have different numbers of lines or when a line is empty (nothing is dropped
    silently: an empty sentence means the files are not what they should be).
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"the two sides are not aligned: {src_path} has {len(src)} lines but "
                        f"{tgt_path} has {len(tgt)}. Line i of one file must translate line i "
                        "of the other; check that both files come from the same split.")
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (" ..." if len(empty) > 5 else "")
            raise DataError(f"{path} has {len(empty)} empty line(s) (line {shown}); every line "
                            "must hold a sentence. Remove those pairs from both files.")
    return [(s.strip(), t.strip()) for s, t in zip(src, tgt)]


def load_multi30k(split: str = "train", src: str = "de", tgt: str = "en",
                  data_dir: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """Load one split of Multi30k Task 1 as a list of (source sentence, target sentence).

    split: "train" (29,000 pairs), "val" (1,014) or "test_2016_flickr" (1,000).
    src, tgt: two of "de", "en", "fr".
    data_dir: a folder holding the raw ``<split>.<lang>.gz`` files; by default ``$MULTI30K_DIR``,
        else the cache, downloading on first use.
    """
    if src == tgt:
        raise DataError(f"source and target are both {src!r}: choose two different languages "
                        f"from {', '.join(LANGUAGES)}")
    file_name(split, src), file_name(split, tgt)  # check all arguments before touching files
    src_path = locate(split, src, data_dir)
    tgt_path = locate(split, tgt, data_dir)
    return read_parallel(src_path, tgt_path)
