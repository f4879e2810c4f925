"""The run's configuration (chapter 9): a TrainConfig holds its model's TransformerConfig
(``arch``); override changes any field by name; check_config refuses what cannot train;
configs saved flat by older runs are read as the nested ones of today."""
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from attnbook.experiments import ablations
from attnbook.commands import ablations as ablations_command
from attnbook.experiments import sweeps
from attnbook.experiments.ablations import VARIANTS
from attnbook.experiments.translators import BASE_CANDIDATES, base_jobs
from attnbook.training.recipe import (FIELDS, PRESETS, ConfigError, TrainConfig, build_model, check_config,
                             differences, override, preset, same_run, upgrade_config)
from attnbook.training.runs import RunError, load_checkpoint, load_run
from attnbook.commands.train import train
from attnbook.transformer import TransformerConfig

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")

RESULTS = Path(__file__).parents[1] / "results" / "cpu"
# The fields of TrainConfig before it held ``arch`` (commit 39ea47c): the model's beside the
# recipe's. Runs trained by that code (and the result files they wrote) save these.
FLAT_FIELDS = ("preset", "model", "d_model", "h", "d_ff", "n_layers", "dropout", "norm_first",
               "positional", "learned_std", "d_k", "vocab_size", "max_tokens", "max_steps",
               "warmup", "peak_lr", "label_smoothing", "clip", "seed", "snapshot_steps",
               "eval_every", "beam_size", "length_alpha", "eval_sentences", "time_budget_s",
               "accum_steps", "precision", "compile", "src_lang", "tgt_lang")


def saved_flat(cfg: TrainConfig) -> dict:
    """``cfg`` as the code before ``arch`` saved it: one flat dict, tuples as JSON lists."""
    both = {**asdict(cfg), **asdict(cfg.arch)}
    return json.loads(json.dumps({k: both[k] for k in FLAT_FIELDS}))


def test_a_train_config_holds_its_model_config():
    cfg = preset("cpu-tiny")
    assert isinstance(cfg.arch, TransformerConfig)
    assert (cfg.arch.vocab_size, cfg.arch.d_model, cfg.arch.h, cfg.arch.n_layers) == (4000, 128, 4, 2)
    assert not {f for f in FIELDS if hasattr(cfg, f) and hasattr(cfg.arch, f)}   # said once
    saved = asdict(cfg)                                   # what config.json holds
    assert saved["arch"]["d_model"] == 128 and "d_model" not in saved
    assert TrainConfig.from_dict(json.loads(json.dumps(saved))) == cfg
    # the model is built from arch alone: its vocabulary is arch.vocab_size
    assert build_model(cfg).embed.num_embeddings == 4000
    assert build_model(replace(cfg, model="gru")).encoder.embed.num_embeddings == 4000


def test_override_takes_the_recipe_and_the_model_fields_by_name():
    cfg = preset("smoke")
    new = override(cfg, d_model=64, max_steps=3, **{"arch.h": 4})
    assert (new.arch.d_model, new.arch.h, new.max_steps) == (64, 4, 3)
    assert (cfg.arch.d_model, cfg.arch.h, cfg.max_steps) == (32, 2, 20)  # cfg itself unchanged
    assert override(cfg, **{"arch.d_model": 64}) == override(cfg, d_model=64)
    assert override(cfg) == cfg
    with pytest.raises(ConfigError, match=r"unknown key 'width'; valid keys: preset, model, "
                                          r"vocab_size, d_model, .*, tgt_lang"):
        override(cfg, width=64)
    with pytest.raises(ConfigError, match="unknown key 'arch.max_steps'"):
        override(cfg, **{"arch.max_steps": 3})            # arch holds the model's fields only
    with pytest.raises(ConfigError, match=r"d_model is given twice \(d_model, arch.d_model\)"):
        override(cfg, d_model=64, **{"arch.d_model": 32})


def test_a_preset_is_not_changed_through_the_configs_made_from_it():
    cfg = preset("smoke")
    cfg.arch.d_model = 999
    override(preset("smoke"), n_layers=5)
    assert PRESETS["smoke"].arch.d_model == 32 and preset("smoke").arch.n_layers == 1
    assert replace(preset("smoke"), max_steps=3).arch == PRESETS["smoke"].arch


@pytest.mark.parametrize("changes,message", [
    (dict(d_model=100, h=3), "d_model 100 is not divisible by h 3;"),
    (dict(d_model=0), "d_model must be at least 1, got 0"),
    (dict(max_len=0), "max_len must be at least 1, got 0"),
    (dict(d_k=-1), "d_k must be 0 or more, got -1"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
    (dict(label_smoothing=float("nan")), r"label_smoothing must be in \[0, 1\)"),
    (dict(eval_every=0), "eval_every must be at least 1, got 0"),
    (dict(peak_lr=0.0), "peak_lr must be positive"),
    (dict(precision="fp8"), "precision 'fp8': choose one of auto, fp32, bf16, fp16"),
    (dict(positional="rotary"), "positional 'rotary': choose sinusoidal, learned or none"),
    (dict(snapshot_steps=(0, 5)), r"snapshot_steps: steps must be at least 1, got \(0, 5\)"),
])
def test_check_config_names_the_field(changes, message):
    cfg = override(preset("smoke"), **changes)
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)
    with pytest.raises(ValueError):                       # a ValueError, for callers
        check_config(cfg)
    check_config(preset("smoke"))                          # the presets pass
    check_config(override(preset("smoke", "gru"), d_model=33))   # a GRU needs no heads


