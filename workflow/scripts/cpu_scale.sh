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
# Each study's and each paper's time is printed at the end: the 45-minute aim a paper is checked on it.
declare -A paper_seconds
times=()
for f in "${files[@]}"; do
  echo "cpu_scale.sh: $f ($(date '+%H:%M:%S'))"
  start=$SECONDS
  snakemake --cores "${CORES:-all}" --configfile "$f"
  took=$((SECONDS - start))
  times+=("$(printf '  %-44s %4d min %02d s' "$f" $((took / 60)) $((took % 60)))")
  for paper in "${papers[@]}"; do
    [[ $(basename "$f") == "$paper"* ]] && paper_seconds[$paper]=$(( ${paper_seconds[$paper]:-0} + took ))
  done
done
fedfactor verdicts
echo "cpu_scale.sh: times on ${CORES:-all} cores"
printf '%s\n' "${times[@]}"
for paper in "${papers[@]}"; do
  s=${paper_seconds[$paper]:-0}
  printf '  %-44s %4d min %02d s\n' "paper $paper" $((s / 60)) $((s % 60))
done
