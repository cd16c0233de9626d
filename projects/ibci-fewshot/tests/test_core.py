import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchmetrics.functional.text import char_error_rate, word_error_rate

from ibci_fewshot import core
from ibci_fewshot.metrics import (
    Lexicon,
    edit_distance,
    falcon_words,
    per_item_rates,
    plain_text,
    sentence_errors,
    session_rates,
)
from ibci_fewshot.model import IbciModule, UnknownSessionError
from papers_gpu import derived_seed, seed_all_generators


def ctc_case(dtype=torch.float64):
    torch.manual_seed(0)
    logits = torch.randn(12, 3, 6, dtype=dtype, requires_grad=True)  # [T, B, K]
    targets = torch.tensor([[1, 1, 2, 3], [4, 5, 0, 0], [2, 0, 0, 0]])  # a repeat in row 0
    return logits, targets, torch.tensor([12, 9, 5]), torch.tensor([4, 2, 1])


def test_pure_ctc_matches_torch_in_value_and_gradient():
    logits, targets, lengths, label_lengths = ctc_case()
    pure = core.ctc_loss_pure(logits.log_softmax(-1), targets, lengths, label_lengths)
    reference = F.ctc_loss(
        logits.log_softmax(-1), targets, lengths, label_lengths, reduction="none"
    )
    torch.testing.assert_close(pure, reference, rtol=1e-10, atol=1e-10)
    (g_pure,) = torch.autograd.grad(pure.sum(), logits)
    (g_ref,) = torch.autograd.grad(
        F.ctc_loss(logits.log_softmax(-1), targets, lengths, label_lengths, reduction="sum"),
        logits,
    )
    torch.testing.assert_close(g_pure, g_ref, rtol=1e-8, atol=1e-10)


def test_pure_ctc_has_a_second_derivative_and_torch_has_none():
    small = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    targets, lengths, label_lengths = (
        torch.tensor([[1, 1], [2, 3]]),
        torch.tensor([5, 4]),
        torch.tensor([2, 2]),
    )
    assert torch.autograd.gradgradcheck(
        lambda z: core.ctc_loss_pure(z.log_softmax(-1), targets, lengths, label_lengths).sum(),
        (small,),
    )
    logits, targets, lengths, label_lengths = ctc_case()
    loss = F.ctc_loss(logits.log_softmax(-1), targets, lengths, label_lengths)
    (g,) = torch.autograd.grad(loss, logits, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.pow(2).sum(), logits)


def test_pure_ctc_by_hand_on_two_steps():
    """T = 2, label 'a': paths a-a, a-blank, blank-a: p = pa1 pa2 + pa1 pb2 + pb1 pa2."""
    probs = torch.tensor([[[0.6, 0.4]], [[0.3, 0.7]]], dtype=torch.float64)  # [T, B, K]
    loss = core.ctc_loss_pure(
        probs.log(), torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1])
    )
    assert loss.item() == pytest.approx(-math.log(0.4 * 0.7 + 0.4 * 0.3 + 0.6 * 0.7))


def test_mean_reduction_divides_by_label_length_like_torch():
    logits, targets, lengths, label_lengths = ctc_case()
    batch_first = logits.log_softmax(-1).transpose(0, 1)
    pure = core.ctc_loss(batch_first, targets, lengths, label_lengths, impl="pure")
    torch_mean = core.ctc_loss(batch_first, targets, lengths, label_lengths, impl="torch")
    assert pure.item() == pytest.approx(torch_mean.item(), rel=1e-9)


def tiny_decoder():
    torch.manual_seed(1)
    return core.GRUDecoder(
        channels=3, projection=2, hidden=3, layers=1, kernel=2, stride=1
    ).double()


def tiny_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(2, 6, 3, generator=g, dtype=torch.float64),
        "lengths": torch.tensor([6, 5]),
        "y": torch.tensor([[1, 2], [3, 0]]),
        "y_lengths": torch.tensor([2, 1]),
    }


