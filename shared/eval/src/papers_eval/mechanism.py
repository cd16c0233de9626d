"""Evidence that a method was given a fair chance (claim protocol v3).

Before a ``did not hold`` says anything about a paper, the record must show that the paper's own
loss terms act, that the learned part moved and changes its input, and whether more training
would have closed the gap:

- ``gradient_shares``: for named loss terms (as they enter the total loss, weights included),
  each term's gradient norm over the sum of the norms, and its cosine with the total gradient.
  ``GradientShareMonitor`` logs them every N steps of a Lightning fit from the module's
  ``loss_terms`` (a dict the ``training_step`` sets) and keeps the history for ``claim.json``.
- ``relative_change``: how far a learned part moved from where it started.
- ``input_change``: how much a learned part changes what passes through it.
- ``budget_evidence``: the method and its strongest rival at 1x and 2x the training budget, one
  seed, equal for both: does the gap close?
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback


def gradient_shares(
    terms: Mapping[str, torch.Tensor], parameters: Iterable[torch.Tensor]
) -> dict[str, dict[str, float]]:
    """For each named scalar loss term: ``share`` = ||grad term|| / sum_j ||grad term_j||, and
    ``cosine`` = cos(grad term, grad sum_j term_j), over ``parameters`` (those that require grad).

    The graph is kept (``retain_graph``), so the caller can still call ``backward`` on the total.
    A term that does not reach the parameters has share 0 and cosine 0.
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        raise ValueError("gradient_shares needs parameters that require grad")
    flat = {}
    for name, term in terms.items():
        if term.dim() != 0:
            raise ValueError(f"loss term '{name}' must be a scalar, got shape {tuple(term.shape)}")
        grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        flat[name] = torch.cat(
            [
                (g if g is not None else torch.zeros_like(p)).detach().flatten().double()
                for g, p in zip(grads, params, strict=True)
            ]
        )
    total = torch.stack(list(flat.values())).sum(0)
    norms = {name: g.norm().item() for name, g in flat.items()}
    norm_sum = sum(norms.values())
    total_norm = total.norm().item()
    shares = {}
    for name, g in flat.items():
        share = norms[name] / norm_sum if norm_sum > 0 else 0.0
        denom = norms[name] * total_norm
        cosine = (g @ total).item() / denom if denom > 0 else 0.0
        shares[name] = {"share": share, "cosine": cosine, "norm": norms[name]}
    return shares


class GradientShareMonitor(Callback):
    """Every ``every_n_steps`` training steps, the gradient share and cosine of each named loss
    term (``gradient_shares``), logged as ``grad_share/<term>`` and ``grad_cosine/<term>`` and kept
    in ``history`` (one dict per measured step).

    The LightningModule exposes its terms by setting ``self.loss_terms = {"name": weighted term}``
    in ``training_step`` (the terms whose sum is the returned loss). Works with automatic
    optimisation (measured in ``on_before_backward``); a manually optimised module calls
    ``monitor.measure(module, step)`` itself before its ``manual_backward``.
    """

    def __init__(self, every_n_steps: int = 50, attribute: str = "loss_terms") -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError("every_n_steps must be at least 1")
        self.every_n_steps = every_n_steps
        self.attribute = attribute
        self.history: list[dict[str, Any]] = []

    def measure(self, module: torch.nn.Module, step: int) -> dict[str, dict[str, float]] | None:
        terms = getattr(module, self.attribute, None)
        if not terms:
            raise AttributeError(
                f"{type(module).__name__} has no '{self.attribute}': set "
                f"self.{self.attribute} = {{'term': weighted_loss, ...}} in training_step"
            )
        shares = gradient_shares(terms, module.parameters())
        self.history.append({"step": step, **shares})
        log = getattr(module, "log", None)
        if log is not None and getattr(module, "_trainer", None) is not None:
            for name, values in shares.items():
                log(f"grad_share/{name}", values["share"], on_step=True, on_epoch=False)
                log(f"grad_cosine/{name}", values["cosine"], on_step=True, on_epoch=False)
        return shares

    def on_before_backward(self, trainer, pl_module, loss) -> None:  # noqa: D102
        if trainer.global_step % self.every_n_steps == 0:
            self.measure(pl_module, trainer.global_step)

    def summary(self) -> dict[str, dict[str, float]]:
        """term -> mean share, mean cosine and the last share over the measured steps; the
        record's ``evidence.gradient_share``."""
        return summarise_shares(self.history)


