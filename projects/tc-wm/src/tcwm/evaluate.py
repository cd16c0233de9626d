"""Evaluation of a trained world model: CEM MPC towards goal images, open-loop probes,
identifiability of the aligned subspace.

Planning (design note section 6; one budget for every model, in ``PlanBudget``): from a start
state, the goal is the state reached after ``goal_offset`` random actions (DINO-WM-style goal
offset); the goal image is rendered under a DIFFERENT nuisance draw than the episode's (as in
reality, the goal photo shows other distractors). Every ``replan_every`` steps the planner
observes the current frame, runs CEM over ``horizon`` actions in the model's space with the
model's own cost, and executes the first ``replan_every`` actions in the simulator. Success is
the simulator's test on the final state (within ``SUCCESS_RADIUS`` of the goal position).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from tcwm.core import aligned_summary, cem_plan
from tcwm.data import check_goal_tokens
from tcwm.metrics import LinearProbe, affine_r2, mcc, mean_canonical_correlation


@dataclass(frozen=True)
class PlanBudget:
    """One stated planning budget for all models."""

    goal_offset: int = 15
    max_steps: int = 30
    horizon: int = 5
    replan_every: int = 3
    samples: int = 128
    iterations: int = 5
    elites: int = 16


def start_goal_pairs(world, n_pairs: int, kappa: float, goal_offset: int, seed: int) -> list:
    """Fixed seeded (start, goal, start nuisance, goal nuisance) tuples: the goal is the state
    after ``goal_offset`` uniform random actions from the start, not already within the success
    radius of it (such a pair is redrawn); the nuisances are two independent draws."""
    rng = np.random.default_rng(seed)
    pairs = []
    while len(pairs) < n_pairs:
        start = world.sample_start(rng)
        world.set_state(start)
        for _ in range(goal_offset):
            world.step(rng.uniform(-1, 1, world.action_dim).astype(np.float32))
        goal = world.get_state()
        nuisances = world.draw_nuisance(rng, kappa), world.draw_nuisance(rng, kappa)
        if not world.success(start, goal):
            pairs.append((start, goal, *nuisances))
    return pairs


@torch.no_grad()
def plan_to_goal(
    module,
    world,
    pair,
    budget: PlanBudget,
    seed: int,
) -> dict[str, float]:
    """One MPC episode; ``world.observe(nuisance, t)`` gives the frame's tokens [P, D]."""
    start, goal, nuisance, goal_nuisance = pair
    generator = torch.Generator().manual_seed(seed)
    world.set_state(goal)
    goal_tokens = torch.as_tensor(world.observe(goal_nuisance, 0))
    check_goal_tokens(goal_tokens, (module.hparams.n_tokens, module.hparams.embed_dim))
    goal_latent, goal_proprio = _observe_model(module, world, goal_nuisance, 0)
    world.set_state(start)
    latent, proprio = _observe_model(module, world, nuisance, 0)
    n = module.hparams.history
    hist = latent[None].repeat(n, *[1] * latent.dim())[None]
    proprio_hist = None if proprio is None else proprio[None].repeat(n, 1)[None]
    t = 0
    while t < budget.max_steps:
        plan = cem_plan(
            partial(_plan_cost, module, hist, proprio_hist, goal_latent, goal_proprio),
            world.action_dim,
            budget.horizon,
            budget.samples,
            budget.iterations,
            budget.elites,
            generator=generator,
        )
        for action in plan[: budget.replan_every]:
            world.step(action.numpy())
            t += 1
            latent, proprio = _observe_model(module, world, nuisance, t)
            hist = torch.cat([hist[:, 1:], latent[None, None]], 1)
            if proprio_hist is not None:
                proprio_hist = torch.cat([proprio_hist[:, 1:], proprio[None, None]], 1)
            if t >= budget.max_steps:
                break
    final = world.get_state()
    distance = float(np.linalg.norm(world.position(final) - world.position(goal)))
    return {"success": float(world.success(final, goal)), "final_distance": distance}


def _plan_cost(module, hist, proprio_hist, goal_latent, goal_proprio, candidates):
    """The model's cost of each candidate action sequence [N, H, A] from the current history."""
    count = len(candidates)
    expand = hist.expand(count, *hist.shape[1:])
    p_expand = None if proprio_hist is None else proprio_hist.expand(count, -1, -1)
    final, final_proprio = module.rollout(expand, candidates, p_expand)[-1]
    return module.plan_cost(final, goal_latent, final_proprio, goal_proprio)


def _observe_model(module, world, nuisance, t):
    tokens = torch.as_tensor(world.observe(nuisance, t), dtype=torch.float32)
    state = torch.as_tensor(world.get_state(), dtype=torch.float32)
    latent, proprio = module.observation(tokens[None], state[None])
    return latent[0], None if proprio is None else proprio[0]