@pytest.mark.parametrize("form", ["affine", "diag_lowrank"])
def test_second_order_meta_gradient_matches_finite_differences(form):
    decoder = tiny_decoder().requires_grad_(False)
    support, query = tiny_batch(0), tiny_batch(1)
    start = {k: v.double() for k, v in core.identity_alignment(3, form, rank=2).items()}
    log_step = {k: torch.tensor(math.log(0.5), dtype=torch.float64) for k in start}
    names = list(start)

    def meta_loss(*tensors):
        phi0 = dict(zip(names, tensors, strict=True))
        loss, _ = core.episode_loss(decoder, form, support, query, phi0, log_step, 2, False)
        return loss

    inputs = tuple(start[k].clone().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(meta_loss, inputs, eps=1e-6, atol=1e-5)


def test_first_order_meta_gradient_ignores_the_inner_hessian():
    """FOMAML: d L_Q / d phi0 equals d L_Q / d phi at the adapted point."""
    decoder = tiny_decoder().float().requires_grad_(False)
    support, query = tiny_batch(0), tiny_batch(1)
    support = {k: v.float() if v.is_floating_point() else v for k, v in support.items()}
    query = {k: v.float() if v.is_floating_point() else v for k, v in query.items()}
    start = {
        k: v.clone().requires_grad_(True) for k, v in core.identity_alignment(3, "affine").items()
    }
    log_step = {k: torch.tensor(math.log(0.5), requires_grad=True) for k in start}
    loss, adapted = core.episode_loss(decoder, "affine", support, query, start, log_step, 2, True)
    loss.backward()
    at_adapted = {k: v.detach().clone().requires_grad_(True) for k, v in adapted.items()}
    log_probs, lengths = decoder(
        core.apply_alignment(query["x"], at_adapted, "affine"), query["lengths"]
    )
    core.ctc_loss(log_probs, query["y"], lengths, query["y_lengths"]).backward()
    for k in start:
        torch.testing.assert_close(start[k].grad, at_adapted[k].grad)
        assert log_step[k].grad is not None and log_step[k].grad.abs() > 0


@pytest.mark.parametrize("form", ["affine", "diag_lowrank"])
def test_identity_alignment_is_the_identity(form):
    x = torch.randn(2, 5, 7)
    phi = core.identity_alignment(7, form, rank=3)
    torch.testing.assert_close(core.apply_alignment(x, phi, form), x)
    assert core.relative_input_change(x, phi, form) == pytest.approx(0.0, abs=1e-6)


def test_greedy_decode_merges_repeats_and_drops_blanks():
    path = torch.tensor([[1, 1, 0, 1, 2, 2, 0, 0, 3]])  # a a _ a b b _ _ c
    log_probs = F.one_hot(path, 5).float().log()
    assert core.greedy_decode(log_probs, torch.tensor([9])) == [[1, 1, 2, 3]]
    assert core.greedy_decode(log_probs, torch.tensor([4])) == [[1, 1]]


def test_characters_encode_and_reject_outsiders():
    assert core.decode_indices(core.encode_text("it's>ok~?,")) == "it's>ok~?,"
    assert len(set(core.encode_text(core.CHARSET))) == 31 and core.N_CLASSES == 32
    with pytest.raises(core.CharacterError, match="!"):
        core.encode_text("hi!")


def test_falcon_word_split_by_hand():
    assert falcon_words("i>am>here~") == ["i", "am", "here", "~"]
    assert falcon_words("well,>why?") == ["well", ",", "why", "?"]
    assert falcon_words("don't>go") == ["don't", "go"]


def test_cer_and_wer_by_hand():
    predictions = ["i>an>here~", "wel>why?"]
    references = ["i>am>here~", "well,>why?"]
    cer, wer = session_rates(predictions, references)
    # chars: 1 substitution / 10 + (1 deletion 'l', 1 deletion ',') / 10
    assert cer == pytest.approx(3 / 20)
    # words: 'an' for 'am' (1 of 4); 'wel' for 'well' and ',' missing (2 of 4)
    assert wer == pytest.approx(3 / 8)
    assert edit_distance("kitten", "sitting") == 3


def test_cer_and_wer_agree_with_torchmetrics_on_plain_text():
    predictions = ["i>an>here~", "wel>why?", "the>big>dog", "go>home,>now"]
    references = ["i>am>here~", "well,>why?", "the>dog", "go>home>now~"]
    _, wer = session_rates(predictions, references)
    expected = word_error_rate(
        [plain_text(p) for p in predictions], [plain_text(r) for r in references]
    )
    assert wer == pytest.approx(expected.item())
    cer, _ = session_rates(predictions, references)
    assert cer == pytest.approx(char_error_rate(predictions, references).item())


def test_per_item_rates_average_to_the_session_mean():
    sessions = [(["a>b", "c"], ["a>b", "d"]), (["x>y>z"], ["x>q>z"])]
    cer, wer = per_item_rates(sessions)
    assert len(wer) == 3
    expected = (session_rates(*sessions[0])[1] + session_rates(*sessions[1])[1]) / 2
    assert wer.mean() == pytest.approx(expected)
    assert cer.mean() == pytest.approx(
        (session_rates(*sessions[0])[0] + session_rates(*sessions[1])[0]) / 2
    )


def test_lexicon_snaps_words_and_keeps_punctuation():
    lexicon = Lexicon(["hello", "world", "don't"])
    assert lexicon("helo>wrld~") == "hello>world~"
    assert lexicon("dont,>hello?") == "don't,>hello?"


def module_and_batch():
    torch.manual_seed(0)
    module = IbciModule(channels=6, n_sessions=2, projection=4, hidden=8, kernel=2, stride=1)
    g = torch.Generator().manual_seed(3)
    batch = {
        "x": torch.randn(3, 10, 6, generator=g),
        "lengths": torch.tensor([10, 9, 8]),
        "y": torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]]),
        "y_lengths": torch.tensor([3, 2, 1]),
        "session": torch.tensor([0, 1, 0]),
    }
    return module, batch


