"""The commands as a new user meets them: the recipe options, and every mistake (a bad option, a
missing or damaged file, an unusable input line) is one line ``error: <problem>; <fix>`` with
exit status 2, never a traceback."""
import io
import json
import os
import random
import sys
from pathlib import Path

import pytest

from attnbook.commands import evaluate
from attnbook.commands import train
from attnbook.commands import translate
from attnbook.cli import UsageError
from attnbook.training.options import parse_set
from attnbook.training.runs import RunError, load_checkpoint, load_run
from commandline import run_main

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")


def one_line_error(capsys, rc) -> str:
    """The error message of a command that failed as it should: exit status 2, one line."""
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    return err


def train_main(capsys, tmp_path, *args) -> str:
    rc = train.main(["--preset", "smoke", "--out", str(tmp_path / "run"), "--device", "cpu", *args])
    return one_line_error(capsys, rc)


# ---- the recipe options ------------------------------------------------------------------------

@pytest.mark.parametrize("item,expected", [
    ("eval_every=50", ("eval_every", 50)), ("dropout=0.25", ("dropout", 0.25)),
    ("time_budget_s=1.5", ("time_budget_s", 1.5)), ("norm_first=true", ("norm_first", True)),
    ("compile=no", ("compile", False)), ("snapshot_steps=100,200", ("snapshot_steps", (100, 200))),
    ("snapshot_steps=", ("snapshot_steps", ())), ("precision=fp32", ("precision", "fp32")),
    ("d-model=64", ("d_model", 64)), ("arch.d_k=16", ("d_k", 16)),
    ("arch.norm-first=1", ("norm_first", True)),
])
def test_set_parses_each_value_to_its_fields_type(item, expected):
    assert parse_set(item) == expected
    with pytest.raises(UsageError, match="unknown key 'nope'"):
        parse_set("nope=1")
    with pytest.raises(UsageError, match=r"unknown key 'arch.max_steps'; valid keys: .*max_steps"):
        parse_set("arch.max_steps=1")                 # only the model's fields are in arch


