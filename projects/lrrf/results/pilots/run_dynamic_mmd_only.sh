#!/bin/sh
# Pilot 4 (issue 57): pilot 1 again for the adopted DRM (MMD^2 without the class means, since
# dd9b663), at lam_drm 10 where pilot 1's rules differed most (lam_ctir 1, lam_kco 0.5), seeds
# 100 and 101. Same rule as pilot 1: keep the rule with the higher mean validation AA.
cd "$(dirname "$0")/../.." || exit 1
for seed in 100 101; do
  for dyn in true false; do
    OMP_NUM_THREADS=1 nice -n 15 uv run python results/pilots/pilot.py \
      results/pilots/dynamic_weight_mmd_only.jsonl "mmd_only_dyn_${dyn}_lam10.0" lrrf "$seed" \
      lam_drm=10.0 lam_ctir=1.0 drm_dynamic="$dyn" 2>&1 | tail -1
  done
done