def test_module_inner_steps_lower_the_support_loss():
    module, batch = module_and_batch()
    module.eval()
    before = module.loss(batch, module.zero_shot_params()).item()
    adapted = module.adapt_meta(batch, steps=5)
    assert module.loss(batch, adapted).item() < before
    assert core.parameter_distance(adapted, module.zero_shot_params()) > 0


def test_an_unseen_session_tag_routes_to_calibration():
    module, batch = module_and_batch()
    module.eval()
    with pytest.raises(UnknownSessionError, match="calibrate"):
        module.params_for("sub-T5-held-out_ses-20230417")
    identity = module.params_for("held-in-tag", known_tags={"held-in-tag"})
    torch.testing.assert_close(identity["weight"], torch.eye(6))
    adapted = module.calibrate("sub-T5-held-out_ses-20230417", batch)
    assert module.params_for("sub-T5-held-out_ses-20230417") is adapted
    assert not torch.equal(adapted["weight"], torch.eye(6))


def test_ranks_draw_different_training_noise():
    """Under DDP, SeedEveryStep re-seeds every rank from (seed, rank, epoch, batch) before each
    batch: stage 1's augmentation and stage 2's episode drift then differ across ranks and repeat
    on the same rank (a resumed run draws what the uninterrupted one drew)."""
    x = torch.zeros(2, 5, 4)
    draws = []
    for rank in (0, 1, 0):
        seed_all_generators(derived_seed(7, rank, 0, 3))
        draws.append((core.drift_augment(x, 0.3, 0.2, 0.1), core.random_drift(4, 0.2, 0.3, 0.5)))
    (aug_a, drift_a), (aug_b, drift_b), (aug_c, drift_c) = draws
    assert not torch.allclose(aug_a, aug_b)
    assert not any(torch.allclose(a, b) for a, b in zip(drift_a, drift_b, strict=True))
    torch.testing.assert_close(aug_a, aug_c)
    for a, c in zip(drift_a, drift_c, strict=True):
        torch.testing.assert_close(a, c)


# ----------------------------------------------------------- value tests from the mutation lane


