"""The cost measurements of chapter 4: score-matrix size, timing, peak memory."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import attention as book
from attnbook.bench import (attention_cost, attention_inputs, peak_memory, score_matrix_bytes,
                            time_call)


def test_score_matrix_bytes():
    assert score_matrix_bytes(1, 1, 10) == 400
    assert score_matrix_bytes(2, 8, 128, 64) == 2 * 8 * 128 * 64 * 4
    assert score_matrix_bytes(1, 1, 10, dtype=torch.float16) == 200
    assert score_matrix_bytes(1, 1, 10, dtype=torch.float64) == 800


def test_attention_inputs_shapes_and_global_rng_untouched():
    state = torch.random.get_rng_state()
    q, k, v = attention_inputs(5, 7, B=2, h=3, d_k=4, d_v=6)
    assert (q.shape, k.shape, v.shape) == ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6))
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(attention_inputs(5, seed=1)[0], attention_inputs(5, seed=1)[0])


def test_peak_memory_counts_temporaries_not_what_existed_before():
    x = torch.ones(500, 500)                              # 1 MB that exists before the call
    assert peak_memory(lambda: x.sum()) < 10_000
    # y = x + 1 (1 MB) is alive while z = y * 2 (1 MB) is made: 2 MB at the peak, freed after
    peak = peak_memory(lambda: ((x + 1) * 2).sum())
    assert 2_000_000 <= peak < 2_100_000


def test_peak_memory_of_attention_shows_the_score_matrix():
    q, k, v = attention_inputs(256, B=1, h=2, d_k=16)
    scores = score_matrix_bytes(1, 2, 256)
    ours = peak_memory(lambda q, k, v: book.scaled_dot_product_attention(q, k, v)[0], q, k, v)
    assert ours >= 2 * scores                 # the scores and the weights are both (T, T)
    assert peak_memory(F.scaled_dot_product_attention, q, k, v) < scores / 2


def test_time_call_and_attention_cost():
    calls = []
    seconds = time_call(lambda: calls.append(1), repeats=3, warmup=2, min_time=0.0)
    assert 0 <= seconds < 1 and len(calls) == 5
    with pytest.raises(ValueError, match="at least 1"):
        time_call(lambda: None, repeats=0)
    threads = torch.get_num_threads()
    rows = attention_cost({"sdpa": F.scaled_dot_product_attention}, [32, 64], h=2, d_k=8,
                          repeats=1, num_threads=1)
    assert torch.get_num_threads() == threads
    assert [(r["name"], r["T"]) for r in rows] == [("sdpa", 32), ("sdpa", 64)]
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in rows)
    assert rows[1]["score_bytes"] == 2 * 64 * 64 * 4 == 4 * rows[0]["score_bytes"]
    assert math.isfinite(rows[0]["seconds"])


# --- the benchmark suite (python -m attnbook benchmarks, make bench; appendix "Performance") ---------

import json
import subprocess
import sys

from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnbook.benchmarks import suite as bench_suite
from attnbook.commands import benchmarks
from attnbook.batching import translation_loss
from attnbook.transformer import TransformerConfig

TINY = dict(vocab_size=10, d_model=4, h=2, d_ff=8, n_layers=1, dropout=0.0)


def test_quick_suite_writes_json_with_hardware_settings_and_plots(tmp_path):
    run = subprocess.run([sys.executable, "-m", "attnbook", "benchmarks", "--quick", "--device", "cpu",
                          "--threads", "1", "--out", str(tmp_path), "--note", "test"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = bench_suite.load_results(tmp_path)
    assert set(results) == {"cpu"} and set(results["cpu"]) == set(bench_suite.SECTIONS)
    for section, res in results["cpu"].items():
        assert (tmp_path / "cpu" / f"{section}.png").stat().st_size > 10_000
        (call,) = res.calls                       # the one provenance record (attnbook.store)
        assert res["benchmark"] == section and res["quick"] is True and call.note == "test"
        assert res["device"] == {"kind": "cpu", "name": call.hardware["cpu"], "threads": 1}
        for key in ("python", "torch", "cpu", "cpu_count", "gpu"):
            assert key in call.hardware
        assert call.hardware["torch"] == torch.__version__ and len(call.load_before) == 3
        assert len(call.git_commit) == 40 and call.date and call.threads == 1
        assert call.command.startswith("python -m attnbook benchmarks --quick")
        assert 0 < call.wall_s < 300 and res["settings"]
    loop = results["cpu"]["loop"]                 # the real loop against its step alone
    rows = {r["name"]: r for r in loop["results"]}
    assert set(rows) == {"loop", "step alone"} and loop["settings"]["preset"] == "smoke"
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None and r["of_matmul_ceiling"] > 0
               for r in rows.values())
    assert loop["loop_over_step"] == rows["loop"]["tokens_per_s"] / rows["step alone"]["tokens_per_s"]
    assert loop["profile"] and all(p["self_cpu_ms_per_step"] >= 0 for p in loop["profile"])
    att = results["cpu"]["attention"]
    names = {r["name"] for r in att["results"]}
    assert {"book kernel", "F.scaled_dot_product_attention", "book MultiHeadAttention",
            "nn.MultiheadAttention"} <= names
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in att["results"])
    assert {s["mode"] for s in att["summary"]} == {"forward", "forward+backward"}
    train = results["cpu"]["training"]
    (cfg,) = train["configs"]
    assert cfg["same_loss_check"]["abs_diff"] < 1e-4
    eager = [r for r in cfg["results"] if r["variant"] == "fp32, eager"]
    assert {r["model"] for r in eager} == {"book", "torch"}
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in eager)   # CPU: no known peak
    assert all("error" in r for r in cfg["results"] if r["compiled"])      # skipped in --quick
    assert cfg["speedup"][0]["book_speedup"] > 0
    assert train["throughput_config"]["status"] == "not measured"
    dec = results["cpu"]["decoding"]
    out_len = dec["settings"]["out_len"]
    assert all(r["output_lengths"] == [out_len] for r in dec["results"])   # exactly out_len tokens
    assert all(s["same_output"] for s in dec["speedup"])           # the cache changes nothing
    rec = results["cpu"]["recurrence"]
    assert {r["length"] for r in rec["results"]} == set(rec["settings"]["lengths"])
    assert {g["status"] for g in bench_suite.goals(results)} <= {"met", "missed", "unmeasured"}


def test_out_folder_named_after_the_device_is_used_as_is(tmp_path):
    threads = torch.get_num_threads()
    assert benchmarks.main(["--quick", "--only", "decoding", "--device", "cpu", "--threads", "1",
                            "--no-plots", "--out", str(tmp_path / "cpu")]) == 0
    assert torch.get_num_threads() == threads
    assert json.loads((tmp_path / "cpu" / "decoding.json").read_text())["benchmark"] == "decoding"
    assert not (tmp_path / "cpu" / "cpu").exists()


def test_flop_count_by_hand_for_a_tiny_config():
    cfg = TransformerConfig(**TINY)                     # V 10, d 4, d_ff 8, one layer each side
    # per source token: encoder W_q W_k W_v W_o 4 (2*4*4) + feed-forward 2*4*8 + 2*8*4, and
    # the decoder's cross-attention keys and values of the memory 2 (2*4*4)
    per_src = 4 * 32 + (64 + 64) + 2 * 32                                   # 320
    # per target token: self-attention 4 (2*4*4), cross-attention queries and output 2 (2*4*4),
    # feed-forward 128, output layer 2*4*10
    per_tgt = 4 * 32 + 2 * 32 + 128 + 80                                    # 400
    # attention, B = 1, S = 2, T = 3: q k^T and weights @ v, each 2 * (rows * cols * d)
    attention = 2 * (2 * 2 * 2 * 4) + 2 * (2 * 3 * 3 * 4) + 2 * (2 * 3 * 2 * 4)   # 64 + 144 + 96
    flops = bench_suite.transformer_flops(cfg, B=1, S=2, T=3)
    assert flops["forward"] == 2 * per_src + 3 * per_tgt + attention == 2144
    assert flops["training"] == 3 * 2144
    assert bench_suite.matmul_params(cfg) == (4 * 16 + 2 * 32) + (8 * 16 + 2 * 32) + 10 * 4 == 360
    # with S = T: 6 N per target token, plus 36 L d T for the three attentions
    assert bench_suite.transformer_flops(cfg, B=5, S=3, T=3)["training_per_target_token"] == \
        6 * 360 + 36 * 1 * 4 * 3


@pytest.mark.parametrize("norm_first", [False, True])
def test_flop_count_matches_pytorchs_flop_counter(norm_first):
    """FlopCounterMode counts the matmuls PyTorch runs; with the math SDPA backend it sees the
    attention's q k^T and weights @ v too. Tolerance 1%: both count only matmuls, so they agree."""
    cfg = TransformerConfig(vocab_size=50, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0,
                            norm_first=norm_first)
    book, _ = bench_suite.twin_models(cfg)
    b = bench_suite.random_batch(3, 7, 5, 50)
    flops = bench_suite.transformer_flops(cfg, B=3, S=7, T=5)
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd, torch.no_grad():
            book(b.src, b.src_mask, b.tgt_in, b.tgt_mask)
        with FlopCounterMode(display=False) as step:
            book(b.src, b.src_mask, b.tgt_in, b.tgt_mask).sum().backward()
    assert fwd.get_total_flops() == pytest.approx(flops["forward"], rel=0.01)
    assert step.get_total_flops() == pytest.approx(flops["training"], rel=0.01)


