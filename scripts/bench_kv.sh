#!/usr/bin/env bash
# Writes small real KV dumps for the benchmarks (CPU and GPU): for each model, the cache of the first
# 2,048 tokens of GPL-3 (SmolLM2 45 MiB, Gemma 3 36 MiB of BF16) and a calibration table learnt from
# another text (LGPL-2.1), so a machine without the models or a package registry can be handed them.
#   scripts/bench_kv.sh [OUTDIR]      (default ${GAAC_KV_DIR:-~/.cache/gaac/kv}; about a minute)
# The engine's arithmetic is deterministic, so on any x86-64 machine with AVX2 the dumps' sha256 sums
# (printed at the end) are the same.
set -euo pipefail
cd "$(dirname "$0")/.."
gaac=$PWD/build/tools/gaac/gaac
models=${GAAC_MODEL_DIR:-$HOME/.cache/gaac/models}
out=${1:-${GAAC_KV_DIR:-$HOME/.cache/gaac/kv}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -x "$gaac" ] || { echo "build gaac first: cmake -S . -B build && cmake --build build" >&2; exit 1; }
for model in smollm2 gemma3; do
  case $model in
    smollm2) file=SmolLM2-135M-Instruct.Q4_1.gguf ;;
    gemma3) file=gemma-3-270m-q4_k_m.gguf ;;
  esac
  "$gaac" capture -m "$models/$file" --text /usr/share/common-licenses/GPL-3 --tokens 2048 -o "$out/$model-gpl3-2048.safetensors"
  "$gaac" capture -m "$models/$file" --text /usr/share/common-licenses/LGPL-2.1 --tokens 2048 -o "$out/$model-calib-text.safetensors"
  # From inside the directory, so the table's provenance metadata (and its hash) does not name it.
  (cd "$out" && "$gaac" calibrate $model-calib-text.safetensors -o $model-calibration.safetensors && rm $model-calib-text.safetensors)
done
(cd "$out" && sha256sum ./*-gpl3-2048.safetensors ./*-calibration.safetensors && du -ch ./*.safetensors | tail -1)