def test_pure_ctc_rejects_empty_transcripts():
    logits, targets, lengths, label_lengths = ctc_case()
    with pytest.raises(ValueError, match=r"^ctc_loss_pure needs target_lengths >= 1"):
        core.ctc_loss_pure(logits.log_softmax(-1), targets, lengths, torch.tensor([4, 0, 1]))


def test_drift_augment_draws_one_gain_and_offset_per_sentence_and_channel():
    """Per-sentence, per-channel gain exp(gain_sd * N(0, 1)) and offset offset_sd * N(0, 1),
    constant over time; white noise is fresh per bin."""
    torch.manual_seed(0)
    ones = torch.ones(400, 3, 5)
    gain = core.drift_augment(ones, white_noise=0.0, offset_sd=0.0, gain_sd=0.5)
    torch.testing.assert_close(gain, gain[:, :1].expand_as(gain))  # constant over time
    assert not torch.allclose(gain[0], gain[1])  # its own gain per sentence
    assert gain.log().std().item() == pytest.approx(0.5, rel=0.1)
    offset = core.drift_augment(torch.zeros(400, 3, 5), 0.0, offset_sd=0.2, gain_sd=0.0)
    torch.testing.assert_close(offset, offset[:, :1].expand_as(offset))
    assert not torch.allclose(offset[0], offset[1])
    assert offset.std().item() == pytest.approx(0.2, rel=0.1)
    assert offset.abs().max().item() < 2.0  # Gaussian offsets, not 0.2 / N(0, 1)
    noise = core.drift_augment(torch.zeros(400, 3, 5), 0.3, 0.0, 0.0)
    assert not torch.allclose(noise[:, 0], noise[:, 1])  # fresh per bin
    assert noise.std().item() == pytest.approx(0.3, rel=0.1)


def test_relative_input_change_by_hand():
    x = torch.randn(2, 4, 3)
    eye = core.identity_alignment(3, "affine")
    assert core.relative_input_change(x, eye, "affine") == pytest.approx(0.0)
    doubled = {"weight": 2 * torch.eye(3), "bias": torch.zeros(3)}
    assert core.relative_input_change(x, doubled, "affine") == pytest.approx(1.0)
    # the softsign form's reference is softsign(x): its identity layer changes nothing
    assert core.relative_input_change(x, eye, "affine_softsign") == pytest.approx(0.0, abs=1e-7)
    assert core.relative_input_change(x, doubled, "affine_softsign") == pytest.approx(
        ((F.softsign(2 * x) - F.softsign(x)).norm() / F.softsign(x).norm()).item()
    )


def test_session_layers_start_at_softsign_and_route_each_sentence_to_its_session():
    layers = core.SessionLayers(n_sessions=3, channels=4)
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(layers(x, torch.tensor([0, 2])), F.softsign(x))
    with torch.no_grad():
        layers.weight[1] = 2 * torch.eye(4)
        layers.bias[1] = 0.5
        layers.weight[2] = -torch.eye(4)
    out = layers(x, torch.tensor([1, 2]))
    torch.testing.assert_close(out[0], F.softsign(2 * x[0] + 0.5))
    torch.testing.assert_close(out[1], F.softsign(-x[1]))
    mean = layers.mean_layer()
    torch.testing.assert_close(mean["weight"], (2 * torch.eye(4)) / 3)
    torch.testing.assert_close(mean["bias"], torch.full((4,), 0.5 / 3))


def test_plain_text_joins_falcon_words_with_single_spaces():
    assert plain_text("i>am>>here~") == "i am here ~"
    assert plain_text("well,>why?") == "well , why ?"


def test_lexicon_keeps_known_and_empty_words():
    lexicon = Lexicon(["hello", "world"])
    assert lexicon.snap_word("") == "" and lexicon.snap_word("world") == "world"
    assert lexicon.snap_word("wordl") == "world"


