#!/usr/bin/env bash
# The main job: a real model (SmolLM2-135M-Instruct) answers a question on the CPU; the KV cache it
# produced is compressed losslessly with exponent windows calibrated on a different text, and the
# figures and the bit-exact round trip are printed.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
model=$(python3 scripts/fetch_models.py smollm2 --print-path)
build=${GAAC_BUILD_DIR:-build}
echo "== building gaac" >&2
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target gaac_cli >/dev/null
gaac="$build/tools/gaac/gaac"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompt=${GAAC_DEMO_PROMPT:-"Explain in a few sentences why the key/value cache of a language model grows with the length of the context."}
calibration_text=/usr/share/common-licenses/GPL-3

echo "== SmolLM2-135M-Instruct answers: $prompt"
"$gaac" generate -m "$model" -p "$prompt" -n 160 --save-kv "$work/answer-kv.safetensors"
echo
echo "== calibrating exponent windows on a different text ($calibration_text, first 1024 tokens)"
"$gaac" capture -m "$model" --text "$calibration_text" --tokens 1024 -o "$work/calib-kv.safetensors"
"$gaac" calibrate "$work/calib-kv.safetensors" -o "$work/calib.safetensors"
echo
echo "== the answer's KV cache under GAAC (ratio = BF16 / packed; resident = BF16 / bytes held with fixed slots)"
"$gaac" stats "$work/answer-kv.safetensors" --calib "$work/calib.safetensors"
echo
echo "== lossless round trip"
"$gaac" compress "$work/answer-kv.safetensors" --calib "$work/calib.safetensors" -o "$work/answer.gaac"
"$gaac" decompress "$work/answer.gaac" -o "$work/restored.safetensors"
"$gaac" verify "$work/answer-kv.safetensors" --calib "$work/calib.safetensors"
cmp "$work/answer-kv.safetensors" "$work/restored.safetensors" && echo "restored KV dump is byte-identical to the captured one"
