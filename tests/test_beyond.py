"""Chapter 13's pieces (attnbook.beyond): online softmax is exact attention, the forms of linear
attention and of the diagonal recurrence agree, every causal mixer is causal, bad input fails
clearly, and the reversal batches line up."""
import pytest
import torch

from attnbook import BOS_ID, EOS_ID, PAD_ID
from attnbook.commands import beyond_runs as beyond_runs_command
from attnbook.attention import padding_mask, scaled_dot_product_attention
from attnbook.beyond import (GatedRecurrence, LinearAttention, linear_attention,
                             linear_attention_recurrent, linear_recurrence,
                             linear_recurrence_parallel, mixer_model, online_softmax_attention,
                             reversal_accuracy, reversal_batch)
from attnbook.mha import MultiHeadAttention
from attnbook.transformer import TransformerConfig


def qkv(B=2, h=3, T=37, S=None, d_k=8, d_v=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    return (torch.randn(B, h, T, d_k, generator=g), torch.randn(B, h, S, d_k, generator=g),
            torch.randn(B, h, S, d_v, generator=g))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_online_softmax_equals_reference(causal, block_size):
    q, k, v = qkv()
    ref = scaled_dot_product_attention(q, k, v, causal=causal)[0]
    torch.testing.assert_close(online_softmax_attention(q, k, v, causal=causal,
                                                        block_size=block_size), ref)


@pytest.mark.parametrize("causal", [False, True])
def test_online_softmax_padding_and_cross_attention(causal):
    q, k, v = qkv(T=11, S=29)                      # T != S: causal means s <= t + (S - T)
    key_mask = torch.ones(2, 29, dtype=torch.bool)
    key_mask[0, 20:] = False
    key_mask[1, :] = False                         # a row with no key at all: zeros, never NaN
    m = padding_mask(key_mask)
    ref = scaled_dot_product_attention(q, k, v, mask=m, causal=causal)[0]
    out = online_softmax_attention(q, k, v, mask=m, causal=causal, block_size=8)
    torch.testing.assert_close(out, ref)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_online_softmax_gradients_match():
    q, k, v = (t.requires_grad_() for t in qkv(T=20))
    ref = scaled_dot_product_attention(q, k, v, causal=True)[0]
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    g_on = torch.autograd.grad(online_softmax_attention(q, k, v, causal=True, block_size=6).sum(),
                               (q, k, v))
    for a, b in zip(g_on, g_ref):
        torch.testing.assert_close(a, b)


def test_linear_attention_forms_agree():
    q, k, v = qkv()
    rec = linear_attention_recurrent(q, k, v)
    for chunk in (None, 1, 5, 64):
        torch.testing.assert_close(linear_attention(q, k, v, causal=True, chunk_size=chunk), rec)
    # the attention-like form: rows of phi(Q) phi(K)^T, lower triangle, normalised
    phi = lambda x: torch.nn.functional.elu(x) + 1                      # noqa: E731
    A = (phi(q) @ phi(k).transpose(-2, -1)).tril()
    torch.testing.assert_close(rec, (A @ v) / A.sum(-1, keepdim=True), rtol=1e-4, atol=1e-5)
    A = phi(q) @ phi(k).transpose(-2, -1)
    torch.testing.assert_close(linear_attention(q, k, v), (A @ v) / A.sum(-1, keepdim=True),
                               rtol=1e-4, atol=1e-5)


def test_linear_attention_key_mask():
    q, k, v = qkv()
    key_mask = torch.ones(2, 37, dtype=torch.bool)
    key_mask[0, 25:] = False
    m = key_mask[:, None, :]                                           # (B, 1, S) for heads
    full = linear_attention(q, k, v, key_mask=m)
    torch.testing.assert_close(full[0], linear_attention(q[:1], k[:1, :, :25], v[:1, :, :25])[0])
    torch.testing.assert_close(linear_attention(q, k, v, causal=True, key_mask=m),
                               linear_attention_recurrent(q, k, v, key_mask=m))
    with pytest.raises(ValueError, match="mask\\[:, None, :\\]"):
        linear_attention(q, k, v, key_mask=key_mask[:, :30])


def test_causal_linear_attention_is_causal():
    q, k, v = qkv()
    out = linear_attention(q, k, v, causal=True)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[..., 20:, :] = torch.randn_like(t[..., 20:, :])
    out2 = linear_attention(q2, k2, v2, causal=True)
    torch.testing.assert_close(out2[..., :20, :], out[..., :20, :])
    assert not torch.allclose(out2[..., 20:, :], out[..., 20:, :])


def test_linear_recurrence_forms_agree():
    g = torch.Generator().manual_seed(1)
    a = torch.sigmoid(torch.randn(2, 37, 6, generator=g))
    b = torch.randn(2, 37, 6, generator=g)
    h = linear_recurrence(a, b)
    torch.testing.assert_close(h[:, 0], b[:, 0])
    torch.testing.assert_close(h[:, 5], a[:, 5] * h[:, 4] + b[:, 5])
    torch.testing.assert_close(linear_recurrence_parallel(a, b), h)
    for chunk in (1, 4, 16, 64):
        torch.testing.assert_close(linear_recurrence(a, b, chunk_size=chunk), h)


@pytest.mark.parametrize("mixer", [LinearAttention(16, 4), GatedRecurrence(16),
                                   MultiHeadAttention(16, 4)])
def test_mixers_are_causal_and_keep_shapes(mixer):
    torch.manual_seed(0)
    x = torch.randn(3, 12, 16)
    y = mixer(x, causal=True)[0]
    assert y.shape == (3, 12, 16)
    x2 = x.clone()
    x2[:, 7:] = torch.randn(3, 5, 16)
    y2 = mixer(x2, causal=True)[0]
    torch.testing.assert_close(y2[:, :7], y[:, :7])
    assert not torch.allclose(y2[:, 7:], y[:, 7:])


def test_gated_recurrence_padding_passes_state_unchanged():
    torch.manual_seed(0)
    layer = GatedRecurrence(8)
    x = torch.randn(1, 6, 8)
    mask = torch.tensor([[True, True, False, False, True, True]])
    y = layer(x, key_mask=mask)[0]
    y_alone = layer(x[:, [0, 1, 4, 5]])[0]                             # padding removed
    torch.testing.assert_close(y[:, [0, 1, 4, 5]], y_alone)


def test_mixers_have_equal_parameters():
    counts = [sum(p.numel() for p in m.parameters())
              for m in (MultiHeadAttention(32, 4), LinearAttention(32, 4), GatedRecurrence(32))]
    assert counts == [4 * 32 * 32 + 4 * 32] * 3


def test_bad_shapes_give_clear_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="same width d_k"):
        online_softmax_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="same length S"):
        linear_attention(q, k, v[..., :30, :])
    with pytest.raises(ValueError, match="as many queries as keys"):
        linear_attention(q[..., :10, :], k, v, causal=True)
    with pytest.raises(ValueError, match="padding_mask"):
        online_softmax_attention(q, k, v, mask=torch.ones(2, 37, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match="same shape"):
        linear_recurrence(torch.rand(2, 5, 3), torch.rand(2, 5, 4))
    with pytest.raises(ValueError, match=r"expected x \(B, T, 16\)"):
        GatedRecurrence(16)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="always causal"):
        GatedRecurrence(16)(torch.randn(2, 5, 16), causal=False)
    with pytest.raises(ValueError, match="unknown mixer"):
        mixer_model(TransformerConfig(vocab_size=20, d_model=16, h=2, d_ff=32, n_layers=1), "lstm")