def test_flat_configs_of_older_runs_are_upgraded_to_nested_ones():
    cfg = override(preset("cpu-tiny"), positional="learned", d_k=16, seed=2, snapshot_steps=(5,))
    flat = saved_flat(cfg)
    assert "arch" not in flat and flat["d_k"] == 16
    assert upgrade_config(flat) == asdict(cfg)
    assert TrainConfig.from_dict(flat) == cfg
    assert same_run(flat, asdict(cfg)) and differences(flat, asdict(cfg)) == {}
    # older still: no positional, learned_std or d_k (sinusoidal, 0.02, d_model / h), bf16
    oldest = {k: v for k, v in saved_flat(preset("cpu-tiny")).items()
              if k not in ("positional", "learned_std", "d_k", "precision")}
    assert TrainConfig.from_dict({**oldest, "bf16": True}) == preset("cpu-tiny")
    # a difference is named by the field's name, the model's too; EXTENDABLE ones do not count
    assert differences(flat, asdict(override(cfg, h=8, max_steps=5))) == {"h": (4, 8)}
    assert not same_run(flat, asdict(override(cfg, max_len=1024)))


def test_the_committed_results_describe_the_same_runs_as_the_code():
    """The result files were written flat; their runs are the runs today's code would train."""
    tiny = json.loads((RESULTS / "cpu_tiny_transformer_2threads.json").read_text())["config"]
    assert "arch" not in tiny and same_run(tiny, asdict(preset("cpu-tiny")))
    base = json.loads((RESULTS / "cpu_base.json").read_text())["runs"]
    for run, (cfg, folder) in zip(base, base_jobs(Path("runs"))):
        assert run["candidate"] == folder.name and same_run(run["config"], asdict(cfg))
    assert override(preset("cpu-base"), **BASE_CANDIDATES["tiny-long"]).arch == \
        replace(preset("cpu-tiny").arch, dropout=0.1)     # cpu-tiny's model, with dropout


def test_each_ablation_changes_what_its_recorded_overrides_say():
    """results/cpu/ablations.json records each variant's overrides, by flat name: they still
    describe the variant, and each changes cpu-tiny's Transformer in those fields alone."""
    recorded = json.loads((RESULTS / "ablations.json").read_text())["variants"]
    assert recorded and all(v["overrides"] == VARIANTS[v["variant"]][2] for v in recorded)
    base = asdict(preset("cpu-tiny"))
    for name, (_, _, changes) in VARIANTS.items():
        cfg = override(preset("cpu-tiny"), **changes)
        assert differences(base, asdict(cfg)) == {k: (base["arch"].get(k, base.get(k)), v)
                                                 for k, v in changes.items()}, name
    assert override(preset("cpu-tiny"), **VARIANTS["d-k-8"][2]).arch.d_k == 8
    assert override(preset("cpu-tiny"), **VARIANTS["no-label-smoothing"][2]).label_smoothing == 0


@needs_data
def test_a_run_folder_saved_flat_is_the_same_run_loads_and_resumes(tmp_path, monkeypatch):
    """Runs trained before TrainConfig held ``arch`` (the ablations being trained as this was
    written) saved the config flat in metrics.json and the checkpoint. A call of ``ablations``
    must take them as its own runs (sweeps._train_one: same_run on metrics.json's config)
    and score them without training again; load_run and --resume read them too."""
    monkeypatch.chdir(tmp_path)
    args = ["--out", "abl", "--variants", "d-k-16", "--seeds", "0", "--steps", "2", "--jobs", "1"]
    assert ablations_command.main(args) == 0                      # trains the run; no --results
    (folder,) = (tmp_path / "abl" / "d-k-16").iterdir()
    metrics = json.loads((folder / "metrics.json").read_text())
    cfg = TrainConfig.from_dict(metrics["config"])
    assert cfg.arch.d_k == 16 and cfg.max_steps == 2
    # write its configs back the old way: flat, and the checkpoint with its vocab_size
    (folder / "metrics.json").write_text(json.dumps({**metrics, "config": saved_flat(cfg)}))
    ckpt = load_checkpoint(folder / "checkpoint.pt")
    torch.save({**ckpt, "config": saved_flat(cfg), "vocab_size": cfg.arch.vocab_size},
               folder / "checkpoint.pt")
    assert "arch" not in load_checkpoint(folder / "checkpoint.pt")["config"]
    stamps = {f: f.stat().st_mtime_ns for f in folder.iterdir()}

    def no_training(*a, **kw):
        raise AssertionError("the flat run was not recognised: it would be trained again")
    monkeypatch.setattr(sweeps, "train", no_training)
    assert ablations_command.main([*args, "--results", "results", "--sentences", "2"]) == 0
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps    # nothing of the run rewritten
    (variant,) = json.loads((tmp_path / "results" / "ablations.json").read_text())["variants"]
    assert variant["variant"] == "d-k-16" and variant["overrides"] == {"d_k": 16}
    assert variant["runs"][0]["parameters"] == metrics["parameters"]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    model, tok, loaded = load_run(folder, "cpu")          # the flat checkpoint loads
    # (the flat format predates val_sentences: such a run validated on every sentence)
    assert loaded == replace(cfg, val_sentences=0) and model.encoder[0].self_attn.d_k == 16
    assert all(torch.equal(v, ckpt["model"][k]) for k, v in model.state_dict().items())
    with pytest.raises(RunError, match=r"another configuration \(h: checkpoint 4, asked 8\)"):
        train(override(cfg, h=8, max_steps=3), folder, resume=True, progress=False)
    more = train(override(cfg, max_steps=3), folder, resume=True, progress=False, evaluate=False)
    assert more["steps"] == 3 and more["config"] == asdict(override(cfg, max_steps=3))
    assert load_checkpoint(folder / "checkpoint.pt")["config"]["arch"]["d_k"] == 16   # now nested
