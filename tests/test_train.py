"""Training: the schedule, the loss, exact resumption after an interruption, and the commands."""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from attnbook import PAD_ID
from attnbook.batching import translation_loss
from attnbook.training.recipe import (MODELS, PEAK_LR, PRESETS, build_model, forward_logits, override,
                             preset)
from attnbook.schedules import noam_lr, warmup_cosine, warmup_cosine_scheduler, warmup_lr
from attnbook.training.runs import load_checkpoint
from attnbook.commands.train import train
from commandline import run_main

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k files")


def test_noam_schedule_warms_up_then_decays():
    lrs = [noam_lr(s, 512, 4000) for s in range(1, 20001)]
    peak = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak == 4000
    assert lrs[0] < lrs[1999] < lrs[3999]                        # linear warm-up
    assert lrs[15999] == pytest.approx(lrs[3999] * (4000 / 16000) ** 0.5)  # 1/sqrt(step) decay
    assert noam_lr(4000, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)


def test_peak_learning_rate_is_stated_not_derived():
    # the same curve as the paper's, with its peak named: equal for any d_model, warm-up, factor
    for d, w, f in ((512, 4000, 1.0), (128, 200, 0.5), (64, 10, 2.0)):
        peak = f * (d * w) ** -0.5
        for s in (1, w // 2, w, 3 * w, 50 * w):
            assert warmup_lr(s, peak, w) == pytest.approx(noam_lr(s, d, w, f), rel=1e-12)
    assert max(warmup_lr(s, 3e-3, 200) for s in range(1, 2000)) == pytest.approx(3e-3)
    # a preset's peak does not move when d_model or warm-up change
    cfg = override(preset("cpu-tiny"), d_model=256, warmup=400)
    assert cfg.peak_lr == PEAK_LR["cpu-tiny"]["transformer"]


def test_loss_ignores_padding_and_smooths_labels():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 10)
    tgt = torch.tensor([[4, 5, PAD_ID], [6, PAD_ID, PAD_ID]])
    real = tgt != PAD_ID
    expected = torch.nn.functional.cross_entropy(logits[real], tgt[real])
    torch.testing.assert_close(translation_loss(logits, tgt), expected)
    changed = logits.clone()
    changed[~real] = 100.0
    torch.testing.assert_close(translation_loss(changed, tgt), expected)
    # label smoothing: (1 - eps) * NLL + eps * mean over the vocabulary of -log p
    eps = 0.1
    logp = logits[real].log_softmax(-1)
    smooth = ((1 - eps) * -logp.gather(1, tgt[real][:, None])[:, 0] - eps * logp.mean(-1)).mean()
    torch.testing.assert_close(translation_loss(logits, tgt, eps), smooth)


