"""WorldModelModule by value, without a trainer: latent standardisation, one chunk's prediction
for every method, and the loss each training stage optimises (the default training path)."""

from __future__ import annotations

import pytest
import torch

from rlawm.model import WorldModelModule

L, C, A, H = 4, 6, 2, 4


def module(method: str, rla_steps: int = 0) -> WorldModelModule:
    torch.manual_seed(0)
    m = WorldModelModule(
        method=method, token_dim=C, tokens=L, action_dim=A, horizon=H, latent_tokens=2,
        latent_dim=3, width=16, depth=1, heads=2, rla_steps=rla_steps, noise_seed=5,
    )  # fmt: skip
    for p in m.parameters():  # off the zero inits, so every part reaches the output
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        m.z_mean.copy_(torch.randn(2, 3))
        m.z_std.copy_(torch.rand(2, 3) + 0.5)
        m.z_ready.fill_(True)
    return m


def batch(seed: int = 1, size: int = 3):
    g = torch.Generator().manual_seed(seed)
    x_t, x_next = torch.randn(size, L, C, generator=g), torch.randn(size, L, C, generator=g)
    return {"x_t": x_t, "x_next": x_next, "chunk": torch.randn(size, H, A, generator=g)}


def test_standardised_latents_round_trip_through_the_decoder():
    m, b = module("rla_wm"), batch()
    z, _ = m.rla.encode(b["x_t"], b["x_next"])
    s = m.standardised_rla(b["x_t"], b["x_next"])
    torch.testing.assert_close(s, (z - m.z_mean) / m.z_std)
    torch.testing.assert_close(m.decode_standardised(b["x_t"], s), m.rla.decode(b["x_t"], z))


@pytest.mark.parametrize("method", ["rla_wm", "token_flow", "regression", "rla_regression"])
def test_predict_chunk_composes_the_parts_of_each_method(method):
    m, b = module(method), batch()
    x, a = b["x_t"], b["chunk"]
    got = m.predict_chunk(x, a, torch.Generator().manual_seed(3), steps=3)
    g = torch.Generator().manual_seed(3)
    if method == "rla_wm":
        want = m.decode_standardised(x, m.net.sample(x, a, 3, g))
    elif method == "token_flow":
        want = m.net.sample(x, a, 3, g)
    elif method == "regression":
        want = m.net(x, a)
    else:
        want = m.decode_standardised(x, m.net(x, a))
    torch.testing.assert_close(got, want)
    # steps=None means the configured sample_steps
    if method in ("rla_wm", "token_flow"):
        default = m.predict_chunk(x, a, torch.Generator().manual_seed(3))
        again = m.predict_chunk(x, a, torch.Generator().manual_seed(3), steps=10)
        torch.testing.assert_close(default, again)


class Recorder:
    """Stands in for the trainer-side calls of a manual-optimisation step: ``optimizers()``
    returns one optimizer alone (as Lightning does) or the list; ``log`` records value and
    whether it goes to the progress bar."""

    def __init__(self, m: WorldModelModule):
        self.logged, self.prog_bar, self.m = {}, {}, m
        optimizers = m.configure_optimizers()
        m.optimizers = lambda: optimizers[0] if len(optimizers) == 1 else optimizers
        m.manual_backward = lambda loss: loss.backward()
        m.log = self.log
        self.optimizers = optimizers

    def log(self, name, value, prog_bar=False, **_):
        self.logged[name] = float(torch.as_tensor(value).detach())
        self.prog_bar[name] = prog_bar


@pytest.mark.parametrize("method", ["rla_wm", "token_flow", "regression", "rla_regression"])
def test_the_world_model_stage_optimises_its_method_s_loss(method):
    m, b = module(method), batch()
    recorder = Recorder(m)
    reference = module(method)
    g = torch.Generator().manual_seed(5)  # the module's flow noise, from its seed
    x, x_next, a = b["x_t"], b["x_next"], b["chunk"]
    with torch.no_grad():
        if method == "rla_wm":
            want = reference.net.loss(x, a, reference.standardised_rla(x, x_next), generator=g)
        elif method == "rla_regression":
            want = reference.net.loss(x, a, reference.standardised_rla(x, x_next))
        elif method == "token_flow":
            want = reference.net.loss(x, a, x_next, generator=g)
        else:
            want = reference.net.loss(x, a, x_next)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    loss = m.training_step(b, 0)
    torch.testing.assert_close(loss.detach(), want)
    assert recorder.logged["train/wm_loss"] == pytest.approx(float(want))
    assert recorder.prog_bar["train/wm_loss"] is True
    after = m.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("net.") for k in moved)  # the autoencoder stays frozen
    if m.rla is not None:
        assert not m.rla.training and not any(p.requires_grad for p in m.rla.parameters())


def test_the_autoencoder_stage_optimises_the_reconstruction_loss_only():
    m, b = module("rla_wm", rla_steps=10), batch()
    recorder = Recorder(m)
    reference = module("rla_wm", rla_steps=10)
    with torch.no_grad():
        want = reference.rla.loss(b["x_t"], b["x_next"])
    before = {k: v.clone() for k, v in m.state_dict().items()}
    loss = m.training_step(b, 0)
    torch.testing.assert_close(loss.detach(), want)
    assert recorder.logged["train/rla_loss"] == pytest.approx(float(want))
    assert recorder.prog_bar["train/rla_loss"] is True
    moved = {k for k, v in m.state_dict().items() if not torch.equal(before[k], v)}
    assert moved and all(k.startswith("rla.") for k in moved)


def test_persistence_copies_the_frame_and_its_step_learns_nothing():
    m, b = module("persistence"), batch()
    assert torch.equal(m.predict_chunk(b["x_t"], b["chunk"]), b["x_t"])
    assert not list(m.parameters())  # nothing to optimise
    logged: dict = {}
    m.optimizers = lambda: []
    m.log = lambda name, value, **_: logged.__setitem__(name, value)
    assert m.training_step(b, 0) is None
    assert logged == {"train/loss": 0.0}


def test_the_step_stream_draws_batch_s_from_its_own_seed():
    """data.StepBatches: batch s is ``randint`` under a generator seeded seed * 1_000_003 + s,
    whatever step the stream starts from (a number, or a callable read per iteration)."""
    from itertools import islice

    from rlawm.data import StepBatches

    x_t = torch.arange(50.0)[:, None, None]
    stream = StepBatches(x_t, x_t + 100, x_t + 200, batch_size=4, seed=7, start_step=3)
    batches = list(islice(iter(stream), 3))
    for offset, got in enumerate(batches):
        g = torch.Generator().manual_seed(7 * 1_000_003 + 3 + offset)
        index = torch.randint(50, (4,), generator=g)
        torch.testing.assert_close(got["x_t"], x_t[index])
        torch.testing.assert_close(got["x_next"], x_t[index] + 100)
        torch.testing.assert_close(got["chunk"], x_t[index] + 200)
    step = [5]
    live = StepBatches(x_t, x_t, x_t, batch_size=4, seed=7, start_step=lambda: step[0])
    first = next(iter(live))["x_t"]
    step[0] = 3
    torch.testing.assert_close(next(iter(live))["x_t"], batches[0]["x_t"])  # read per iteration
    assert not torch.equal(first, batches[0]["x_t"])
