"""LRRF, the Learning Robust Representation Framework (continual adversarial defense): the math.

Setting (stated by the abstract). Tasks t = 1..T share one classification problem; task t is
induced by a white-box attack A_t. A model f = h o g (feature extractor g, classifier h) is
adversarially trained on A_t, examples crafted on the fly against the current model, and must keep
its robustness to A_1..A_{t-1}. After every task i the robust accuracy against every attack j is
recorded: R[i][j].

Metrics (standard continual-learning definitions on R, rows i = after task i, 0-based here):

    AA  = 1/T sum_j R[T-1][j]                                              (average accuracy)
    F   = 1/(T-1) sum_{j<T-1} max_{i in [j, T-2]} (R[i][j] - R[T-1][j])    (average forgetting)
    BWT = 1/(T-1) sum_{j<T-1} (R[T-1][j] - R[j][j])                        (backward transfer)

The three mechanisms are named by the abstract; every formula below is a RECONSTRUCTION (the paper
was not available), labelled [R1]..[R6] and switchable from the configs:

[R1] DRM (Dynamic Representation Matching), within a task, clean z = g(x) vs adversarial
     z~ = g(x~) feature *distributions*, on L2-normalised features n(z):
        L_DRM = MMD^2_k({n(z)}, {n(z~)}) + 1/C sum_c ||mu_c(n(z)) - mu_c(n(z~))||^2
     with a sum of Gaussian kernels at bandwidths (median heuristic) x {0.5, 1, 2}; the
     class-mean term is a switch (``drm_loss(class_means=...)``), off in the configs since
     issue 57 (a pilot: with it the term lowered robust accuracy once it acted).
[R2] DRM's "dynamic" weight: lam1_t = lam1 * max(acc_clean - acc_adv, 0) on the batch
     (the larger the clean/robust gap, the harder the alignment); ``constant`` turns it off.
[R3] CTIR (Cross-Task Invariant Representation) against an accumulated network g_bar:
        L_CTIR = mean_i ||n(g(u_i)) - n(g_bar(u_i))||^2
                 + gamma ||n(Z)n(Z)^T - n(Z_bar)n(Z_bar)^T||_F^2 / B^2
     over u in {x, x~}, n = L2 normalisation, Z the batch's features.
[R4] The accumulated network: the running average of the task end points,
        theta_bar_t = ((t-1) theta_bar_{t-1} + theta_t) / t      (``mean``), or an EMA (``ema``).
[R5] KCO (Knowledge Consolidation Optimisation) on replayed samples (x_m, y_m) and their
     adversarial views x~_m: w x supervised contrastive loss over {n(g(x_m)), n(g(x~_m))} with
     positives = same class across views, plus cross-entropy on both views (w = 0: replay only,
     which at lam3 = 0.5 is ER's loss; the ``lrrf_no_supcon`` subject).
[R6] The buffer: class-balanced, clean images with the task they came from; replayed examples are
     re-crafted against the current model with their task's attack (or a random previous one).

Total: L = L_AT + lam1_t L_DRM + lam2 L_CTIR + lam3 L_KCO,  L_AT = CE(f(x~), y) + CE(f(x), y).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F


# ------------------------------------------------------------------------------ [R1] DRM
def pairwise_sq_dists(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """||a_i - b_j||^2 for a [N, D], b [M, D] -> [N, M]."""
    return (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1)


def gaussian_mmd2(
    x: torch.Tensor, y: torch.Tensor, scales: Sequence[float] = (0.5, 1.0, 2.0)
) -> torch.Tensor:
    """[R1] Biased MMD^2 between samples x [N, D] and y [M, D] under a sum of Gaussian kernels
    k(a, b) = sum_s exp(-||a - b||^2 / (s * m)), m the median pairwise squared distance of the
    pooled sample (detached), so the bandwidths follow the features' scale."""
    pooled = torch.cat([x, y])
    d = pairwise_sq_dists(pooled, pooled)  # [N+M, N+M]
    off_diagonal = d[~torch.eye(len(pooled), dtype=torch.bool, device=d.device)]
    median = off_diagonal.median().detach().clamp_min(1e-6)
    kernel = sum(torch.exp(-d / (s * median)) for s in scales)
    n = len(x)
    kxx, kyy, kxy = kernel[:n, :n], kernel[n:, n:], kernel[:n, n:]
    return kxx.mean() + kyy.mean() - 2 * kxy.mean()


