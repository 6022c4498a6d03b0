#!/usr/bin/env bash
# The main job: builds gaac, then compresses a KV cache losslessly and prints what GAAC does to it.
# (Synthetic KV with per-channel scales until the real-model engine lands.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
build=${GAAC_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGAAC_BUILD_TESTS=OFF -DGAAC_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target gaac_cli >/dev/null
gaac="$build/tools/gaac/gaac"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== KV cache to compress (seed 1) and a different sample to calibrate on (seed 2)"
"$gaac" synth --layers 8 --kv-heads 4 --head-dim 128 --tokens 2000 --seed 1 -o "$work/kv.safetensors"
"$gaac" synth --layers 8 --kv-heads 4 --head-dim 128 --tokens 2000 --seed 2 -o "$work/calib-sample.safetensors"
echo
echo "== calibrate"
"$gaac" calibrate "$work/calib-sample.safetensors" -o "$work/calib.safetensors"
echo
echo "== statistics (ratio = BF16 / packed; resident = BF16 / bytes held in a cache with fixed slots)"
"$gaac" stats "$work/kv.safetensors" --calib "$work/calib.safetensors"
echo
echo "== lossless round trip"
"$gaac" compress "$work/kv.safetensors" --calib "$work/calib.safetensors" -o "$work/kv.gaac"
"$gaac" decompress "$work/kv.gaac" -o "$work/restored.safetensors"
"$gaac" verify "$work/kv.safetensors" --calib "$work/calib.safetensors"
cmp "$work/kv.safetensors" "$work/restored.safetensors" && echo "restored file is byte-identical to the input"
