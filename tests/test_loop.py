"""The one small training loop (attnbook.loop.fit): the five things of a step, in their order."""
import torch

from attnbook.loop import fit
from attnbook.schedules import warmup_cosine_scheduler


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))


def _batches(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda step: (torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))


def _loss(model, b):
    return torch.nn.functional.mse_loss(model(b[0]), b[1])


def by_hand(steps, clip, with_sched):
    """The loop written out, as the chapters wrote theirs."""
    model, next_batch = _model(), _batches(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = warmup_cosine_scheduler(opt, 3, steps) if with_sched else None
    model.train()
    losses = []
    for step in range(steps):
        loss = _loss(model, next_batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return model, losses


def test_fit_is_the_loop_written_out_to_the_bit():
    for clip, with_sched in ((None, False), (0.05, True)):
        want_model, want = by_hand(12, clip, with_sched)
        model, next_batch = _model(), _batches(1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sched = warmup_cosine_scheduler(opt, 3, 12) if with_sched else None
        got = fit(model, next_batch, _loss, 12, opt, sched, clip)
        assert got == want and model.training
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     want_model.state_dict().values()))
    # clipping and the schedule change the run: the comparison above can tell them apart
    assert by_hand(12, 0.05, True)[1] != by_hand(12, None, False)[1]


def test_fit_logs_the_mean_loss_every_log_every_steps(capsys):
    model = _model()
    losses = fit(model, _batches(2), _loss, 6, torch.optim.SGD(model.parameters(), lr=0.1),
                 log_every=3)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"step {3 * i:5d}  loss {sum(losses[3 * i - 3:3 * i]) / 3:.3f}" for i in (1, 2)]