@pytest.mark.parametrize("norm_first", [False, True])
def test_book_and_torch_transformer_in_the_throughput_benchmark_compute_the_same(norm_first):
    cfg = TransformerConfig(vocab_size=60, d_model=16, h=4, d_ff=32, n_layers=2, dropout=0.0,
                            norm_first=norm_first)
    book, ref = bench_suite.twin_models(cfg)
    book, ref = book.double(), ref.double()
    assert bench_suite.count_parameters(book) == bench_suite.count_parameters(ref)
    b = bench_suite.random_batch(3, 7, 5, 60, seed=1)
    b.src_mask[1, 4:] = b.tgt_mask[2, 3:] = False                    # some padding
    b.src[~b.src_mask] = b.tgt_out[~b.tgt_mask] = 0

    def loss(model):
        logits = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)
        return translation_loss(logits, b.tgt_out, label_smoothing=0.1)

    ours, theirs = loss(book), loss(ref)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(book.embed.weight.grad, ref.embed.weight.grad)
    torch.testing.assert_close(book.decoder[1].ff.linear2.weight.grad,
                               ref.transformer.decoder.layers[1].linear2.weight.grad)
    with torch.no_grad():                                # different weights: different losses
        ref.transformer.encoder.layers[0].linear1.weight.mul_(1.5)
    assert abs(loss(ref).item() - ours.item()) > 1e-6