def test_reversal_batch_lines_up():
    b = reversal_batch(4, 3, 3, n_symbols=5, generator=torch.Generator().manual_seed(0))
    ids, targets, mask, pos = b.ids, b.targets, b.mask, b.positions
    assert ids.shape == targets.shape == mask.shape == pos.shape == (4, 8)
    assert torch.equal(b.scored, targets != PAD_ID) and b.scored[:, 4:].all()  # tgt EOS only
    src = ids[:, 1:4]
    assert (ids[:, 0] == BOS_ID).all() and (ids[:, 4] == EOS_ID).all()
    assert torch.equal(ids[:, 5:], src.flip(1))                        # the target, teacher-forced
    assert (targets[:, :4] == PAD_ID).all()
    assert torch.equal(targets[:, 4:7], src.flip(1)) and (targets[:, 7] == EOS_ID).all()
    assert pos[0].tolist() == [4, 3, 2, 1, 0, 1, 2, 3]
    # the input that predicts output j has position j - 1; the source token it copies, j
    for j in range(1, 4):
        assert torch.equal(src[:, pos[0, 1:4] == j][:, 0], targets[:, 4 + j - 1])


def test_mixer_model_runs_on_reversal():
    cfg = TransformerConfig(vocab_size=4 + 5, d_model=16, h=2, d_ff=32, n_layers=1, dropout=0.0,
                            norm_first=True, max_len=32)
    for kind in ("softmax", "linear", "recurrent"):
        torch.manual_seed(0)
        model = mixer_model(cfg, kind)
        acc = reversal_accuracy(model, [2, 3], n_symbols=5, n_per_length=8)
        assert acc["length"] == [2, 3] and all(0 <= a <= 1 for a in acc["exact"] + acc["token"])


