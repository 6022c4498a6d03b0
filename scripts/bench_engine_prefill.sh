#!/usr/bin/env bash
# Engine prefill speed beside llama.cpp, one run: `gaac generate` prefilling the first N tokens of the
# licence concatenation (raw text; 8,191 tokens for "8K": SmolLM2's context is 8,192 and generate keeps room for
# one answer token) over a BF16 and over a GAAC cache, and llama.cpp (llama-cpp-python,
# see scripts/reference_logits.py) prefilling the same token ids with a BF16 KV cache (the arithmetic
# gaac's engine follows) and with its default F16 KV cache (which its tiled prefill attention takes),
# all on the same number of threads. The engines take turns, length by length and round by round, so
# that on a shared machine they see the same load; the table keeps each one's best round. Prints one
# JSON line per measurement (with the machine's 1-minute load average when it ended) and the table
# (docs/performance.md records it).
#   scripts/bench_engine_prefill.sh [OUT_DIR]
#   PYTHON=/tmp/venv/bin/python (llama.cpp; skipped if absent)  GAAC=build/tools/gaac/gaac
#   GAAC_THREADS=2  GAAC_PREFILL_LENGTHS="512 2048 8191"  GAAC_ROUNDS=2  GAAC_MODEL=smollm2
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/bench-prefill}
python=${PYTHON:-/tmp/venv/bin/python}
gaac=${GAAC:-$root/build/tools/gaac/gaac}
threads=${GAAC_THREADS:-2}
lengths=${GAAC_PREFILL_LENGTHS:-512 2048 8191}
rounds=${GAAC_ROUNDS:-2}
model=${GAAC_MODEL:-smollm2}
mkdir -p "$out"
cd "$out"
licenses=/usr/share/common-licenses
long_files="Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.3 GPL-2 GPL-3 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0"
(for f in $long_files; do cat "$licenses/$f"; done) > long-a.txt
m=$(python3 "$root/scripts/fetch_models.py" "$model" --print-path)
results=results.jsonl
: > "$results"
for n in $lengths; do
  "$gaac" validate -m "$m" --text long-a.txt --tokens "$n" --write-tokens "$model-$n.txt" -t "$threads" >&2
done
"$gaac" generate -m "$m" -p "warm-up" -n 1 -t "$threads" > /dev/null 2>&1  # learns and caches the default calibration

for round in $(seq "$rounds"); do
  for n in $lengths; do
    for kv in bf16 gaac; do
      "$gaac" generate -m "$m" --prompt-file long-a.txt --raw --prompt-tokens "$n" -n 1 --kv $kv -t "$threads" --json |
        python3 -c "
import json, sys
r = json.load(sys.stdin)
print(json.dumps({'round': $round, 'engine': 'gaac', 'kv': r['kv'], 'threads': $threads, 'prompt_tokens': r['prompt_tokens'],
                  'prompt_seconds': r['prompt_seconds'], 'prompt_tokens_per_s': r['prompt_tokens_per_s'],
                  'load_average': float(open('/proc/loadavg').read().split()[0])}))" >> "$results"
      tail -1 "$results"
    done
    if [ -x "$python" ]; then
      for kv in bf16 f16; do
        "$python" "$root/scripts/reference_logits.py" prefill "$m" "$model-$n.txt" $kv "$threads" |
          python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
r['round'] = $round
r['load_average'] = float(open('/proc/loadavg').read().split()[0])
print(json.dumps(r))" >> "$results"
        tail -1 "$results"
      done
    fi
  done
done

python3 - "$results" "$model" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
best = {}
for r in rows:
    key = (r["prompt_tokens"], f"{r['engine']} {r['kv']}")
    best[key] = min(best.get(key, float("inf")), r["prompt_seconds"])
engines = ["gaac bf16", "gaac gaac", "llama.cpp bf16", "llama.cpp f16"]
print(f"{sys.argv[2]}, best of {max(r['round'] for r in rows)} rounds, seconds (tokens/s)")
print(f"{'tokens':>7} " + " ".join(f"{e:>20}" for e in engines) + "  gaac bf16 / best llama.cpp")
for n in sorted({k[0] for k in best}):
    cells = [f"{best[(n, e)]:8.2f} ({n / best[(n, e)]:7.0f})" if (n, e) in best else f"{'-':>20}" for e in engines]
    peers = [best[(n, e)] for e in engines[2:] if (n, e) in best]
    ratio = f"{best[(n, 'gaac bf16')] / min(peers):.2f}x" if peers and (n, "gaac bf16") in best else "-"
    print(f"{n:>7} " + " ".join(f"{c:>20}" for c in cells) + f"  {ratio}")
EOF