def test_gpu_peak_table():
    peak = bench_suite.gpu_peak_flops
    assert peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak("NVIDIA H200", "bf16") == 989e12
    assert peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak("NVIDIA L40S", "bf16") == 362e12                        # not the L4's 121
    assert peak("NVIDIA H100 80GB HBM3", "fp32") == 67e12
    assert peak("Some Future GPU", "bf16") is None and peak(None, "bf16") is None
    assert bench_suite.peak_flops(torch.device("cpu"), "fp32")[0] is None


def test_goals_are_judged_from_the_results():
    def training(kind, config, variant, speedup, mfu=None, medians=None):
        return {"device": {"name": "NVIDIA H100 80GB HBM3" if kind == "cuda" else "AMD EPYC"},
                "configs": [{"config": config,
                             "speedup": [{"variant": variant, "book_speedup_paired": speedup,
                                          "book_speedup": medians or speedup}],
                             "results": [{"model": "book", "variant": variant, "mfu": mfu}]}]}

    def decoding(greedy, beam):
        return {"speedup": [{"method": "greedy", "cached_speedup": greedy},
                            {"method": "beam 4", "cached_speedup": beam}]}

    status = lambda results: [g["status"] for g in bench_suite.goals(results)]   # noqa: E731
    assert status({}) == ["unmeasured"] * 5
    cpu = {"training": training("cpu", "small", "fp32, eager", 0.9), "decoding": decoding(4, 2.5)}
    assert status({"cpu": cpu}) == ["missed", "unmeasured", "unmeasured", "missed", "unmeasured"]
    cpu = {"training": training("cpu", "small", "fp32, eager", 1.1), "decoding": decoding(4, 3.5)}
    cuda = {"training": training("cuda", "throughput", "bf16, compiled", 1.4, mfu=0.45),
            "decoding": decoding(5, 6)}
    assert status({"cpu": cpu, "cuda": cuda}) == ["met"] * 5
    cuda["training"] = training("cuda", "throughput", "bf16, compiled", 1.2, mfu=0.3)
    assert status({"cpu": cpu, "cuda": cuda})[1:3] == ["missed", "missed"]
    cpu["training"] = training("cpu", "small", "fp32, eager", 1.04, medians=0.97)
    assert status({"cpu": cpu})[0] == "inconclusive"                     # within the noise