@torch.no_grad()
def open_loop_probe(
    module, arrays: dict, train_episodes, test_episodes, horizons: int = 5, with_proprio=True
):
    """R^2 of a linear probe (fit on the encoded training frames) from the model's predicted
    latent at horizons 1..``horizons`` to the true position, on the test episodes' windows
    (teacher frames up to t, then the true actions open loop). ``with_proprio=False`` probes
    the visual latent alone (a proprio token holds the position itself)."""
    n = module.hparams.history
    train_latent = _flat_latents(module, arrays, train_episodes, with_proprio)
    train_positions = arrays["positions"][train_episodes].reshape(-1, arrays["positions"].shape[-1])
    probe = LinearProbe().fit(train_latent, train_positions.numpy())
    steps = arrays["tokens"].shape[1]
    starts = np.arange(0, steps - n - horizons + 1, max(1, horizons))
    hist, proprio_hist, actions, targets = [], [], [], []
    for episode in test_episodes:
        for s in starts:
            latent, proprio = module.observation(
                arrays["tokens"][episode, s : s + n], arrays["states"][episode, s : s + n]
            )
            hist.append(latent)
            proprio_hist.append(proprio)
            actions.append(arrays["actions"][episode, s + n - 1 : s + n - 1 + horizons])
            targets.append(arrays["positions"][episode, s + n : s + n + horizons])
    hist = torch.stack(hist)
    proprio_hist = None if proprio_hist[0] is None else torch.stack(proprio_hist)
    predictions = module.rollout(hist, torch.stack(actions), proprio_hist)
    targets = torch.stack(targets)
    scores = []
    for k, (latent, proprio) in enumerate(predictions):
        features = _features(latent, proprio if with_proprio else None)
        scores.append(probe.r2(features, targets[:, k].numpy()))
    return scores


def _features(latent: torch.Tensor, proprio) -> np.ndarray:
    flat = latent.reshape(len(latent), -1)
    if proprio is not None:
        flat = torch.cat([flat, proprio], -1)
    return flat.numpy()


def _flat_latents(module, arrays, episodes, with_proprio=True) -> np.ndarray:
    tokens = arrays["tokens"][episodes].flatten(0, 1)
    states = arrays["states"][episodes].flatten(0, 1)
    latent, proprio = module.observation(tokens, states)
    return _features(latent, proprio if with_proprio else None)


@torch.no_grad()
def identifiability(module, arrays: dict, train_episodes, test_episodes) -> dict[str, float]:
    """How well the coordinates a model plans on recover the aligned state (affine R^2, MCC,
    mean canonical correlation) and how much of the nuisance they carry (affine R^2, synthetic
    world only); on held-out frames, the affine maps fit on training frames. The coordinates:
    TC-WM's aligned summary u; the full embedding for DINO-WM; the state for the oracle."""

    def summary(episodes):
        return planning_coordinates(
            module,
            arrays["tokens"][episodes].flatten(0, 1),
            arrays["states"][episodes].flatten(0, 1),
        ).numpy()

    u_train, u_test = summary(train_episodes), summary(test_episodes)
    s_train = arrays["aligned"][train_episodes].flatten(0, 1).numpy()
    s_test = arrays["aligned"][test_episodes].flatten(0, 1).numpy()
    out = {
        "aligned_r2": affine_r2(u_train, s_train, u_test, s_test),
        "mcc": mcc(u_test, s_test),
        "canonical_correlation": mean_canonical_correlation(u_test, s_test),
    }
    nuisance = arrays["nuisance"]
    if nuisance.shape[-1]:
        c_train = nuisance[train_episodes].flatten(0, 1).numpy()
        c_test = nuisance[test_episodes].flatten(0, 1).numpy()
        out["nuisance_r2"] = affine_r2(u_train, c_train, u_test, c_test)
    return out


def planning_coordinates(module, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """[N, ...] frames -> [N, k]: what the model's planning cost compares (see identifiability)."""
    h = module.hparams
    if h.representation == "state":
        return states[..., : h.state_cost_dims]
    latent = module.encode(tokens)
    if h.representation == "tcwm":
        return aligned_summary(latent, h.aligned_dims)
    return latent.reshape(len(latent), -1)


@torch.no_grad()
def embedding_distance_share(world, pairs) -> float:
    """The share of the frozen start-goal embedding distance that the nuisance makes: for each
    pair 1 - ||e(goal, c_start) - e(start, c_start)||^2 / ||e(goal, c_goal) - e(start, c_start)||^2
    (the goal state seen under the start's nuisance vs the goal image), averaged over pairs."""
    shares = []
    for start, goal, nuisance, goal_nuisance in pairs:
        world.set_state(start)
        e_start = np.asarray(world.observe(nuisance, 0), np.float64)
        world.set_state(goal)
        e_goal_same = np.asarray(world.observe(nuisance, 0), np.float64)
        e_goal = np.asarray(world.observe(goal_nuisance, 0), np.float64)
        total = ((e_goal - e_start) ** 2).sum()
        shares.append(1.0 - ((e_goal_same - e_start) ** 2).sum() / max(total, 1e-12))
    return float(np.mean(shares))


@torch.no_grad()
def latent_spread(module, arrays: dict, episodes) -> float:
    """Mean per-channel standard deviation of the latent over frames (collapse -> 0)."""
    z = module.encode(arrays["tokens"][episodes].flatten(0, 1))
    return float(z.reshape(len(z), -1).std(0).mean())


@torch.no_grad()
def relative_reconstruction_error(module, arrays: dict, episodes) -> float:
    """||R(W e) - e||^2 / ||e - mean e||^2 over held-out frames (TC-WM only)."""
    tokens = arrays["tokens"][episodes].flatten(0, 1)
    error = (module.decoder(module.encode(tokens)) - tokens).pow(2).sum()
    return float(error / (tokens - tokens.mean(0)).pow(2).sum())
