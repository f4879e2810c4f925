"""The GPU code path, exercised on the CPU: the precision each device gets (on faked device
capabilities), bf16 autocast and fp16 with a GradScaler in real training steps (with exact
resumption), and torch.compile (the same losses as eager, one graph for every batch shape)."""
import contextlib
import json
import math
import os
from dataclasses import replace

import pytest
import torch

from attnbook.training.recipe import TrainConfig, build_model, preset, same_run
from attnbook.training.runs import load_checkpoint
from attnbook.commands.train import main, prepare_data, train
from attnbook import utils
from attnbook.utils import choose_precision, deterministic, get_device

needs_data = pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"),
                                reason="needs the Multi30k files")
CPU = torch.device("cpu")


def fake_cuda(monkeypatch, capability: tuple[int, int]):
    """Pretend a CUDA GPU of this compute capability is there. Like the real
    torch.cuda.is_bf16_supported, the fake says yes to an older GPU when emulation counts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True:
                        capability >= (8, 0) or including_emulation)


@pytest.mark.parametrize("name,capability,expected", [
    ("H100", (9, 0), ("bf16", torch.bfloat16, False)),
    ("A100", (8, 0), ("bf16", torch.bfloat16, False)),
    ("T4", (7, 5), ("fp16", torch.float16, True)),     # Colab's free GPU: no bf16 tensor cores
    ("V100", (7, 0), ("fp16", torch.float16, True)),
])
def test_a_cuda_gpu_gets_bf16_if_it_has_it_else_fp16_with_a_scaler(monkeypatch, name, capability,
                                                                   expected):
    fake_cuda(monkeypatch, capability)
    p = choose_precision(torch.device("cuda"))
    assert (p.name, p.dtype, p.use_scaler) == expected, name
    assert p.reason                                     # says why, in a line
    if capability < (8, 0):
        assert "7." in p.reason and "GradScaler" in p.reason


def test_mps_gets_fp16_with_a_scaler_and_the_cpu_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.delenv("ATTNBOOK_DEVICE", raising=False)
    mac = get_device()                                  # a Mac: no CUDA, MPS available
    assert mac.type == "mps"
    p = choose_precision(mac)
    assert (p.name, p.dtype, p.use_scaler) == ("fp16", torch.float16, True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    p = choose_precision(get_device())                  # a laptop without either
    assert (p.name, p.dtype, p.use_scaler) == ("fp32", None, False)
    assert isinstance(p.autocast(CPU), contextlib.nullcontext)
    assert not p.grad_scaler(CPU).is_enabled()


def fake_cpu(monkeypatch, machine: str, flags: set, capability: str = "AVX512"):
    """Pretend to be a CPU of this architecture, with these feature flags and PyTorch kernels."""
    monkeypatch.setattr(utils.platform, "machine", lambda: machine)
    monkeypatch.setattr(utils, "_cpu_flags", lambda: set(flags))
    monkeypatch.setattr(utils, "cpu_capability", lambda: capability)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


@pytest.mark.parametrize("machine,flags,capability,native", [
    ("x86_64", {"avx2", "avx512f", "avx512_bf16"}, "AVX512", True),     # Zen 4, Cooper Lake
    ("x86_64", {"avx2", "avx512f", "amx_bf16", "amx_tile"}, "AVX512", True),   # Sapphire Rapids
    ("x86_64", {"avx2", "fma"}, "AVX2", False),                         # a laptop, Colab's VMs
    ("x86_64", {"avx2", "avx512f"}, "AVX512", False),                   # Skylake-X: no BF16
    ("x86_64", {"avx2", "avx512f", "avx512_bf16"}, "AVX2", False),      # ATEN_CPU_CAPABILITY=avx2
    ("aarch64", {"fp", "asimd", "bf16"}, "DEFAULT", True),              # Graviton 3, Linux
    ("arm64", {"feat_bf16"}, "DEFAULT", True),                          # Apple M2 and later
    ("arm64", {"feat_fp16"}, "DEFAULT", False),                         # Apple M1
    ("riscv64", set(), "DEFAULT", False),
])
def test_native_bf16_is_read_from_the_cpus_flags(monkeypatch, machine, flags, capability, native):
    fake_cpu(monkeypatch, machine, flags, capability)
    found, why = utils.native_bf16()
    assert found is native and why
    p = choose_precision(CPU, "bf16-if-native")
    assert (p.name, p.dtype) == (("bf16", torch.bfloat16) if native else ("fp32", None))
    assert not p.use_scaler
    if not native:                       # one line that says why, and what bf16 would cost
        assert p.reason.startswith("float32, not bf16: ") and "100 times slower" in p.reason


def test_a_capped_onednn_counts_as_no_native_bf16(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", {"avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert utils.native_bf16() == (False, "oneDNN is capped at AVX2 (ONEDNN_MAX_CPU_ISA)")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert utils.native_bf16()[0]


def test_bf16_if_native_on_a_gpu_is_what_auto_picks(monkeypatch):
    for capability in ((9, 0), (7, 5)):
        fake_cuda(monkeypatch, capability)
        assert choose_precision("cuda", "bf16-if-native") == choose_precision("cuda", "auto")


@needs_data
def test_the_train_command_says_in_one_line_that_it_runs_float32(tmp_path, capsys, monkeypatch):
    """The cpu-speedrun preset's precision on a CPU without native bf16: float32, said once."""
    fake_cpu(monkeypatch, "x86_64", {"avx2"}, "AVX2")
    assert preset("cpu-speedrun").precision == "bf16-if-native"
    run = tmp_path / "run"
    assert main(["--preset", "smoke", "--out", str(run), "--max-steps", "2", "--device", "cpu",
                 "--precision", "bf16-if-native"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "precision" in line]
    assert said == ["precision: fp32 (float32, not bf16: this x86 CPU has neither AVX-512 BF16 "
                    "nor AMX, so bf16 would be emulated, about 100 times slower than float32)"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["precision"], metrics["config"]["precision"]) == ("fp32", "bf16-if-native")
    assert metrics["precision_reason"] == said[0].split(" (", 1)[1][:-1]


def test_a_precision_can_be_forced(monkeypatch):
    for mode, dtype, scaler in (("fp32", None, False), ("bf16", torch.bfloat16, False),
                                ("fp16", torch.float16, True)):
        for device in ("cpu", "mps"):
            p = choose_precision(device, mode)
            assert (p.name, p.dtype, p.use_scaler) == (mode, dtype, scaler)
    fake_cuda(monkeypatch, (9, 0))
    assert choose_precision("cuda", "fp16").use_scaler
    assert choose_precision("cuda", "fp32").dtype is None
    fake_cuda(monkeypatch, (7, 5))
    with pytest.raises(ValueError, match=r"compute capability 7\.5\) has no bfloat16"):
        choose_precision("cuda", "bf16")                # an error, not a slow emulation
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        choose_precision("cpu", "fp8")


@pytest.mark.parametrize("mode,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_matrix_products_in_the_low_precision_on_the_cpu(mode, dtype):
    p = choose_precision(CPU, mode)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with p.autocast(CPU):
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32
    assert p.grad_scaler(CPU).is_enabled() == (mode == "fp16")


def _log(run) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


@needs_data
@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_low_precision_training_steps_on_the_cpu(tmp_path, mode):
    cfg = replace(preset("smoke"), precision=mode, max_steps=4, eval_every=2, eval_sentences=2)
    metrics = train(cfg, tmp_path / mode, device=CPU, progress=False)
    assert metrics["precision"] == mode and metrics["config"]["precision"] == mode
    log = _log(tmp_path / mode)
    assert [e["step"] for e in log] == [2, 4]
    assert all(math.isfinite(e["train_loss"]) and math.isfinite(e["val_loss"]) for e in log)
    assert math.isfinite(metrics["val_loss"])
    ckpt = load_checkpoint(tmp_path / mode / "checkpoint.pt")
    deterministic(cfg.seed)
    init = build_model(cfg).state_dict()                        # the run's initial weights
    moved = {k: (ckpt["model"][k] - init[k]).abs().max().item() for k in init}
    assert min(moved.values()) > 0 and max(moved.values()) > 1e-3, moved
    # autocast really ran: the training losses differ a little from a float32 run's
    fp32 = train(replace(cfg, precision="fp32"), tmp_path / "fp32", device=CPU, progress=False,
                 evaluate=False)
    assert fp32["precision"] == "fp32"
    ours, theirs = log[0]["train_loss"], _log(tmp_path / "fp32")[0]["train_loss"]
    assert ours != theirs and abs(ours - theirs) < 0.05
    if mode == "fp16":   # the GradScaler's state travels in the checkpoint
        assert {"scale", "growth_factor", "_growth_tracker"} <= set(ckpt["scaler"])
        assert ckpt["scaler"]["scale"] > 0
    else:                # no scaler: an empty (disabled) state
        assert ckpt["scaler"] == {}


@needs_data
def test_fp16_with_a_grad_scaler_resumes_exactly(tmp_path):
    cfg = replace(preset("smoke"), precision="fp16", max_steps=4, eval_every=4, eval_sentences=2)
    straight = train(cfg, tmp_path / "a", device=CPU, progress=False, evaluate=False)
    assert train(cfg, tmp_path / "b", device=CPU, progress=False,
                 stop_after=2) == {"interrupted_at_step": 2}
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["scaler"]["_growth_tracker"] == 2
    resumed = train(cfg, tmp_path / "b", resume=True, device=CPU, progress=False, evaluate=False)
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert a["scaler"] == b["scaler"] and a["scaler"]["_growth_tracker"] == 4
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert resumed["val_loss"] == straight["val_loss"] and resumed["steps"] == 4


@needs_data
def test_precision_and_compile_flags_of_the_command(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--preset", "smoke", "--out", str(run), "--max-steps", "2", "--device", "cpu",
                 "--precision", "bf16", "--no-compile"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["precision"] == "bf16" and metrics["config"]["precision"] == "bf16"
    assert metrics["compiled"] is False
    with pytest.raises(SystemExit) as e:
        main(["--preset", "smoke", "--out", str(tmp_path / "x"), "--precision", "fp8"])
    assert e.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err


@needs_data
def test_compiled_training_matches_eager_with_one_graph_for_all_batch_shapes(tmp_path):
    """torch.compile(dynamic=True) on the CPU (inductor, C++): the losses of 30 steps equal
    eager's to 1e-4 relative, and the length-bucketed batches, 17 different (source, target)
    shapes in these 30 steps, are served by a single compiled graph: measured 1 graph and about
    30 s of compilation on one thread. (Without dynamic=True dynamo compiles 2 graphs, first
    static then dynamic, about 35 s; a static graph per shape would hit its limit of 8.)"""
    from torch._dynamo.utils import counters
    steps = 30
    cfg = replace(preset("smoke"), max_steps=steps, eval_every=5, eval_sentences=2)
    data = prepare_data(cfg)
    shapes = {(len(g), data.train.batch(g).src.shape[1], data.train.batch(g).tgt_in.shape[1])
              for g in data.train.epoch_groups(0)[:steps]}
    assert len(shapes) >= 10                      # the test is about many shapes
    eager = train(cfg, tmp_path / "eager", device=CPU, progress=False, evaluate=False)
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = train(replace(cfg, compile=True), tmp_path / "compiled", device=CPU,
                         progress=False, evaluate=False)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert compiled["compiled"] is True and eager["compiled"] is False
    assert graphs == 1, f"{graphs} graphs compiled for {len(shapes)} batch shapes"
    a, b = _log(tmp_path / "eager"), _log(tmp_path / "compiled")
    assert [e["step"] for e in a] == [e["step"] for e in b] == list(range(5, steps + 1, 5))
    for x, y in zip(a, b):
        assert y["train_loss"] == pytest.approx(x["train_loss"], rel=1e-4)
        assert y["val_loss"] == pytest.approx(x["val_loss"], rel=1e-4)
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)


@needs_data
def test_compile_asks_for_dynamic_shapes_and_leaves_the_gru_models_eager(tmp_path, monkeypatch):
    """The GRUs' loop over target positions would compile one graph per target length."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    one_step = dict(compile=True, max_steps=1, eval_every=1)
    gru = train(replace(preset("smoke", "gru"), **one_step), tmp_path / "gru", device=CPU,
                progress=False, evaluate=False)
    assert gru["compiled"] is False and calls == []
    tf = train(replace(preset("smoke"), **one_step), tmp_path / "tf", device=CPU,
               progress=False, evaluate=False)
    assert tf["compiled"] is True and calls == [{"dynamic": True}]


def test_configs_of_older_runs_with_the_bf16_switch_still_load():
    """Checkpoints written before ``precision`` existed hold ``bf16`` (and a flat config, as in
    results/cpu/cpu_tiny_transformer_2threads.json); translate.load_run rebuilds their TrainConfig
    with TrainConfig.from_dict, and same_run matches them."""
    from dataclasses import asdict
    from pathlib import Path

    results = Path(__file__).parents[1] / "results" / "cpu" / "cpu_tiny_transformer_2threads.json"
    old = json.loads(results.read_text())["config"]          # saved flat, before positional
    assert "d_model" in old and "arch" not in old and "positional" not in old
    assert TrainConfig.from_dict(old) == preset("cpu-tiny")
    del old["precision"]
    assert TrainConfig.from_dict({**old, "bf16": True}).precision == "auto"
    assert TrainConfig.from_dict({**old, "bf16": False}).precision == "fp32"
    assert "bf16" not in asdict(TrainConfig.from_dict({**old, "bf16": False}))
    assert same_run({**old, "bf16": True}, asdict(preset("cpu-tiny")))
    assert not same_run({**old, "bf16": False}, asdict(preset("cpu-tiny")))
    assert replace(preset("smoke"), max_steps=3).precision == "fp32"   # replace keeps it