@needs_data
def test_resuming_after_an_interruption_gives_exactly_the_same_model(tmp_path):
    cfg = override(PRESETS["smoke"], max_steps=8, eval_every=3, eval_sentences=4, dropout=0.1)
    straight = train(cfg, tmp_path / "a", device=torch.device("cpu"), progress=False)
    assert train(cfg, tmp_path / "b", device=torch.device("cpu"), progress=False,
                 stop_after=5) == {"interrupted_at_step": 5}
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 5
    resumed = train(cfg, tmp_path / "b", resume=True, device=torch.device("cpu"), progress=False)
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["val_loss"] == straight["val_loss"] and resumed["steps"] == 8
    # the metrics' validation loss is the final weights' (reused from the last evaluation)
    from attnbook.training.loop import prepare_data, validation_loss
    model = build_model(cfg)
    model.load_state_dict(a)
    log = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [3, 6, 8]
    assert straight["val_loss"] == log[-1]["val_loss"] == \
        validation_loss(model, prepare_data(cfg).val, torch.device("cpu"))
    assert straight["test_set"].startswith("test_2016_flickr (4 of 1000")
    assert "tok:13a" in straight["bleu_signature"] and "case:mixed" in straight["bleu_signature"]
    with pytest.raises(ValueError, match="another configuration"):
        train(override(cfg, d_model=64), tmp_path / "b", resume=True, progress=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(cfg, tmp_path / "c", resume=True, progress=False)


@needs_data
def test_time_budget_stops_training(tmp_path):
    cfg = replace(PRESETS["smoke"], max_steps=100_000, eval_every=1000, eval_sentences=2,
                  time_budget_s=1.0)
    metrics = train(cfg, tmp_path / "run", device=torch.device("cpu"), progress=False)
    assert 1 <= metrics["steps"] < 100_000 and 1.0 <= metrics["train_time_s"] < 30
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == metrics["steps"]     # the last step is evaluated and checkpointed
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == metrics["steps"]


@needs_data
@pytest.mark.parametrize("budget", [0.5, 0.9])
def test_the_step_that_spends_the_budget_is_evaluated(tmp_path, monkeypatch, budget):
    """A clock that moves 0.4 s each time it is read: the budget runs out at whichever reading,
    and the step that ran it out is still logged and checkpointed (once, a reading between the
    step's evaluation check and the loop's own check could end the run unlogged)."""
    from attnbook.training import loop
    readings = iter(0.4 * i for i in range(10_000))
    monkeypatch.setattr(loop.Run, "clock", lambda self: next(readings))
    cfg = replace(PRESETS["smoke"], max_steps=100, eval_every=1000, eval_sentences=2,
                  time_budget_s=budget)
    metrics = train(cfg, tmp_path / "run", device=torch.device("cpu"), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert metrics["steps"] < 100 and [e["step"] for e in log] == [metrics["steps"]]


@needs_data
def test_on_eval_sees_each_log_line_as_it_is_written(tmp_path):
    """Chapter 11 redraws its curve from these: the same lines as log.jsonl, in order."""
    seen = []
    cfg = replace(PRESETS["smoke"], max_steps=6, eval_every=3, eval_sentences=2)
    train(cfg, tmp_path / "run", device=torch.device("cpu"), progress=False, evaluate=False,
          on_eval=lambda line: seen.append((line["step"], line["val_loss"])))
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert seen == [(e["step"], e["val_loss"]) for e in log] and [s for s, _ in seen] == [3, 6]


@needs_data
def test_a_step_counts_its_tokens_before_the_batch_goes_to_the_device(tmp_path, monkeypatch):
    """On a GPU, counting a batch's tokens after ``.to(device)`` makes the CPU wait for the
    step before it, and the GPU then waits for the next batch: the loop counts them on the CPU."""
    from attnbook import batching

    class OnDevice(batching.Batch):
        @property
        def n_tgt_tokens(self):
            raise AssertionError("tokens counted on the device: a GPU sync at every step")

    to = batching.Batch.to
    monkeypatch.setattr(batching.Batch, "to",
                        lambda self, device: OnDevice(*vars(to(self, device)).values()))
    cfg = replace(PRESETS["smoke"], max_steps=2, eval_every=2, eval_sentences=2)
    metrics = train(cfg, tmp_path / "run", device=torch.device("cpu"), progress=False,
                    evaluate=False)
    assert metrics["steps"] == 2 and metrics["train_tokens"] > 0


@needs_data
def test_step_on_the_loops_batches_is_the_loops_step(tmp_path):
    """The loop benchmark times step_on alone: on the loop's own batches it trains the same
    weights, bit for bit, as train_step."""
    from attnbook.training.loop import next_groups, setup, step_on, train_step
    cfg = override(PRESETS["smoke"], max_steps=3, eval_every=3, eval_sentences=2, dropout=0.1)
    cpu = torch.device("cpu")
    a = setup(cfg, tmp_path / "a", device=cpu)
    a.model.train()
    for _ in range(3):
        train_step(a)
    b = setup(cfg, tmp_path / "b", device=cpu)        # seeded again: the same dropout masks
    b.model.train()
    for _ in range(3):
        batch = b.data.train.batch(next_groups(b, 1)[0])
        step_on(b, [batch.to(cpu)], batch.n_tgt_tokens)
    assert (a.step, a.tokens_seen) == (b.step, b.tokens_seen)
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(),
                                                 b.model.state_dict().values()))