def test_the_reversal_runs_live_in_the_library_and_the_command_uses_them():
    import ast
    import inspect

    from attnbook import beyond
    from attnbook.experiments import beyond_runs

    assert beyond_runs.REVERSAL is beyond.REVERSAL and beyond_runs.run_reversal is beyond.run_reversal
    assert beyond_runs.reversal_config is beyond.reversal_config
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(beyond)))
                if isinstance(node, ast.ImportFrom)}
    assert "beyond_runs" not in imported             # the library never imports the command
    # a variant replaces the mixer of every block, after the seeded model is built
    run = beyond_runs.run_variant("recurrent-state-256", 0, steps=2)
    assert run["variant"] == "recurrent-state-256" and run["mixer"] == "recurrent"
    plain = beyond.run_reversal("recurrent", 0, steps=2)
    assert run["params"] > plain["params"] and len(run["exact"]) == len(beyond.REVERSAL["lengths"])


def test_only_puts_one_part_into_the_file_and_keeps_the_others(tmp_path, capsys):
    import json

    from attnbook.experiments import beyond_runs

    out = tmp_path / "beyond.json"
    tiny = ["--out", str(out), "--steps", "2", "--seeds", "0"]
    assert beyond_runs_command.main([*tiny, "--only", "reversal"]) == 0
    before = json.loads(out.read_text())
    assert beyond_runs_command.main([*tiny, "--only", "variants"]) == 0
    after = json.loads(out.read_text())
    assert after["reversal"] == before["reversal"]
    assert after["calls"][0] == before["calls"][0] and after["seeds"] == before["seeds"]
    assert [c["rows"] for c in after["calls"]] == [["reversal"], ["variants"]]
    variants = after["variants"]
    assert [(r["variant"], r["seed"]) for r in variants["runs"]] == \
        [(name, 0) for name in beyond_runs.VARIANTS]
    assert variants["settings"]["steps"] == 2 and after["calls"][1]["command"].endswith(
        "--only variants")
    for r in variants["runs"]:
        assert len(r["exact"]) == len(beyond_runs.REVERSAL["lengths"])
    # another set of seeds, or a damaged file: one line, exit status 2, the file untouched
    assert beyond_runs_command.main(["--out", str(out), "--steps", "2", "--seeds", "0", "1",
                             "--only", "variants"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert json.loads(out.read_text()) == after
    out.write_text("{not json")
    assert beyond_runs_command.main([*tiny, "--only", "variants"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a JSON result" in err and out.read_text() == "{not json"
