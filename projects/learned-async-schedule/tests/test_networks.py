import pytest
import torch

from async_schedule.networks import DualTimeDiT, patchify, unpatchify


def randomised_dit(**kwargs) -> DualTimeDiT:
    """A DiT with every weight random (the zero init would hide the conditioning)."""
    torch.manual_seed(0)
    net = DualTimeDiT(width=32, depth=2, heads=2, **kwargs)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)
    return net


def outputs(net, t_lead, t_lag, labels=None):
    torch.manual_seed(1)
    x_lead, x_lag = torch.randn(3, 4, 4, 4), torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        return net(x_lead, x_lag, torch.full((3,), t_lead), torch.full((3,), t_lag), labels)


def distinct(a, b) -> bool:
    return not all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b, strict=True))


def test_the_dit_sees_two_distinct_timesteps():
    net = randomised_dit()
    assert net.embed_t_lead is not net.embed_t_lag
    assert distinct(outputs(net, 0.8, 0.3), outputs(net, 0.8, 0.6))  # the lag time matters
    assert distinct(outputs(net, 0.8, 0.3), outputs(net, 0.5, 0.3))  # the lead time matters
    assert distinct(outputs(net, 0.8, 0.3), outputs(net, 0.3, 0.8))  # and which is which


def test_the_swap_check_catches_tied_embeddings():
    """With one embedding shared by both times, swapping them cannot change the output; the
    check above would then fail, which is the point of it."""
    net = randomised_dit()
    net.embed_t_lag = net.embed_t_lead
    assert not distinct(outputs(net, 0.8, 0.3), outputs(net, 0.3, 0.8))


def test_output_shapes_class_labels_and_zero_init():
    net = DualTimeDiT(width=32, depth=1, heads=2, num_classes=10)
    v_lead, v_lag = outputs(net, 0.5, 0.2, torch.arange(3))
    assert v_lead.shape == (3, 4, 4, 4) and v_lag.shape == (3, 1, 16, 16)
    assert v_lead.abs().max() == 0 and v_lag.abs().max() == 0  # adaLN-Zero start
    randomised = randomised_dit(num_classes=10)
    assert distinct(outputs(randomised, 0.5, 0.2, torch.arange(3)), outputs(randomised, 0.5, 0.2))


def test_patchify_round_trips_and_bad_sizes_are_rejected():
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(unpatchify(patchify(x, 2), 3, 8, 2), x)
    with pytest.raises(ValueError, match="multiple of the patch"):
        DualTimeDiT(lag_size=10, patch=4)


def test_a_global_semantic_vector_reaches_every_token():
    """lead_size=1: one semantic vector per image, added to every token; its velocity is one
    vector too. Changing it changes the texture velocity at every patch."""
    net = randomised_dit(lead_channels=8, lead_size=1)
    torch.manual_seed(1)
    x_lag, t = torch.randn(2, 1, 16, 16), torch.full((2,), 0.5)
    x_lead = torch.randn(2, 8, 1, 1)
    with torch.no_grad():
        v_lead, v_lag = net(x_lead, x_lag, t, t)
        _, other = net(x_lead + 1, x_lag, t, t)
    assert v_lead.shape == (2, 8, 1, 1) and v_lag.shape == (2, 1, 16, 16)
    changed = (patchify(other - v_lag, 4).abs().amax(-1) > 1e-4).all()
    assert changed  # all 16 patches see the global code
