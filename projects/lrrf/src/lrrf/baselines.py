"""The baselines' training terms (same interface: added to the adversarial-training loss).

- Sequential AT: no extra term (the lower bound); joint AT: every batch mixes all attacks (the
  ceiling); both are training rules in model.py.
- ER: adversarial training on replayed buffer items, re-attacked with their task's attack.
- DER++ (Buzzega et al. 2020): logit replay, alpha ||f(x_m) - l_m||^2 + beta CE(f(x_m'), y_m').
- LwF (Li & Hoiem 2017): distillation from the previous task's model on current (clean and
  adversarial) inputs.
- EWC (Kirkpatrick et al. 2017): diagonal empirical Fisher on the task's adversarial examples.
- AIR-style (Zhou & Hua, CVPR 2024): RE-IMPLEMENTED FROM THE PAPER'S DESCRIPTION (no code was
  available): isotropic pseudo replay (the old model's outputs on Gaussian neighbours of the
  adversarial examples), anisotropic pseudo replay (on mixups of adversarial examples), and an
  output-alignment regulariser between clean and adversarial predictions. It is the
  prediction-space regularisation LRRF argues against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lrrf.core import distillation_kl, ewc_penalty


def derpp_loss(
    logits_a: torch.Tensor,
    stored_logits: torch.Tensor,
    logits_b: torch.Tensor,
    labels_b: torch.Tensor,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    """DER++: alpha MSE(current logits, stored logits) + beta CE on a second replay draw."""
    return alpha * F.mse_loss(logits_a, stored_logits) + beta * F.cross_entropy(logits_b, labels_b)


def lwf_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """LwF: KL distillation at temperature 2 from the previous task's model."""
    return distillation_kl(student_logits, teacher_logits, temperature=2.0)


def ewc_loss(net: torch.nn.Module, anchors: dict, fisher: dict) -> torch.Tensor:
    """EWC's quadratic penalty at the last task's end point, Fisher summed over tasks."""
    return ewc_penalty(net.named_parameters(), anchors, fisher)


def empirical_fisher(
    net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher: mean over mini-batches of the squared gradient of the
    cross-entropy (network in eval mode)."""
    was_training = net.training
    net.eval()
    fisher = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    chunks = range(0, len(y), batch)
    for start in chunks:
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[start : start + batch]), y[start : start + batch]).backward()
        for n, p in net.named_parameters():
            if p.grad is not None:
                fisher[n] += p.grad.detach().pow(2) / len(chunks)
    net.zero_grad(set_to_none=True)
    net.train(was_training)
    return fisher


def air_loss(
    net: torch.nn.Module,
    old_model: torch.nn.Module,
    x_adv: torch.Tensor,
    logits: torch.Tensor,
    logits_adv: torch.Tensor,
    noise: float,
) -> torch.Tensor:
    """AIR-style pseudo replay + output alignment (re-implemented, see the module doc):
    KL(old || new) on isotropic neighbours clip(x~ + noise N(0, I)) and on anisotropic mixups
    lam x~_i + (1 - lam) x~_pi(i), lam ~ U(0, 1), plus KL between the clean and adversarial
    predictions (clean as the target)."""
    isotropic = (x_adv + noise * torch.randn_like(x_adv)).clamp(0, 1)
    lam = torch.rand(len(x_adv), 1, 1, 1, device=x_adv.device)
    anisotropic = lam * x_adv + (1 - lam) * x_adv[torch.randperm(len(x_adv), device=x_adv.device)]
    pseudo = torch.cat([isotropic, anisotropic])
    with torch.no_grad():
        teacher = old_model(pseudo)
    replay = distillation_kl(net(pseudo), teacher, temperature=2.0)
    alignment = distillation_kl(logits_adv, logits.detach(), temperature=1.0)
    return replay + alignment
