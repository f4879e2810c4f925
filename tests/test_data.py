"""The Multi30k loader: real data, the download path, and every error it promises."""
import gzip
import http.server
import os
import shutil
import threading
from functools import partial
from pathlib import Path

import pytest

from attnbook import data
from attnbook.data import DataError, load_multi30k, read_lines, read_parallel
from attnbook.commands.data import main as data_command

REAL = os.environ.get(data.ENV_DIR)
needs_real = pytest.mark.skipif(not REAL, reason=f"set {data.ENV_DIR} to the offline Multi30k copy")


def write_gz(path: Path, lines) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No offline copy, an empty cache, and a download URL nothing listens on."""
    monkeypatch.delenv(data.ENV_DIR, raising=False)
    monkeypatch.setenv(data.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(data, "URL", "http://127.0.0.1:9/{name}")
    return tmp_path


@needs_real
@pytest.mark.parametrize("split", data.SPLITS)
def test_real_splits_are_aligned_and_complete(split):
    for src, tgt in (("de", "en"), ("en", "fr")):
        pairs = load_multi30k(split, src, tgt)
        assert len(pairs) == data.SIZES[split]
        assert all(s and t for s, t in pairs)
    de_en = load_multi30k(split, "de", "en")
    en_de = load_multi30k(split, "en", "de")
    assert de_en[0] == en_de[0][::-1]


@needs_real
def test_first_training_pair_is_the_published_one():
    assert load_multi30k("train")[0] == (
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Two young, White males are outside near many bushes.")


@pytest.mark.parametrize("split,lang,word", [("dev", "en", "unknown split"),
                                             ("train", "cs", "unknown language")])
def test_unknown_split_or_language_lists_the_valid_ones(split, lang, word):
    with pytest.raises(DataError, match=word) as e:
        load_multi30k(split, "de", lang, data_dir="/nonexistent")
    assert "train, val, test_2016_flickr" in str(e.value) or "de, en, fr" in str(e.value)


def test_same_source_and_target_is_refused():
    with pytest.raises(DataError, match="both 'en'"):
        load_multi30k("val", "en", "en")


def test_no_network_and_no_local_copy_says_how_to_get_the_files(isolated):
    with pytest.raises(DataError) as e:
        load_multi30k("val")
    msg = str(e.value)
    assert "could not download" in msg and data.ENV_DIR in msg and "val.de.gz" in msg
    assert not list((isolated / "cache" / "multi30k").glob("*.gz"))


def test_missing_file_in_local_folder_is_named(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"val\.de\.gz not found.*data_dir") as e:
        load_multi30k("val", data_dir=tmp_path)
    assert "give no data folder" in str(e.value) and "unset" not in str(e.value)
    monkeypatch.setenv(data.ENV_DIR, str(tmp_path))        # the folder came from the variable
    with pytest.raises(DataError, match=rf"\${data.ENV_DIR} points at .*unset {data.ENV_DIR}"):
        load_multi30k("val")


@needs_real
def test_checksum_mismatch_in_local_folder(tmp_path):
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copy(Path(REAL) / name, tmp_path / name)
    raw = bytearray((tmp_path / "val.en.gz").read_bytes())
    raw[100] ^= 0xFF
    (tmp_path / "val.en.gz").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"checksum mismatch for .*val\.en\.gz.*Delete it"):
        load_multi30k("val", data_dir=tmp_path)


@pytest.fixture
def server(tmp_path):
    """A local HTTP server standing in for GitHub, serving files from tmp_path/'remote'."""
    root = tmp_path / "remote"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}/{{name}}"
    httpd.shutdown()


def test_download_verifies_and_caches(isolated, server, monkeypatch):
    root, url = server
    write_gz(root / "val.de.gz", ["Ein Hund.", "Zwei Katzen."])
    write_gz(root / "val.en.gz", ["A dog.", "Two cats."])
    monkeypatch.setattr(data, "URL", url)
    monkeypatch.setitem(data.SHA256, "val.de.gz", data.sha256(root / "val.de.gz"))
    monkeypatch.setitem(data.SHA256, "val.en.gz", data.sha256(root / "val.en.gz"))
    assert load_multi30k("val") == [("Ein Hund.", "A dog."), ("Zwei Katzen.", "Two cats.")]
    assert (isolated / "cache" / "multi30k" / "val.de.gz").is_file()
    for f in root.iterdir():           # the second load reads the cache, not the server
        f.unlink()
    assert len(load_multi30k("val")) == 2


def test_download_with_wrong_checksum_leaves_nothing_behind(isolated, server, monkeypatch):
    root, url = server
    write_gz(root / "val.de.gz", ["Not the real file."])
    monkeypatch.setattr(data, "URL", url)
    with pytest.raises(DataError, match="checksum mismatch"):
        load_multi30k("val")
    assert not list((isolated / "cache" / "multi30k").iterdir())


def test_unreadable_gzip(tmp_path):
    (tmp_path / "plain.gz").write_text("this is not gzip\n")
    with pytest.raises(DataError, match="not a readable gzip"):
        read_lines(tmp_path / "plain.gz")
    full = write_gz(tmp_path / "full.gz", [f"sentence {i}" for i in range(2000)]).read_bytes()
    (tmp_path / "cut.gz").write_bytes(full[: len(full) // 2])
    with pytest.raises(DataError, match="not a readable gzip"):
        read_lines(tmp_path / "cut.gz")


def test_misaligned_sides_name_both_counts(tmp_path):
    a = write_gz(tmp_path / "a.gz", ["one", "two", "three"])
    b = write_gz(tmp_path / "b.gz", ["eins", "zwei"])
    with pytest.raises(DataError, match=r"a\.gz has 3 lines but .*b\.gz has 2"):
        read_parallel(a, b)


def test_empty_sentence_is_an_error_not_a_silent_skip(tmp_path):
    a = write_gz(tmp_path / "a.gz", ["one", "", "three"])
    b = write_gz(tmp_path / "b.gz", ["eins", "zwei", "drei"])
    with pytest.raises(DataError, match=r"1 empty line\(s\) \(line 2\)"):
        read_parallel(a, b)


def test_lines_keep_inner_whitespace_and_unicode(tmp_path):
    a = write_gz(tmp_path / "a.gz", ["Größe  und Maß", "  x  "])
    assert read_lines(a) == ["Größe  und Maß", "  x  "]


def test_cli_verify(tmp_path, capsys):
    assert data_command(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "not found; download" in err
    if REAL:
        assert data_command(["verify", REAL]) == 0
        assert capsys.readouterr().out.count("ok") == 9


def test_download_checks_the_folder_multi30k_dir_names_instead_of_downloading(isolated, monkeypatch,
                                                                               capsys):
    """The set-up cell's `data download` where $MULTI30K_DIR is set (an offline copy): that folder
    is what the loader reads, so it is checked; nothing is downloaded into the cache."""
    folder = isolated / "copy"
    folder.mkdir()
    monkeypatch.setenv(data.ENV_DIR, str(folder))
    assert data_command(["download"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"$MULTI30K_DIR points at {folder}" in err and not (isolated / "cache").exists()
    if REAL:
        monkeypatch.setenv(data.ENV_DIR, REAL)
        assert data_command(["download"]) == 0
        assert capsys.readouterr().out.count("ok  ") == 9 and not (isolated / "cache").exists()