def test_random_drift_and_apply_drift_by_hand():
    gain, offset, mixing = core.random_drift(4, 0.0, 0.0, 0.0)
    torch.testing.assert_close(gain, torch.ones(4))
    torch.testing.assert_close(offset, torch.zeros(4))
    torch.testing.assert_close(mixing, torch.eye(4))
    torch.manual_seed(0)
    gain, offset, mixing = core.random_drift(100, 0.2, 0.3, 0.5)
    assert gain.shape == offset.shape == (100,) and mixing.shape == (100, 100)
    assert gain.log().std().item() == pytest.approx(0.2, rel=0.2)
    assert offset.std().item() == pytest.approx(0.3, rel=0.2)
    assert (mixing - torch.eye(100)).std().item() == pytest.approx(0.05, rel=0.1)  # 0.5 / sqrt(C)
    x = torch.randn(2, 3, 4)
    drift = (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.full((4,), 0.5), 2 * torch.eye(4).flip(0))
    expected = (x * drift[0] + 0.5).flip(-1) * 2  # (g x + o) M with M the reversal times 2
    torch.testing.assert_close(core.apply_drift(x, drift), expected)


def test_gaussian_smoothing_is_a_normalised_kernel_of_plus_minus_three_sigma():
    impulse = torch.zeros(1, 21, 2)
    impulse[0, 10] = 1.0
    out = core.gaussian_smooth(impulse, sigma=1.5)
    offsets = torch.arange(-5, 6, dtype=torch.float32)  # ceil(3 * 1.5) = 5 bins each side
    kernel = torch.exp(-0.5 * (offsets / 1.5) ** 2)
    torch.testing.assert_close(out[0, 5:16, 0], kernel / kernel.sum())
    torch.testing.assert_close(out[0, 5:16, 1], kernel / kernel.sum())
    assert out[0, :5].abs().max() == 0 and out[0, 16:].abs().max() == 0
    assert core.gaussian_smooth(impulse, sigma=0.0) is impulse
    tiny = core.gaussian_smooth(impulse, sigma=0.2)  # half-width at least one bin
    assert tiny[0, 9, 0] > 0 and tiny[0, 8, 0] == 0


def test_diagonal_low_rank_alignment_by_hand():
    x = torch.randn(2, 3, 4)
    phi = {
        "gain": torch.tensor([0.5, 0.0, -0.5, 1.0]),
        "u": torch.arange(8.0).view(4, 2) / 10,
        "v": torch.ones(4, 2),
        "bias": torch.full((4,), 0.1),
    }
    expected = torch.empty_like(x)
    for c in range(4):  # (1 + g_c) x_c + sum_r u_cr sum_j v_jr x_j + b_c
        low_rank = sum(phi["u"][c, r] * x.sum(-1) for r in range(2))
        expected[..., c] = (1 + phi["gain"][c]) * x[..., c] + low_rank + 0.1
    torch.testing.assert_close(core.apply_alignment(x, phi, "diag_lowrank"), expected)
    start = core.identity_alignment(4, "diag_lowrank", rank=2, generator=torch.Generator())
    assert {k: tuple(v.shape) for k, v in start.items()} == {
        "gain": (4,),
        "u": (4, 2),
        "v": (4, 2),
        "bias": (4,),
    }
    assert start["v"].abs().sum() > 0 and start["u"].abs().sum() == 0


def test_parameter_distance_and_output_lengths_by_hand():
    start = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}
    moved = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([6.0])}
    assert core.parameter_distance(moved, start) == pytest.approx(math.sqrt(5 / 25))
    decoder = core.GRUDecoder(channels=3, projection=2, hidden=4, layers=1, kernel=4, stride=2)
    lengths = decoder.output_lengths(torch.tensor([4, 5, 6, 11, 2]))
    assert lengths.tolist() == [1, 1, 2, 4, 1]  # (L - 4) // 2 + 1, at least 1
    log_probs, out = decoder(torch.randn(2, 3, 3), torch.tensor([3, 2]))  # shorter than kernel
    assert log_probs.shape == (2, 1, core.N_CLASSES) and out.tolist() == [1, 1]
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 1))