def test_checkpoints_load_with_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    import argparse
    torch.save({"x": argparse.Namespace(code="anything a pickle could run")}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_checkpoint(path)


@needs_data
def test_train_and_translate_commands(tmp_path, capsys, monkeypatch):
    """The two commands as a reader runs them (``python -m``), then the translator's and the
    evaluator's answers to bad input, run in this process."""
    from attnbook.commands.evaluate import main as evaluate
    from attnbook.commands.translate import main as translate
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "attnbook.commands.train", "--preset", "smoke", "--out",
                           str(run), "--max-steps", "4", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["parameters"] > 0 and "hardware" in metrics
    out = subprocess.run([sys.executable, "-m", "attnbook.commands.translate", str(run), "--beam", "1",
                          "--device", "cpu"], input="Ein Hund.\nZwei Katzen.\n",
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout.splitlines()) == 2
    code, _, err = run_main(translate, [str(run), "--device", "cpu"], capsys, monkeypatch,
                            stdin="Ein Hund.\n\n")
    assert code == 2 and "line(s) [2] are empty" in err
    code, _, err = run_main(translate, [str(run), "--device", "cpu"], capsys, monkeypatch,
                            stdin="Ein Hund.\n" + "Ein Hund rennt. " * 200 + "\n")
    assert code == 2 and "line(s) [2] have more than 256 tokens" in err
    code, _, err = run_main(translate, [str(tmp_path / "nope")], capsys, monkeypatch,
                            stdin="Ein Hund.\n")
    assert code == 2 and "is not a run folder" in err
    code, out, err = run_main(evaluate, [str(run), "--beam", "1", "--sentences", "8", "--split",
                                         "val", "--device", "cpu", "--save",
                                         str(tmp_path / "hyps.txt")], capsys)
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["sentences"] == 8 and report["split"] == "val" and 0 <= report["bleu"] <= 100
    assert "tok:13a" in report["signature"]
    assert len((tmp_path / "hyps.txt").read_text().splitlines()) == 8


@pytest.mark.parametrize("args,message", [
    (["--max-steps", "0"], "--max-steps must be at least 1"),
    (["--peak-lr", "-1"], "--peak-lr must be positive"),
    (["--resume"], "--resume: no checkpoint in"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "device"),
    (["--model", "lstm"], "invalid choice: 'lstm'"),
])
def test_train_command_rejects_bad_arguments(tmp_path, capsys, args, message):
    from attnbook.commands.train import main
    code, _, err = run_main(main, ["--preset", "smoke", "--out", str(tmp_path / "run"), *args],
                            capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err[-1000:]
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_every_model_of_the_book_trains_with_the_same_harness():
    from attnbook.batching import make_batch
    src = [[5, 6, 7], [8, 9]]
    tgt = [[10, 11], [12, 13, 14, 15]]
    b = make_batch(src, tgt)
    for model in MODELS:
        cfg = preset("smoke", model)
        net = build_model(override(cfg, vocab_size=20))
        logits = forward_logits(net, b)
        assert logits.shape == (2, b.tgt_in.shape[1], 20)
        loss = translation_loss(logits, b.tgt_out)
        loss.backward()                              # every parameter is reachable from the loss
        assert all(p.grad is not None for p in net.parameters()), model
        assert cfg.peak_lr == PEAK_LR["smoke"][model]            # each model its own peak
    with pytest.raises(ValueError, match="unknown model 'lstm'"):
        preset("smoke", "lstm")
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


@needs_data
def test_two_processes_with_gloo_equal_one_process_with_the_same_global_batch(tmp_path):
    """`torchrun --nproc_per_node=2` runs the unchanged command; DDP averages the two ranks'
    gradients, which must equal one process accumulating the same two batches per step."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    common = ["--preset", "smoke", "--max-steps", "4", "--device", "cpu"]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", "-m", "attnbook.commands.train", "--out",
                          str(tmp_path / "ddp"), *common], capture_output=True, text=True,
                         env=env, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "attnbook.commands.train", "--out", str(tmp_path / "one"),
                          "--accum-steps", "2", *common], capture_output=True, text=True,
                         env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    a = load_checkpoint(tmp_path / "ddp" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "one" / "checkpoint.pt")
    assert a["world_size"] == 2 and b["world_size"] == 1 and a["step"] == b["step"] == 4
    assert a["next_batch"] == b["next_batch"] == 8            # 4 steps x 2 batches each
    init = build_model(preset("smoke")).state_dict()
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], atol=1e-5, rtol=1e-4)
    moved = max((a["model"][k] - init[k]).abs().max().item() for k in init)
    assert moved > 1e-3                                        # training did change the weights
    # only rank 0 wrote: one log line per evaluation, one metrics file
    assert len((tmp_path / "ddp" / "log.jsonl").read_text().splitlines()) == 1
    assert json.loads((tmp_path / "ddp" / "metrics.json").read_text())["processes"] == 2


@needs_data
def test_a_crash_between_log_line_and_checkpoint_logs_each_step_once(tmp_path, monkeypatch):
    """Killed after writing step 6's log line but before its checkpoint: the resumed run starts
    from step 3's checkpoint and logs step 6 again. Resuming trims the log to the checkpoint's
    step (a line cut by the crash goes too): one line per evaluation, equal to a run without the
    crash but for the clock, and bit-identical weights."""
    import attnbook.training.loop as train_module      # the loop's module: train.py is the command
    cfg = override(PRESETS["smoke"], max_steps=8, eval_every=3, eval_sentences=2, dropout=0.1)
    train(cfg, tmp_path / "a", device=torch.device("cpu"), progress=False)
    save = train_module.save_checkpoint

    def crash_at_step_6(path, **state):
        if state.get("step") == 6:
            raise KeyboardInterrupt("killed")
        save(path, **state)

    monkeypatch.setattr(train_module, "save_checkpoint", crash_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "b", device=torch.device("cpu"), progress=False)
    monkeypatch.setattr(train_module, "save_checkpoint", save)
    log_b = tmp_path / "b" / "log.jsonl"
    assert [json.loads(line)["step"] for line in log_b.read_text().splitlines()] == [3, 6]
    with open(log_b, "a") as f:
        f.write('{"step": 7, "train_lo')                  # and a line cut in the middle
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 3
    train(cfg, tmp_path / "b", resume=True, device=torch.device("cpu"), progress=False)

    def log(run):
        lines = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        return [{k: v for k, v in line.items() if k != "elapsed_s"} for line in lines]
    assert [line["step"] for line in log("b")] == [3, 6, 8]
    assert log("b") == log("a")
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a fresh run into the folder starts a fresh log
    train(replace(cfg, max_steps=3), tmp_path / "b", device=torch.device("cpu"), progress=False,
          evaluate=False)
    assert [line["step"] for line in log("b")] == [3]


@needs_data
def test_resuming_with_other_options_names_each_difference(tmp_path):
    cfg = replace(PRESETS["smoke"], max_steps=2, eval_every=2)
    train(cfg, tmp_path, device=torch.device("cpu"), progress=False, evaluate=False)
    with pytest.raises(ValueError, match=r"another configuration \(d_model: checkpoint 32, asked "
                                         r"64; dropout: checkpoint 0.0, asked 0.1\)"):
        train(override(cfg, d_model=64, dropout=0.1, max_steps=4), tmp_path, resume=True,
              progress=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*; train first, or drop --resume"):
        train(cfg, tmp_path / "none", resume=True, progress=False)


def test_warmup_cosine_rises_then_falls_to_zero_and_drives_the_optimiser():
    steps, warmup = 100, 10
    f = [warmup_cosine(s, warmup, steps) for s in range(1, steps + 1)]
    assert f[0] == pytest.approx(0.1) and max(f) == f[warmup - 1] == pytest.approx(
        0.5 * (1 + math.cos(math.pi * (warmup - 1) / steps)))
    assert all(a > b for a, b in zip(f[warmup - 1:], f[warmup:])) and f[-1] < 1e-3
    assert warmup_cosine(1, 0, steps) == 1.0                        # no warm-up
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_cosine_scheduler(opt, warmup, steps)
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2.0 * x for x in f])              # step k uses factor(k)
