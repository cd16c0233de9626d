"""Pilot for issue 58 on seed 7 (outside the registered seeds 0-2 and the replication seeds):
how many autoencoder steps bring the RLA ceiling (the decoder fed the true RLA) to an applied /
true change of 0.8, and whether the residual (x0) pixel model beats persistence in feature L1 at
the token models' budget. Run from projects/rla-wm:

    uv run python results/pilots/pilot_issue58.py ae     # or: pixel
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from papers_eval.jobs import Job
from rlawm import claim

SEED = 7


def mean_scores(scores: dict) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in scores.items() if k != "prediction_spread"}


def main(part: str) -> None:
    torch.set_num_threads(1)
    spec = yaml.safe_load(claim.CLAIM_FILE.read_text())
    settings = dict(spec["settings"])
    world = claim.store_input("world", claim.build_world(Job("world", SEED, {}, "world"), settings))
    out: dict = {"seed": SEED, "world": world}
    groups = claim.datamodule(settings, claim.input_path("world", world), SEED).world.test
    out["persistence_l1_best"] = float(np.mean(claim.persistence_scores(groups)["feature_l1_best"]))
    if part == "ae":
        for ae in (1200, 2400):
            start = time.perf_counter()
            run = claim.fit_token_model(
                Job("rla_wm", SEED, {"lr": 1e-3, "world": world}, "pilot"),
                {**settings, "ae_steps": ae, "wm_steps": 1},
            )
            d = run["diagnostics"]
            out[f"ae_{ae}"] = {
                "seconds": time.perf_counter() - start,
                "applied_over_true": d["decoder_relative_change"] / d["true_relative_change"],
                "rolled_out": mean_scores(run["ceiling"]),
                "teacher_forced": mean_scores(run["ceiling_teacher_forced"]),
            }
            print(ae, out[f"ae_{ae}"], flush=True)
    elif part == "bc":
        from rlawm import uses
        from rlawm.data import chunk_pairs, encode

        data = claim.datamodule(settings, claim.input_path("world", world), SEED)
        w, h = data.world, data.hparams.horizon
        tokens, dim = w.demo_tokens.shape[-2:]
        starts = uses.evaluation_starts(settings["sim_starts"], SEED)

        def tokens_of(frame, mask):
            x = encode(data.encoder, torch.from_numpy(frame)[None], torch.from_numpy(mask)[None])
            return w.standardise(x)

        def success(policy) -> float:
            return float(np.mean(uses.evaluate_in_simulator(
                policy, tokens_of, starts, settings["sim_chunks"], h, data.hparams.image_size
            )))  # fmt: skip

        out["random"] = success(uses.random_policy(h, w.demo_actions.shape[-1], SEED))
        for demos, steps in ((8, 600), (len(w.demo_tokens), 600), (len(w.demo_tokens), 2000)):
            policy = uses.ChunkPolicy(tokens, dim, h, w.demo_actions.shape[-1])
            pairs = chunk_pairs(w.demo_tokens[:demos], w.demo_actions[:demos], h)
            curve = uses.train_chunk_policy(policy, pairs, steps, 1e-3, SEED)
            policy.eval()
            out[f"bc_{demos}_{steps}"] = {
                "success": success(lambda x, p=policy: p(x)),
                "loss_first_last": [float(np.mean(curve[:10])), float(np.mean(curve[-10:]))],
            }
            print(demos, steps, out[f"bc_{demos}_{steps}"], out["random"], flush=True)
    else:
        for steps, batch in ((400, 8), (400, 32)):
            start = time.perf_counter()
            run = claim.fit_pixel(
                Job("pixel", SEED, {"lr": 1e-3, "world": world}, "pilot"),
                {**settings, "wm_steps": steps, "pixel_batch": batch},
            )
            out[f"pixel_{steps}x{batch}"] = {
                "seconds": time.perf_counter() - start,
                **mean_scores(run["test"]),
            }
            print(steps, batch, out[f"pixel_{steps}x{batch}"], flush=True)
    path = Path(__file__).with_name(f"pilot_issue58_{part}.json")
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