def test_plain_gradient_fit_reaches_the_minimum_and_decay_pulls_to_the_start():
    def loss_of(phi):
        return ((phi["a"] - 3.0) ** 2).sum()

    start = {"a": torch.ones(2)}
    free = core.fit_by_gradient(loss_of, start, lr=0.05, steps=400)
    torch.testing.assert_close(free["a"], torch.full((2,), 3.0), atol=0.05, rtol=0)
    # (a - 3)^2 + (a - 1)^2 is least at a = 2
    decayed = core.fit_by_gradient(loss_of, start, lr=0.05, steps=400, weight_decay_to_start=1.0)
    torch.testing.assert_close(decayed["a"], torch.full((2,), 2.0), atol=0.05, rtol=0)
    # (a - 3)^2 + 3 (a - 1)^2 is least at a = 1.5 (a decay linear in a - 1 would give a = 0)
    strong = core.fit_by_gradient(loss_of, start, lr=0.05, steps=400, weight_decay_to_start=3.0)
    torch.testing.assert_close(strong["a"], torch.full((2,), 1.5), atol=0.05, rtol=0)
    assert not free["a"].requires_grad and torch.equal(start["a"], torch.ones(2))


# ------------------------------------- value tests for the survivors of the complete lane run


def test_adapt_defaults_to_first_order():
    """phi_1 = a - 0.1 * 2a = 0.8 a; first order treats the gradient as a constant, so
    d phi_1 / d a = 1 (second order: 0.8)."""
    start = {"a": torch.tensor([1.0, -2.0], requires_grad=True)}
    log_step = {"a": torch.tensor(math.log(0.1))}

    def loss_of(phi):
        return (phi["a"] ** 2).sum()

    phi = core.adapt(loss_of, start, log_step, steps=1)
    torch.testing.assert_close(phi["a"].detach(), torch.tensor([0.8, -1.6]))
    phi["a"].sum().backward()
    torch.testing.assert_close(start["a"].grad, torch.ones(2))
    start["a"].grad = None
    core.adapt(loss_of, start, log_step, steps=1, first_order=False)["a"].sum().backward()
    torch.testing.assert_close(start["a"].grad, torch.full((2,), 0.8))


def test_identity_alignment_starts_by_form_and_affine_adds_its_bias():
    soft = core.identity_alignment(4, "affine_softsign")
    assert set(soft) == {"weight", "bias"} and torch.equal(soft["weight"], torch.eye(4))
    torch.manual_seed(123)  # the global generator must not be the one drawn from
    low = core.identity_alignment(50, "diag_lowrank", generator=torch.Generator().manual_seed(7))
    expected_v = torch.randn(50, 8, generator=torch.Generator().manual_seed(7)) / math.sqrt(50)
    torch.testing.assert_close(low["v"], expected_v)  # default rank 8, V ~ N(0, 1 / C)
    assert low["u"].shape == (50, 8) and low["u"].abs().sum() == 0
    x = torch.randn(2, 3, 4)
    phi = {"weight": 2 * torch.eye(4), "bias": torch.tensor([1.0, -1.0, 0.5, 0.0])}
    torch.testing.assert_close(core.apply_alignment(x, phi, "affine"), 2 * x + phi["bias"])
    torch.testing.assert_close(
        core.apply_alignment(x, phi, "affine_softsign"), F.softsign(2 * x + phi["bias"])
    )


def test_ctc_loss_defaults_to_torch_which_zeroes_an_impossible_sentence():
    """Sentence 2 has one step for two labels: F.ctc_loss (zero_infinity) counts it as 0; the
    pure recursion gives it the finite stand-in for +inf, -finfo.min / 4."""
    torch.manual_seed(0)
    log_probs = torch.randn(2, 4, 5, dtype=torch.float64).log_softmax(-1)  # [B, T, K]
    targets, label_lengths = torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 2])
    lengths = torch.tensor([4, 1])
    per_sequence = core.ctc_loss_pure(log_probs.transpose(0, 1), targets, lengths, label_lengths)
    assert per_sequence[1].item() == torch.finfo(torch.float64).max / 4
    expected = (per_sequence[0] / 2 + 0.0) / 2  # mean over sentences of loss / label length
    torch.testing.assert_close(core.ctc_loss(log_probs, targets, lengths, label_lengths), expected)
    assert core.ctc_loss(log_probs, targets, lengths, label_lengths, impl="pure") > 1e300


