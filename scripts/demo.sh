#!/usr/bin/env bash
# The main job: a real model (SmolLM2-135M-Instruct) answers a question on the CPU twice, decoding from
# a compressed GAAC KV cache and from a BF16 cache of the same paged structure; the two answers are
# compared token for token, with each cache's resident bytes and decode speed. Then the answer's KV
# cache is compressed as a .gaac snapshot with windows calibrated on a different text, and the
# bit-exact round trip is checked.
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

echo "== SmolLM2-135M-Instruct answers, decoding from a GAAC cache: $prompt"
"$gaac" generate -m "$model" -p "$prompt" -n 160 --kv gaac --json --save-kv "$work/answer-kv.safetensors" >"$work/gaac.json"
"$gaac" generate -m "$model" -p "$prompt" -n 160 --kv bf16 --json >"$work/bf16.json"
python3 - "$work/gaac.json" "$work/bf16.json" <<'EOF'
import json, sys
gaac, bf16 = (json.load(open(path)) for path in sys.argv[1:3])
print(gaac["sequences"][0]["text"])
print()
print("== the same question, the same model: the two KV caches side by side")
print(f"{'cache':<6} {'tokens':>7} {'KV resident':>14} {'bits/element':>13} {'BF16 values':>14} {'decode tokens/s':>16}")
for r in (gaac, bf16):
    print(f"{r['kv']:<6} {r['generated_tokens']:>7} {r['kv_resident_bytes']:>14,} {r['kv_bits_per_element']:>13.2f} "
          f"{r['kv_bf16_bytes']:>14,} {r['decode_tokens_per_s']:>16.1f}")
same = gaac["tokens"] == bf16["tokens"]
print(f"identical tokens: {'yes' if same else 'NO'}; GAAC holds the cache in "
      f"{gaac['kv_resident_bytes'] / bf16['kv_resident_bytes']:.3f}x the BF16 cache's bytes "
      f"({gaac['raw_fallback_tiles']} of {gaac['raw_fallback_tiles'] + gaac['compressed_tiles']} finalized tiles raw; "
      f"the open block of each layer stays BF16 until its 16th token)")
sys.exit(0 if same else 1)
EOF
echo
echo "== calibrating exponent windows on a different text ($calibration_text, first 1024 tokens)"
"$gaac" capture -m "$model" --text "$calibration_text" --tokens 1024 -o "$work/calib-kv.safetensors"
"$gaac" calibrate "$work/calib-kv.safetensors" -o "$work/calib.safetensors"
echo
echo "== the answer's KV cache as a .gaac snapshot (ratio = BF16 / packed; resident = BF16 / bytes held with fixed slots)"
"$gaac" stats "$work/answer-kv.safetensors" --calib "$work/calib.safetensors"
echo
echo "== lossless round trip"
"$gaac" compress "$work/answer-kv.safetensors" --calib "$work/calib.safetensors" -o "$work/answer.gaac"
"$gaac" decompress "$work/answer.gaac" -o "$work/restored.safetensors"
"$gaac" verify "$work/answer-kv.safetensors" --calib "$work/calib.safetensors"
cmp "$work/answer-kv.safetensors" "$work/restored.safetensors" && echo "restored KV dump is byte-identical to the captured one"