def summarise_shares(history: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean share and cosine of each term over measured steps, and the share at the last one."""
    if not history:
        return {}
    names = [k for k in history[0] if k != "step"]
    return {
        name: {
            "mean_share": sum(h[name]["share"] for h in history) / len(history),
            "mean_cosine": sum(h[name]["cosine"] for h in history) / len(history),
            "last_share": history[-1][name]["share"],
            "steps_measured": len(history),
        }
        for name in names
    }


def _flat(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in parameters])


def relative_change(before: Iterable[torch.Tensor], after: Iterable[torch.Tensor]) -> float:
    """||theta_after - theta_before|| / ||theta_before||: how far training moved a learned part
    (pass ``module.parameters()`` of a copy taken before training and of the trained module)."""
    a, b = _flat(before), _flat(after)
    if a.shape != b.shape:
        raise ValueError(f"parameter counts differ: {a.numel()} vs {b.numel()}")
    scale, moved = a.norm().item(), (b - a).norm().item()
    if scale == 0:
        return math.inf if moved > 0 else 0.0
    return moved / scale


def input_change(inputs: torch.Tensor, outputs: torch.Tensor) -> float:
    """||f(x) - x|| / ||x|| over a batch: how much a learned part changes what passes through it
    (a learned view, a reweighting, a correction); 0 means it acts as the identity."""
    if inputs.shape != outputs.shape:
        raise ValueError(f"shapes differ: {tuple(inputs.shape)} vs {tuple(outputs.shape)}")
    scale = inputs.double().norm().item()
    diff = (outputs.double() - inputs.double()).norm().item()
    if scale == 0:
        return math.inf if diff > 0 else 0.0
    return diff / scale


def budget_evidence(
    run: Callable[[str, float, int], float | Mapping[str, float]],
    *,
    method: str,
    rival: str,
    goal: str,
    seed: int,
    multipliers: Sequence[float] = (1.0, 2.0),
) -> dict[str, Any]:
    """Rerun ``method`` and its strongest ``rival`` at each budget multiplier (one seed, equal
    for both) and record whether the gap closes.

    ``run(subject, multiplier, seed)`` trains at ``multiplier`` x the registered budget and returns
    the checked metric, or a mapping with ``metric`` and optionally ``wall_time_s`` and
    ``updates``. ``gap`` is the method's advantage (``goal`` decides the sign) at each multiplier;
    ``gap_closes`` is whether the advantage grows from the first multiplier to the last.
    When wall times are given and the method costs more per update, ``equal_wall_time`` compares
    the method at each multiplier with the rival at the same wall time (linear interpolation
    between the rival's measured budgets; extrapolation is not attempted and reads None).
    """
    if goal not in ("higher", "lower"):
        raise ValueError("goal must be 'higher' or 'lower'")
    if len(multipliers) < 2 or list(multipliers) != sorted(set(multipliers)):
        raise ValueError("multipliers must be at least two increasing budgets, e.g. (1, 2)")
    sign = 1.0 if goal == "higher" else -1.0
    points: dict[str, dict[str, dict[str, float]]] = {method: {}, rival: {}}
    for subject in (method, rival):
        for multiplier in multipliers:
            start = time.perf_counter()
            out = run(subject, multiplier, seed)
            elapsed = time.perf_counter() - start
            point = dict(out) if isinstance(out, Mapping) else {"metric": float(out)}
            point.setdefault("wall_time_s", elapsed)
            points[subject][f"{multiplier:g}"] = {k: float(v) for k, v in point.items()}
    keys = [f"{m:g}" for m in multipliers]
    gap = {k: sign * (points[method][k]["metric"] - points[rival][k]["metric"]) for k in keys}
    evidence: dict[str, Any] = {
        "method": method,
        "rival": rival,
        "goal": goal,
        "seed": seed,
        "multipliers": list(multipliers),
        "points": points,
        "gap": gap,
        "gap_change": gap[keys[-1]] - gap[keys[0]],
        "gap_closes": bool(gap[keys[-1]] > gap[keys[0]]),
    }
    method_time = [points[method][k]["wall_time_s"] for k in keys]
    rival_time = [points[rival][k]["wall_time_s"] for k in keys]
    evidence["method_to_rival_time_ratio"] = sum(method_time) / max(sum(rival_time), 1e-12)
    equal_time = {}
    for k, t in zip(keys, method_time, strict=True):
        rival_metric = _interpolate(rival_time, [points[rival][j]["metric"] for j in keys], t)
        equal_time[k] = (
            None if rival_metric is None else sign * (points[method][k]["metric"] - rival_metric)
        )
    evidence["equal_wall_time_gap"] = equal_time
    return evidence


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    pairs = sorted(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(pairs, pairs[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None