def test_the_math_builds_its_tensors_on_the_input_device():
    """PyTorch's meta device stands in for a GPU: a tensor made on the CPU next to it raises."""
    meta = torch.device("meta")
    x = torch.zeros(2, 5, 4, device=meta)
    assert core.drift_augment(x, 0.3, 0.2, 0.1).device == meta
    assert core.gaussian_smooth(x, 1.0).device == meta
    loss = core.ctc_loss_pure(
        torch.zeros(6, 2, 5, device=meta),
        torch.tensor([[1, 2], [3, 0]], device=meta),
        torch.tensor([6, 5], device=meta),
        torch.tensor([2, 1]),  # on the CPU: the empty-label check reads its values
    )
    assert loss.device == meta and loss.shape == (2,)


def test_drift_draws_reproduce_by_hand_from_the_seed():
    """x * exp(gain_sd z1) + offset_sd z2 + noise_sd z3 and M = I + mix_sd / sqrt(C) z, with the
    draws in this order from the global generator (the signs are fixed by the seeded values)."""
    x = torch.randn(3, 4, 2)
    torch.manual_seed(5)
    out = core.drift_augment(x, 0.3, 0.2, 0.1)
    torch.manual_seed(5)
    gain = torch.exp(0.1 * torch.randn(3, 1, 2))
    offset = 0.2 * torch.randn(3, 1, 2)
    torch.testing.assert_close(out, x * gain + offset + 0.3 * torch.randn(3, 4, 2))
    torch.manual_seed(6)
    drift = core.random_drift(3, 0.2, 0.3, 0.5)
    torch.manual_seed(6)
    expected = (
        torch.exp(0.2 * torch.randn(3)),
        0.3 * torch.randn(3),
        torch.eye(3) + 0.5 / math.sqrt(3) * torch.randn(3, 3),
    )
    for got, want in zip(drift, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_first_order_episode_adapts_with_f_ctc_for_the_given_steps():
    """By default an episode is first order with F.ctc_loss (zero_infinity): two plain gradient
    steps of size 0.5 on the support, then the query loss, whose second sentence (one output step
    for two labels) counts 0."""
    decoder = tiny_decoder().requires_grad_(False)
    support, query = tiny_batch(0), tiny_batch(1)
    query = {**query, "lengths": torch.tensor([6, 2]), "y": torch.tensor([[1, 2], [3, 4]])}
    query["y_lengths"] = torch.tensor([2, 2])
    start = core.identity_alignment(3, "affine")
    start = {k: v.double() for k, v in start.items()}
    log_step = {k: torch.tensor(math.log(0.5), dtype=torch.float64) for k in start}
    loss, adapted = core.episode_loss(decoder, "affine", support, query, start, log_step, 2)

    def f_ctc(batch, phi):
        log_probs, lengths = decoder(
            core.apply_alignment(batch["x"], phi, "affine"), batch["lengths"]
        )
        return F.ctc_loss(
            log_probs.transpose(0, 1), batch["y"], lengths, batch["y_lengths"], zero_infinity=True
        )

    phi = start
    for _ in range(2):
        leaves = {k: v.clone().requires_grad_(True) for k, v in phi.items()}
        grads = torch.autograd.grad(f_ctc(support, leaves), list(leaves.values()))
        phi = {k: phi[k] - 0.5 * g for k, g in zip(leaves, grads, strict=True)}
    for k in start:
        torch.testing.assert_close(adapted[k], phi[k])
    torch.testing.assert_close(loss, f_ctc(query, phi))
    assert loss.item() < 100


def test_gaussian_smoothing_keeps_double_precision():
    x = torch.zeros(1, 9, 2, dtype=torch.float64)
    x[0, 4] = 1.0
    out = core.gaussian_smooth(x, sigma=1.0)
    kernel = torch.exp(-0.5 * torch.arange(-3.0, 4.0, dtype=torch.float64) ** 2)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[0, 1:8, 1], kernel / kernel.sum(), rtol=1e-12, atol=1e-15)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        core.greedy_decode(torch.zeros(2, 3, 4), torch.tensor([3]))
    with pytest.raises(ValueError):
        sentence_errors(["a>b", "c"], ["a>b"])