@pytest.mark.parametrize("args,message", [
    (["--set", "foo=1"], "error: --set foo=1: unknown key 'foo'; valid keys: preset, model, "
                         "vocab_size, d_model, h,"),
    (["--set", "eval_every"], "--set eval_every: expected KEY=VALUE; valid keys:"),
    (["--set", "eval_every=ten"], "--set eval_every=ten: 'ten' is not a valid eval_every; "
                                  "give an integer"),
    (["--set", "norm_first=maybe"], "give true or false"),
    (["--d-model", "100", "--heads", "3"], "--d-model 100 is not divisible by --heads 3; "),
    (["--d-model", "35", "--heads", "5"], "--d-model must be even"),
    (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    (["--label-smoothing", "-0.1"], "--label-smoothing must be in [0, 1)"),
    (["--layers", "0"], "--layers must be at least 1, got 0"),
    (["--set", "eval_every=0"], "--set eval_every must be at least 1, got 0"),
    (["--vocab-size", "-5"], "--vocab-size must be at least 1"),
    (["--warmup", "0"], "--warmup must be at least 1"),
    (["--peak-lr", "0"], "--peak-lr must be positive"),
    (["--set", "clip=-1"], "--set clip must be 0 or more"),
    (["--d-model", "64", "--set", "d_model=32"], "--d-model is given twice"),
    (["--heads", "2", "--set", "arch.h=4"], "--heads is given twice (--set arch.h=4)"),
    (["--set", "d_k=-1"], "--set d_k must be 0 or more, got -1"),
    (["--set", "arch.max_len=0"], "--set max_len must be at least 1, got 0"),
    (["--set", "model=lstm"], "unknown model 'lstm'"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
])
def test_bad_recipe_options_are_one_line_errors(args, message, tmp_path, capsys):
    assert message in train_main(capsys, tmp_path, *args)
    assert not (tmp_path / "run").exists()           # nothing written


def test_argparse_errors_are_one_line_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--preset", "smoke", "--out", str(tmp_path), "--d-model", "wide"])
    err = one_line_error(capsys, e.value.code)
    assert "--d-model: invalid int value: 'wide'" in err and "--help" in err


def test_recipe_options_override_the_preset_and_the_run_records_them(tmp_path, capsys):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files")
    run = tmp_path / "run"
    assert train.main(["--preset", "smoke", "--out", str(run), "--device", "cpu", "--max-steps",
                       "2", "--d-model", "48", "--heads", "3", "--layers", "2", "--d-ff", "40",
                       "--dropout", "0.2", "--warmup", "5", "--norm-first", "--max-tokens", "512",
                       "--label-smoothing", "0.05", "--set", "eval_every=1",
                       "--set", "eval_sentences=2", "--set", "arch.d_k=8"]) == 0
    arch = {"d_model": 48, "h": 3, "n_layers": 2, "d_ff": 40, "dropout": 0.2, "norm_first": True,
            "vocab_size": 1000, "d_k": 8, "max_len": 512}
    recipe = {"warmup": 5, "max_tokens": 512, "label_smoothing": 0.05, "eval_every": 1,
              "eval_sentences": 2, "max_steps": 2, "preset": "smoke"}
    config = json.loads((run / "config.json").read_text())       # nested: the model in "arch"
    assert {k: config["arch"][k] for k in arch} == arch and {k: config[k] for k in recipe} == recipe
    assert config == json.loads((run / "metrics.json").read_text())["config"]
    assert config == json.loads(json.dumps(load_checkpoint(run / "checkpoint.pt")["config"]))
    model, tok, cfg = load_run(run, "cpu")
    assert len(model.encoder) == len(model.decoder) == 2 and cfg.arch.norm_first
    assert model.encoder[0].self_attn.d_k == 8
    assert [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()] == [1, 2]


# ---- train: data, tokenizer and resume --------------------------------------------------------

@needs_data
@pytest.mark.parametrize("case", ["missing folder", "missing file", "corrupt file"])
def test_train_with_missing_or_damaged_data(case, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    if case != "missing folder":
        for f in Path(os.environ["MULTI30K_DIR"]).glob("*.gz"):
            (data / f.name).symlink_to(f.resolve())
        (data / "val.en.gz").unlink()
    if case == "corrupt file":
        real = (Path(os.environ["MULTI30K_DIR"]) / "val.en.gz").read_bytes()
        (data / "val.en.gz").write_bytes(real[:len(real) // 2])
    err = train_main(capsys, tmp_path, "--data-dir", str(data / ("nope" if case == "missing folder"
                                                                 else "")))
    if case == "corrupt file":
        assert f"checksum mismatch for {data / 'val.en.gz'}" in err and "download" in err
    else:
        assert "not found" in err and "Copy them there" in err


@needs_data
def test_train_with_a_vocabulary_sentencepiece_cannot_train(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNBOOK_CACHE", str(tmp_path / "cache"))
    err = train_main(capsys, tmp_path, "--vocab-size", "10")
    assert "could not train a 10-piece vocabulary" in err and "try a larger vocab_size" in err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run of 4 smoke steps (seconds), shared by this module's tests; copy it to damage it."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("needs the Multi30k files")
    out = tmp_path_factory.mktemp("cli") / "run"
    assert train.main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                       "--max-steps", "4"]) == 0
    return out


def test_resume_with_other_options_names_them(run, capsys):
    rc = train.main(["--preset", "smoke", "--out", str(run), "--device", "cpu", "--resume",
                     "--max-steps", "6", "--d-model", "64", "--layers", "2"])
    err = one_line_error(capsys, rc)
    assert err == (f"error: {run / 'checkpoint.pt'} was trained with another configuration "
                   "(d_model: checkpoint 32, asked 64; n_layers: checkpoint 1, asked 2); resume "
                   "with the options it was trained with (preset, flags and --nproc_per_node), "
                   "or train into a new --out folder\n")
    assert json.loads((run / "config.json").read_text())["arch"]["d_model"] == 32   # as it was
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 4


# ---- translate and evaluate on a damaged run folder -------------------------------------------

def damage(run: Path, case: str, tmp_path: Path) -> tuple[Path, str]:
    """A copy of ``run`` with one thing wrong, and a substring its error must contain."""
    import shutil
    bad = tmp_path / case.replace(" ", "-")
    shutil.copytree(run, bad)
    ckpt, tok = bad / "checkpoint.pt", bad / "tokenizer.model"
    if case == "no folder":
        shutil.rmtree(bad)
        return bad, f"{bad} is not a run folder; train one with `python -m attnbook train"
    if case == "no checkpoint":
        ckpt.unlink()
        return bad, (f"no checkpoint at {ckpt}; give the folder of a trained run, or train one "
                     f"with `python -m attnbook train --preset cpu-tiny --out {bad}`")
    if case == "no tokenizer":
        tok.unlink()
        return bad, f"no tokenizer at {tok}; copy the run's tokenizer.model from where it was"
    if case == "random bytes":
        ckpt.write_bytes(random.Random(0).randbytes(4096))
        return bad, f"{ckpt} is not a readable checkpoint ("
    if case == "text file":
        ckpt.write_text("not a checkpoint\n")
        return bad, f"{ckpt} is not a readable checkpoint ("
    if case == "truncated":
        data = ckpt.read_bytes()
        ckpt.write_bytes(data[:len(data) // 2])
        return bad, f"{ckpt} is not a readable checkpoint (RuntimeError: PytorchStreamReader"
    if case == "snapshot":
        import torch
        torch.save({"model": load_checkpoint(ckpt)["model"], "step": 4}, ckpt)
        return bad, f"{ckpt} holds weights only (a snapshot?)"
    if case == "damaged tokenizer":
        tok.write_bytes(b"junk")
        return bad, f"{tok} is not a tokenizer of attnbook"
    if case == "another tokenizer":
        from attnbook.tokenizer import multi30k_tokenizer
        shutil.copyfile(multi30k_tokenizer(4000).model_file, tok)
        return bad, f"{tok} has 4000 pieces but the model of {ckpt} was trained with 1000"
    raise AssertionError(case)


DAMAGE = ["no folder", "no checkpoint", "no tokenizer", "random bytes", "text file", "truncated",
          "snapshot", "damaged tokenizer", "another tokenizer"]


@pytest.mark.parametrize("case", DAMAGE)
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_damaged_run_folder_is_one_line_error(command, case, run, tmp_path, capsys,
                                                monkeypatch):
    bad, message = damage(run, case, tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
    module = translate if command == "translate" else evaluate
    err = one_line_error(capsys, module.main([str(bad), "--device", "cpu"]))
    assert message in err and "--resume" not in err
    assert "checkpoint.pt" in err or "tokenizer.model" in err or "run folder" in err


def test_library_errors_are_run_errors(run, tmp_path):
    bad, _ = damage(run, "truncated", tmp_path)
    with pytest.raises(RunError, match="not a readable checkpoint"):
        load_run(bad, "cpu")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):    # also a RunError
        load_run(damage(run, "no checkpoint", tmp_path)[0], "cpu")


# ---- unusable input lines name their line number ----------------------------------------------

INVISIBLE = ["\u200b", "\ufeff", "\u200e", " \u200b\u200e "]


@pytest.mark.parametrize("blank", INVISIBLE)
def test_translate_names_the_input_line_of_invisible_characters(blank, run, capsys, monkeypatch):
    lines = ["Ein Hund.", "Zwei Katzen spielen.", blank, "Ein Mann."]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    err = one_line_error(capsys, translate.main([str(run), "--device", "cpu", "--beam", "1"]))
    assert err.startswith("error: input line(s) [3] are empty or hold only invisible characters")


@pytest.mark.parametrize("blank", INVISIBLE)
def test_evaluate_names_the_file_line_of_invisible_characters(blank, run, tmp_path, capsys):
    src, ref = tmp_path / "s.de", tmp_path / "r.en"
    src.write_text(f"Ein Hund.\nZwei Katzen.\n{blank}\n", encoding="utf-8")
    ref.write_text("A dog.\nTwo cats.\nA man.\n", encoding="utf-8")
    err = one_line_error(capsys, evaluate.main([str(run), "--device", "cpu", "--src", str(src),
                                                "--ref", str(ref)]))
    assert err.startswith(f"error: --src {src}: line 3 holds only invisible characters")
    assert "remove it from both files" in err


def test_translate_reads_utf8_and_names_a_line_that_is_not(run, capsys, monkeypatch):
    stdin = lambda data: io.TextIOWrapper(io.BytesIO(data))           # noqa: E731
    monkeypatch.setattr(sys, "stdin", stdin("Ein Hund.\nÜber die Brücke.\n".encode("latin-1")))
    err = one_line_error(capsys, translate.main([str(run), "--device", "cpu"]))
    assert err.startswith("error: input line 2 is not UTF-8 text; convert the input to UTF-8")
    # a byte-order mark and Windows line ends are encoding, not text
    monkeypatch.setattr(sys, "stdin", stdin("\ufeffEin Hund.\r\nZwei Katzen.\r\n".encode()))
    assert translate.main([str(run), "--device", "cpu", "--beam", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    monkeypatch.setattr(sys, "stdin", stdin(b""))
    err = one_line_error(capsys, translate.main([str(run), "--device", "cpu"]))
    assert err == "error: no input; give one sentence per line on standard input\n"


def test_translate_and_evaluate_take_the_shared_options(run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
    err = one_line_error(capsys, translate.main([str(run), "--threads", "0"]))
    assert "--threads must be at least 1, got 0" in err
    err = one_line_error(capsys, evaluate.main([str(run), "--device", "tpu"]))
    assert "--device: unknown device 'tpu'" in err


def test_train_writes_a_result_only_of_a_named_experiment(tmp_path, capsys):
    """--result and --name go together, and --name is an experiment of the registry: one line
    and exit status 2 before anything is trained."""
    for more in (["--result", "r.json"], ["--name", "timing_2threads"],
                 ["--result", "r.json", "--name", "nothing"], ["--result", str(tmp_path / "r.json"),
                                                               "--name", "timing_2threads"]):
        rc, out, err = run_main(train.main, ["--preset", "smoke", "--out", str(tmp_path / "run"),
                                             *more], capsys)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


# ---- every command: a bad option is one line and exit status 2 ---------------------------------

# Every command of the package's table (attnbook.commands.COMMANDS), and the dispatcher itself.
from attnbook.commands import COMMANDS as TABLE  # noqa: E402
from attnbook.commands import FORMERLY, resolve  # noqa: E402

COMMANDS = ["__main__", *(module.removeprefix("attnbook.") for module, _ in TABLE.values())]


def test_the_table_of_commands_is_every_module_run_as_a_command():
    """A module with a __main__ guard is a command: it lives in attnbook/commands/ and is in the
    table, under its own name, and the table names nothing else: `python -m attnbook --help`
    lists every command."""
    src = Path(__file__).resolve().parents[1] / "src" / "attnbook"
    found = {".".join(p.relative_to(src).with_suffix("").parts) for p in src.rglob("*.py")
             if p.name != "__main__.py" and '__name__ == "__main__"' in p.read_text()}
    assert not list(src.rglob("*/__main__.py")), "a package's __main__.py: make it a command"
    assert found | {"__main__"} == set(COMMANDS) and len(COMMANDS) == len(set(COMMANDS))
    assert all(module == f"attnbook.commands.{name}" for name, (module, _) in TABLE.items())


def test_every_command_recorded_in_the_committed_results_names_one_of_today():
    """The commands that committed results record, some in an earlier layout of the package
    (python -m attnbook.experiments.toy_seeds ...), resolve to a command of the table."""
    root = Path(__file__).resolve().parents[1] / "results"
    recorded = set()
    for path in root.rglob("*.json"):
        res = json.loads(path.read_text())
        for call in res.get("calls", []) if isinstance(res, dict) else []:
            recorded |= {c for c in (call["command"], call.get("extra", {}).get("ran")) if c}
    assert len(recorded) > 40
    for command in recorded:
        today = resolve(command)
        assert today.split()[3] in (*TABLE, "run"), (command, today)
    assert resolve("python -m attnbook.experiments.toy_seeds --results results/cpu") == \
        "python -m attnbook toy_seeds --results results/cpu"
    assert resolve("python -m attnbook.experiments sweep --preset cpu-tiny") == \
        "python -m attnbook translators sweep --preset cpu-tiny"
    assert resolve("python -m attnbook run toy_seeds --tiny") == \
        "python -m attnbook run toy_seeds --tiny"
    assert set(FORMERLY.values()) <= set(TABLE)
    for bad in ("python -m attnbook.training.loop", "python -m attnbook nothing", "ls -l"):
        with pytest.raises(ValueError):
            resolve(bad)


def test_help_prints_the_table(capsys):
    from attnbook.__main__ import main
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name:<14} {help}" in out for name, (_, help) in TABLE.items())


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_rejects_a_bad_option_in_one_line_with_status_2(name, capsys):
    import importlib
    module = importlib.import_module(f"attnbook.{name}")
    rc, out, err = run_main(module.main, ["--no-such-option"], capsys)
    assert rc == 2, (rc, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "--no-such-option" in err or "required" in err, err
    prog = "attnbook" if name == "__main__" else f"attnbook {name.split('.')[-1]}"
    assert f"see `python -m {prog}" in err, err


def test_the_dispatcher_runs_every_command_by_name(capsys):
    from attnbook.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["toy_seeds", "--no-such-option"])         # = python -m attnbook toy_seeds ...
    assert e.value.code == 2 and "see `python -m attnbook toy_seeds" in capsys.readouterr().err


# ---- the models the package stores, by name ----------------------------------------------------

def test_translate_and_evaluate_use_a_stored_model_by_name(capsys, monkeypatch):
    """`translate --stored cpu-base` translates as load_stored("cpu-base") with translate() does;
    a stored name given as a folder, both or neither, and --average with a stored model are
    one-line errors that say what to give."""
    from attnbook.decoding import translate as translate_text
    from attnbook.training.runs import load_stored
    lines = ["Ein Hund rennt durch den Schnee.", "Zwei Frauen sitzen auf einer Bank."]
    model, tok, cfg = load_stored("cpu-base", "cpu")
    want = translate_text(model, tok, lines, beam_size=1, alpha=cfg.length_alpha)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert translate.main(["--stored", "cpu-base", "--beam", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines() == want
    for argv, message in ([["cpu-base"], "give --stored cpu-base"],
                          [[], "give a run folder or --stored NAME"],
                          [["runs/x", "--stored", "cpu-tiny"], "not both"],
                          [["--stored", "cpu-tiny", "--average", "5"], "leave --average out"]):
        for module in (translate, evaluate):
            monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
            assert message in one_line_error(capsys, module.main([*argv, "--device", "cpu"]))
    err = one_line_error(capsys, translate.main(["no/such/run", "--device", "cpu"]))
    assert "--stored cpu-base|cpu-tiny|gru-additive" in err
