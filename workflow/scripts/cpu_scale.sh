#!/usr/bin/env bash
# Every seed paper's claims tested on real images at CPU scale, in one command: the CPU-scale studies
# (config/studies/cpu/*.yaml) at the hyperparameters their committed tuning chose, then the verdict
# page docs/verdicts.md (`fedfactor verdicts`). From the repository root, with the package installed:
#   bash workflow/scripts/cpu_scale.sh                  # all four papers
#   bash workflow/scripts/cpu_scale.sh simfed feddecomp # those papers' studies only
# CORES (default: all) is passed to snakemake. docs/cpu_scale.md gives each study's time on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
papers=("$@")
[ ${#papers[@]} -eq 0 ] && papers=(factorized_fl simfed fedfac feddecomp)
files=()
for paper in "${papers[@]}"; do
  found=(config/studies/cpu/"$paper"*.yaml)
  if [ ! -e "${found[0]}" ]; then
    echo "cpu_scale.sh: no CPU-scale study of '$paper' (config/studies/cpu/ has: $(ls config/studies/cpu | sed 's/\.yaml//' | tr '\n' ' '))" >&2
    exit 2
  fi
  files+=("${found[@]}")
done
for f in "${files[@]}"; do
  echo "cpu_scale.sh: $f ($(date '+%H:%M:%S'))"
  snakemake --cores "${CORES:-all}" --configfile "$f"
done
fedfactor verdicts
