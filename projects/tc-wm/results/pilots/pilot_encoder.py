"""Pilot: can the agent's position be read linearly from the rendered PointMaze frames' frozen
tokens? A stand-in encoder (random init, masked-patch or colour-invariant contrastive
pretraining on 160 separate episodes) encodes 300 random-action episodes at kappa 1 with the
scene's colour shift set to AMP; a ridge probe fit on 250 episodes scores R^2 on the other 50.
`uv run python results/pilots/pilot_encoder.py {random|simmim|invariant} STEPS AMP`; the numbers
of 2026-12-07 are in pilot_encoder.jsonl (a first run at AMP 0.5: README)."""

import json
import sys
import time

import numpy as np
import torch
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score
from standin import pretrain_invariant  # beside this script

import tcwm.scene as S
from papers_worldmodels.encoder import build_encoder, encode_frames, pretrain, tiny_config
from tcwm.pipeline import pool_tokens
from tcwm.scene import make_scene, random_episodes


def main() -> None:
    torch.set_num_threads(1)
    kind, steps, amp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    S.COLOUR_AMPLITUDE = amp
    torch.manual_seed(0)
    e = build_encoder(tiny_config())
    d = random_episodes("pointmaze", 160, 25, 1.0, 10000)
    fr = torch.from_numpy(d["frames"].reshape(-1, 64, 64, 3))
    t = time.time()
    if kind == "simmim":
        losses = pretrain(e, fr, None, steps, seed=0)
    elif kind == "invariant":
        losses = pretrain_invariant(e, fr, steps, seed=0)
    else:
        losses = [0.0]
    pt = time.time() - t
    d = random_episodes("pointmaze", 300, 40, 1.0, 1)
    pos = make_scene("pointmaze").position(d["states"]).reshape(-1, 2)
    tok = encode_frames(e, torch.from_numpy(d["frames"].reshape(-1, 64, 64, 3)), None)
    n = 250 * 40
    out = {
        "kind": kind,
        "steps": steps,
        "amp": amp,
        "pretrain_s": pt,
        "loss_end": float(np.mean(losses[-10:])),
    }
    for g in (4, 8):
        X = pool_tokens(tok, g).reshape(len(tok), -1).numpy()
        m = Ridge(alpha=1).fit(X[:n], pos[:n])
        out[f"r2_grid{g}"] = r2_score(pos[n:], m.predict(X[n:]))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
