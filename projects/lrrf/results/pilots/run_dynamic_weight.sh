#!/bin/sh
# Pilot 1 (issue 57): DRM's dynamic weight (lam1 * max(acc_clean - acc_adv, 0)) vs a static lam1,
# at lam_drm 1 and 10 (lam_ctir 1, lam_kco 0.5), seeds 100 and 101; gradient shares every 10 steps.
# Decision rule fixed before the run: keep the rule with the higher mean validation AA over the
# four (lam_drm, seed) fits; report DRM's gradient share beside it.
cd "$(dirname "$0")/../.." || exit 1
for seed in 100 101; do
  for lam in 1.0 10.0; do
    for dyn in true false; do
      [ "$seed" = 100 ] && [ "$lam" = 1.0 ] && [ "$dyn" = true ] && continue  # run first, alone
      OMP_NUM_THREADS=1 nice -n 15 uv run python results/pilots/pilot.py \
        results/pilots/dynamic_weight.jsonl "dyn_${dyn}_lam${lam}" lrrf "$seed" \
        lam_drm="$lam" lam_ctir=1.0 drm_dynamic="$dyn" 2>&1 | tail -1
    done
  done
done