def test_parameter_distance_of_a_start_smaller_than_one():
    start = {"a": torch.tensor([0.3, 0.4])}  # ||start||^2 = 0.25
    moved = {"a": torch.tensor([0.4, 0.4])}
    assert core.parameter_distance(moved, start) == pytest.approx(math.sqrt(0.01 / 0.25))


def test_gru_decoder_structure_defaults_and_dropout():
    d = core.GRUDecoder()
    assert (d.project.in_features, d.project.out_features) == (192, 64)
    assert (d.gru.input_size, d.gru.hidden_size, d.gru.num_layers) == (64 * 6, 96, 2)
    assert (d.kernel, d.stride) == (6, 3)
    assert d.gru.batch_first and d.gru.dropout == 0.0
    assert (d.readout.in_features, d.readout.out_features) == (96, core.N_CLASSES)
    assert core.GRUDecoder(layers=2, dropout=0.3).gru.dropout == 0.3
    assert core.GRUDecoder(layers=3).gru.num_layers == 3
    one = core.GRUDecoder(layers=1, dropout=0.3)  # no dropout between layers with one layer
    assert one.gru.num_layers == 1 and one.gru.dropout == 0.0


def test_gru_decoder_decodes_each_sentence_of_a_batch_on_its_own():
    decoder = tiny_decoder()
    x = tiny_batch(0)["x"]
    both, _ = decoder(x, torch.tensor([6, 6]))
    alone, _ = decoder(x[1:], torch.tensor([6]))
    torch.testing.assert_close(both[1], alone[0])


def test_short_sentences_are_zero_padded_at_the_end_to_one_window():
    torch.manual_seed(2)
    wide = core.GRUDecoder(channels=5, projection=2, hidden=3, layers=1, kernel=4, stride=2)
    x = torch.randn(1, 2, 5)
    short, lengths = wide(x, torch.tensor([2]))
    padded, _ = wide(torch.cat([x, torch.zeros(1, 2, 5)], dim=1), torch.tensor([4]))
    torch.testing.assert_close(short, padded)
    assert short.shape == (1, 1, core.N_CLASSES) and lengths.tolist() == [1]
    narrow = core.GRUDecoder(channels=3, projection=2, hidden=3, layers=1, kernel=4, stride=2)
    log_probs, lengths = narrow(torch.randn(1, 10, 3), torch.tensor([10]))
    assert log_probs.shape[1] == 4 and lengths.tolist() == [4]  # (10 - 4) // 2 + 1


def test_edit_distance_against_empty_sequences():
    assert edit_distance("", "abc") == 3
    assert edit_distance("abc", "") == 3
    assert edit_distance("", "") == 0
    assert edit_distance("ab", "ba") == 2


def test_falcon_words_drops_hash_and_keeps_empty_words():
    """'#' is dropped; the split is on single spaces, so '>>' leaves an empty word (FALCON's
    evaluator splits with str.split(' '))."""
    assert falcon_words("a#b>c") == ["ab", "c"]
    assert falcon_words("i>>am") == ["i", "", "am"]


def test_sentence_errors_of_no_sentences_are_an_empty_integer_table():
    table = sentence_errors([], [])
    assert table.shape == (0, 4) and table.dtype == np.int64


def test_lexicon_snaps_every_part_that_is_not_punctuation():
    assert Lexicon(["hello", "world"])("X>wordl") == "hello>world"


def test_ctc_loss_rejects_an_unknown_implementation():
    log_probs = torch.zeros(1, 4, 3).log_softmax(-1)
    targets, lengths = torch.tensor([[1]]), torch.tensor([4])
    with pytest.raises(ValueError, match="impl must be 'torch' or 'pure'"):
        core.ctc_loss(log_probs, targets, lengths, torch.tensor([1]), impl="PURE")