def class_mean_gap(z: torch.Tensor, z_adv: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[R1] 1/C' sum_c ||mu_c(z) - mu_c(z~)||^2 over the C' classes present in the batch."""
    classes = y.unique()
    gaps = [(z[y == c].mean(0) - z_adv[y == c].mean(0)).pow(2).sum() for c in classes]
    return torch.stack(gaps).mean()


def drm_loss(
    z: torch.Tensor, z_adv: torch.Tensor, y: torch.Tensor, class_means: bool = True
) -> torch.Tensor:
    """[R1] L_DRM = MMD^2(n(z), n(z~)) (+ the class-mean gap of n(z), n(z~)), n = L2
    normalisation (on raw features the class-mean term is met by shrinking them all)."""
    u, v = F.normalize(z, dim=1), F.normalize(z_adv, dim=1)
    loss = gaussian_mmd2(u, v)
    return loss + class_mean_gap(u, v, y) if class_means else loss


def drm_weight(
    lam: float, clean_correct: torch.Tensor, adv_correct: torch.Tensor, dynamic: bool
) -> float:
    """[R2] lam1_t = lam1 * max(acc_clean - acc_adv, 0) on the batch, or lam1 if static (a gap
    of two accuracies is at most 1, so no upper clamp is needed)."""
    if not dynamic:
        return float(lam)
    gap = clean_correct.float().mean() - adv_correct.float().mean()
    return float(lam * gap.clamp(min=0.0))


# ----------------------------------------------------------------------------- [R3] CTIR
def ctir_loss(z: torch.Tensor, z_bar: torch.Tensor, gram_weight: float = 1.0) -> torch.Tensor:
    """[R3] mean_i ||n(z_i) - n(z_bar_i)||^2 + gamma ||n(Z)n(Z)^T - n(Zb)n(Zb)^T||_F^2 / B^2.

    z, z_bar: [B, D] features of the same inputs under the current and the accumulated network
    (z_bar carries no gradient)."""
    u, v = F.normalize(z, dim=1), F.normalize(z_bar.detach(), dim=1)
    pointwise = (u - v).pow(2).sum(1).mean()
    relational = (u @ u.T - v @ v.T).pow(2).mean()
    return pointwise + gram_weight * relational


@torch.no_grad()
def accumulate(
    accumulated: dict[str, torch.Tensor],
    current: dict[str, torch.Tensor],
    tasks_done: int,
    rule: str = "mean",
    ema: float = 0.5,
) -> dict[str, torch.Tensor]:
    """[R4] theta_bar after task t (= ``tasks_done``, 1-based) from theta_bar before and theta_t.

    ``mean``: ((t-1) theta_bar + theta_t) / t, the average of all task end points;
    ``ema``: ema * theta_bar + (1 - ema) * theta_t (theta_bar = theta_1 after the first task).
    Integer entries (batch-norm counters) take the current value."""
    if tasks_done < 1:
        raise ValueError(f"tasks_done counts finished tasks from 1, got {tasks_done}")
    out = {}
    for name, value in current.items():
        if tasks_done == 1 or not value.is_floating_point():
            out[name] = value.detach().clone()
        elif rule == "mean":
            out[name] = ((tasks_done - 1) * accumulated[name] + value) / tasks_done
        elif rule == "ema":
            out[name] = ema * accumulated[name] + (1 - ema) * value
        else:
            raise ValueError(f"unknown accumulation rule {rule!r}: use 'mean' or 'ema'")
    return out


# ------------------------------------------------------------------------------ [R5] KCO
def supervised_contrastive(
    features: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Khosla et al.'s SupCon on L2-normalised features [N, D] with labels [N]:
    -1/N sum_i 1/|P(i)| sum_{p in P(i)} log( exp(s_ip / T) / sum_{a != i} exp(s_ia / T) ),
    P(i) = other items of i's class; items without a positive are skipped."""
    u = F.normalize(features, dim=1)
    logits = u @ u.T / temperature  # [N, N]
    self_mask = torch.eye(len(u), dtype=torch.bool, device=u.device)
    logits = logits.masked_fill(self_mask, -math.inf)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positives = (labels.unsqueeze(0) == labels.unsqueeze(1)) & ~self_mask
    count = positives.sum(1)
    has = count > 0
    summed = log_prob.masked_fill(~positives, 0.0).sum(1)
    return -(summed[has] / count[has]).mean()


def kco_loss(
    z: torch.Tensor,
    z_adv: torch.Tensor,
    logits: torch.Tensor,
    logits_adv: torch.Tensor,
    y: torch.Tensor,
    temperature: float = 0.5,
    contrast_weight: float = 1.0,
) -> torch.Tensor:
    """[R5] L_KCO = w SupCon({n(z_m), n(z~_m)}; positives: same class, either view)
    + CE(f(x_m), y_m) + CE(f(x~_m), y_m). ``contrast_weight`` w = 0 leaves the replay CE only
    (at lam3 = 0.5 that is ER's replay loss, the mean CE over both views)."""
    replay = F.cross_entropy(logits, y) + F.cross_entropy(logits_adv, y)
    if contrast_weight == 0:
        return replay
    contrast = supervised_contrastive(torch.cat([z, z_adv]), torch.cat([y, y]), temperature)
    return contrast_weight * contrast + replay


# ------------------------------------------------------------------------------- [R6] buffer
def merge_buffer(
    old_tasks: np.ndarray,
    old_labels: np.ndarray,
    new_labels: np.ndarray,
    per_class: int,
    tasks_done: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """[R6] After task t = ``tasks_done`` (1-based), every class keeps ``per_class`` slots
    shared by the tasks seen: each earlier task keeps floor(per_class / t) of its entries
    (a random subset), the new task fills the rest.

    Returns (indices of kept old entries, indices into the new task's items)."""
    share = per_class // tasks_done
    keep, add = [], []
    for c in np.unique(new_labels):
        kept_c = []
        for task in np.unique(old_tasks[old_labels == c]):
            entries = np.flatnonzero((old_labels == c) & (old_tasks == task))
            kept_c.extend(rng.choice(entries, size=min(share, len(entries)), replace=False))
        new_of_c = np.flatnonzero(new_labels == c)
        n_new = min(per_class - len(kept_c), len(new_of_c))
        keep.extend(kept_c)
        add.extend(rng.choice(new_of_c, size=n_new, replace=False))
    return np.sort(np.asarray(keep, dtype=np.int64)), np.sort(np.asarray(add, dtype=np.int64))


# ----------------------------------------------------------------------- baselines' terms
def distillation_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """T^2 KL(softmax(teacher / T) || softmax(student / T)), batch mean (LwF, AIR)."""
    t = temperature
    target = F.softmax(teacher_logits.detach() / t, dim=1)
    return F.kl_div(F.log_softmax(student_logits / t, dim=1), target, reduction="batchmean") * t * t


def ewc_penalty(
    params: Iterable[tuple[str, torch.Tensor]],
    anchors: dict[str, torch.Tensor],
    fisher: dict[str, torch.Tensor],
) -> torch.Tensor:
    """EWC (Kirkpatrick et al. 2017): 1/2 sum_k F_k (theta_k - theta*_k)^2."""
    terms = [(fisher[n] * (p - anchors[n]).pow(2)).sum() for n, p in params if n in fisher]
    return 0.5 * torch.stack(terms).sum()


# ------------------------------------------------------------------------------ [L1 attack]
def project_l1_ball(v: torch.Tensor, radius: float | torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row of v [B, D] onto {w : ||w||_1 <= radius}
    (Duchi et al. 2008, the sort-based O(D log D) algorithm). Rows already inside stay."""
    radius = torch.as_tensor(radius, dtype=v.dtype, device=v.device)
    radius = radius.expand(v.shape[0]) if radius.ndim == 0 else radius
    a = v.abs()
    inside = a.sum(1) <= radius
    mu, _ = a.sort(dim=1, descending=True)
    cumulative = mu.cumsum(1)
    ks = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    condition = mu - (cumulative - radius.unsqueeze(1)) / ks > 0
    rho = condition.sum(1, keepdim=True) - 1  # the condition holds on a prefix of the sort
    theta = (cumulative.gather(1, rho) - radius.unsqueeze(1)) / (rho + 1).to(v.dtype)
    projected = v.sign() * (a - theta).clamp_min(0)
    return torch.where(inside.unsqueeze(1), v, projected)


def sparse_l1_direction(grad: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The steepest-ascent direction of Tramer & Boneh's sparse L1 PGD: sign(grad) on the
    ``sparsity`` fraction of coordinates with the largest |grad| (per row of [B, D]),
    scaled to unit L1 norm; zero elsewhere."""
    k = max(1, int(round(sparsity * grad.shape[1])))
    top = grad.abs().topk(k, dim=1).indices
    direction = torch.zeros_like(grad)
    direction.scatter_(1, top, grad.gather(1, top).sign())
    return direction / k


# -------------------------------------------------------------------------------- metrics
def average_accuracy(r: np.ndarray) -> float:
    """AA = 1/T sum_j R[T-1][j] for R [T, T] (rows: after task i; columns: attack j)."""
    return float(np.mean(r[-1]))


def average_forgetting(r: np.ndarray) -> float:
    """F = 1/(T-1) sum_{j<T-1} max_{i in [j, T-2]} (R[i][j] - R[T-1][j])."""
    t = r.shape[0]
    return float(np.mean([r[j : t - 1, j].max() - r[-1, j] for j in range(t - 1)]))


def backward_transfer(r: np.ndarray) -> float:
    """BWT = 1/(T-1) sum_{j<T-1} (R[T-1][j] - R[j][j])."""
    t = r.shape[0]
    return float(np.mean([r[-1, j] - r[j, j] for j in range(t - 1)]))


def per_item_metrics(correct: np.ndarray) -> dict[str, np.ndarray]:
    """Per-test-item versions of AA, F and BWT whose means equal the matrix metrics of
    R = correct.mean(-1), for paired intervals over test items.

    correct: [T, T, N] 0/1 (after task i, attack j, item n). For forgetting the argmax row
    i*_j = argmax_{i in [j, T-2]} R[i][j] is chosen on the whole set, then
    F_n = 1/(T-1) sum_j (correct[i*_j, j, n] - correct[T-1, j, n])."""
    correct = correct.astype(np.float64)
    t = correct.shape[0]
    r = correct.mean(-1)
    best = [j + int(np.argmax(r[j : t - 1, j])) for j in range(t - 1)]
    forgetting = np.mean([correct[best[j], j] - correct[-1, j] for j in range(t - 1)], axis=0)
    bwt = np.mean([correct[-1, j] - correct[j, j] for j in range(t - 1)], axis=0)
    return {"aa": correct[-1].mean(0), "forgetting": forgetting, "bwt": bwt}
