#!/usr/bin/env bash
# Engine decode speed at long contexts, one run: gaac generate over a GAAC cache and over a BF16
# cache, and llama.cpp (llama-cpp-python, see scripts/reference_logits.py) on the same token ids,
# for both real models at 4K and 8K tokens of context. Prints one JSON line per measurement and a
# table (docs/performance.md records it).
#   scripts/bench_engine_decode.sh [OUT_DIR]       PYTHON=/tmp/venv/bin/python for llama.cpp (skipped if absent)
# Windows are learnt on another long text (long-b: licences in the other order), 8,192 tokens, so
# that keys at long positions fall inside them (docs/results.md, Table 8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/bench-engine}
python=${PYTHON:-/tmp/venv/bin/python}
gaac=${GAAC:-$root/build/tools/gaac/gaac}
decode=${GAAC_DECODE_TOKENS:-64}
threads=${GAAC_THREADS:-0}
mkdir -p "$out"
cd "$out"
licenses=/usr/share/common-licenses
long_files="Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.3 GPL-2 GPL-3 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0"
(for f in $long_files; do cat "$licenses/$f"; done) > long-a.txt
(for f in $(echo $long_files | tr ' ' '\n' | tac); do cat "$licenses/$f"; done) > long-b.txt

results=results.jsonl
: > "$results"
for model in smollm2 gemma3; do
  m=$(python3 "$root/scripts/fetch_models.py" $model --print-path)
  if [ ! -f $model-calib-long.safetensors ]; then
    "$gaac" capture -m "$m" --text long-b.txt --tokens 8192 -t "$threads" -o $model-long-b.safetensors >&2
    "$gaac" calibrate $model-long-b.safetensors -o $model-calib-long.safetensors >&2
    rm $model-long-b.safetensors
  fi
  for context in 4096 8192; do
    prompt=$((context - decode))
    "$gaac" validate -m "$m" --text long-a.txt --tokens $prompt --write-tokens $model-$context.txt -t "$threads" >&2
    for kv in gaac bf16; do
      "$gaac" generate -m "$m" --prompt-file long-a.txt --raw --prompt-tokens $prompt -n $decode --kv $kv \
        --calib $model-calib-long.safetensors -t "$threads" --json > $model-$context-$kv.json
      python3 - "$model" "$context" "$model-$context-$kv.json" >> "$results" <<'EOF'
import json, sys
r = json.load(open(sys.argv[3]))
print(json.dumps({"model": sys.argv[1], "context": int(sys.argv[2]), "engine": r["kv"] + " cache",
                  "decode_tokens": r["generated_tokens"], "decode_tokens_per_s": r["decode_tokens_per_s"],
                  "prompt_tokens_per_s": r["prompt_tokens_per_s"], "kv_resident_bytes": r["kv_resident_bytes"],
                  "kv_bf16_bytes": r["kv_bf16_bytes"], "raw_fallback_tiles": r["raw_fallback_tiles"],
                  "compressed_tiles": r["compressed_tiles"], "tokens": r["tokens"]}))
EOF
    done
    if [ -x "$python" ]; then
      python3 -c "import json; print('\\n'.join(map(str, json.load(open('$model-$context-gaac.json'))['tokens'])))" > $model-$context-feed.txt
      "$python" "$root/scripts/reference_logits.py" decode "$m" $model-$context.txt $model-$context-feed.txt |
        python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['model']='$model'; r['context']=$context; print(json.dumps(r))" >> "$results"
    fi
  done
done

python3 - "$results" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"{'model':<8} {'context':>7} {'engine':<10} {'decode tok/s':>12} {'KV resident':>14} {'raw tiles':>10}")
for r in rows:
    resident = f"{r['kv_resident_bytes']:,}" if "kv_resident_bytes" in r else "-"
    raw = f"{r['raw_fallback_tiles']}" if "raw_fallback_tiles" in r else "-"
    print(f"{r['model']:<8} {r['context']:>7} {r['engine']:<10} {r['decode_tokens_per_s']:>12.2f} {resident:>14} {raw:>10}")
by = {(r["model"], r["context"], r["engine"]): r for r in rows}
for (model, context, engine), r in sorted(by.items()):
    if engine == "gaac cache" and (model, context, "bf16 cache") in by:
        b = by[(model, context, "bf16 cache")]
        same = r["tokens"] == b["tokens"]
        print(f"{model} {context}: GAAC / BF16 decode speed {r['decode_tokens_per_s'] / b['decode_tokens_per_s']:.3f}x, "
              f"resident bytes {r['kv_resident_bytes'] / b['kv_resident_bytes']:.3f}x, identical tokens: {same}")
EOF
