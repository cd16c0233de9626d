"""How each method reaches a new session, given a trained IbciModule and that session's data.

Every function returns an ``Adapted``: the input-path parameters phi (None: the module's own)
and optionally a replacement backbone; ``decode(module, adapted, batch)`` transcribes with it.

- ``meta_alignment``: the paper's deployment (eq. 2 from phi_0, learned step sizes).
- ``zero_shot``: no adaptation (identity for the pooled backbone, mean held-in layer otherwise).
- ``gradient_alignment``: the same alignment layer fit by Adam from its unadapted start (no
  meta-learning); with the session-layer backbone this is the paper's contrast (a new session
  layer fit on the calibration sentences, backbone frozen).
- ``full_finetune``: every backbone weight fine-tuned on the calibration sentences.
- ``restandardise``: unsupervised per-channel re-standardisation with the session's own
  statistics (calibration + evaluation neural data, no transcripts).
- ``shuffled``: calibration transcripts permuted among the sentences (the negative control).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ibci_fewshot import core
from ibci_fewshot.model import IbciModule


@dataclass
class Adapted:
    phi: core.Params | None
    decoder: core.GRUDecoder | None = None


def decode(module: IbciModule, adapted: Adapted, batch, lexicon: bool = False) -> list[str]:
    module.eval()
    return module.transcribe(batch, adapted.phi, adapted.decoder, lexicon=lexicon)


def zero_shot(module: IbciModule, calibration) -> Adapted:
    return Adapted(module.zero_shot_params())


def meta_alignment(module: IbciModule, calibration, lr_scale: float = 1.0) -> Adapted:
    module.eval()
    return Adapted(module.adapt_meta(calibration, lr_scale=lr_scale))


def gradient_alignment(module: IbciModule, calibration, lr: float, steps: int) -> Adapted:
    module.eval()
    start = module.zero_shot_params()
    with torch.enable_grad():
        phi = core.fit_by_gradient(lambda p: module.loss(calibration, p), start, lr, steps)
    return Adapted(phi)


def full_finetune(
    module: IbciModule, calibration, lr: float, steps: int, align: bool = False
) -> Adapted:
    """Fine-tune a copy of the backbone (and, with ``align``, an affine alignment from its
    unadapted start) on the calibration sentences."""
    module.eval()
    decoder = copy.deepcopy(module.decoder).requires_grad_(True)
    phi = {k: v.clone().requires_grad_(align) for k, v in module.zero_shot_params().items()}
    parameters = list(decoder.parameters()) + ([*phi.values()] if align else [])
    optimizer = torch.optim.Adam(parameters, lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            module.loss(calibration, phi, decoder=decoder).backward()
            optimizer.step()
    return Adapted({k: v.detach() for k, v in phi.items()}, decoder.requires_grad_(False))


def restandardise(module: IbciModule, unlabelled: torch.Tensor, lengths: torch.Tensor) -> Adapted:
    """phi mapping the session's smoothed channels to zero mean and unit variance (no labels)."""
    x = module.smooth(unlabelled)  # [N, T, C]
    valid = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    frames = x[valid]  # [frames, C]
    mean, std = frames.mean(0), frames.std(0) + 1e-3
    if module.form == "diag_lowrank":
        phi = module.zero_shot_params()
        phi["gain"], phi["bias"] = 1 / std - 1, -mean / std
        return Adapted(phi)
    if module.form == "affine_softsign":
        base = module.zero_shot_params()  # standardise, then the mean held-in layer
        return Adapted(
            {"weight": base["weight"] / std, "bias": base["bias"] - base["weight"] @ (mean / std)}
        )
    return Adapted({"weight": torch.diag(1 / std), "bias": -mean / std})


def shuffled(calibration) -> dict[str, torch.Tensor]:
    """The calibration batch with each sentence given another sentence's transcript (a cyclic
    shift, so no sentence keeps its own)."""
    out = dict(calibration)
    out["y"] = torch.roll(calibration["y"], 1, dims=0)
    out["y_lengths"] = torch.roll(calibration["y_lengths"], 1, dims=0)
    return out
