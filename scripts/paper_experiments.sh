#!/usr/bin/env bash
# Runs the paper's data experiments on both real models and prints the tables of docs/results.md.
#   scripts/paper_experiments.sh [OUTDIR]     (default build/experiments; about 15 minutes on 2 cores)
# Needs a built gaac (build/tools/gaac/gaac) and the models (scripts/fetch_models.py).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
gaac=$root/build/tools/gaac/gaac
out=${1:-build/experiments}
models=${GAAC_MODEL_DIR:-$HOME/.cache/gaac/models}
mkdir -p "$out"
cd "$out"
tables="python3 $root/scripts/paper_tables.py"
licenses=/usr/share/common-licenses

# Texts every Debian machine has: two prose texts, C headers as code, and a long concatenation of
# licences (in two orders, so the long calibration text differs from the evaluated one).
cat /usr/include/stdio.h /usr/include/stdlib.h /usr/include/string.h > code.txt
long_files="Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.3 GPL-2 GPL-3 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0"
(for f in $long_files; do cat "$licenses/$f"; done) > long-a.txt
(for f in $(echo $long_files | tr ' ' '\n' | tac); do cat "$licenses/$f"; done) > long-b.txt

for model in smollm2 gemma3; do
  case $model in
    smollm2) file=SmolLM2-135M-Instruct.Q4_1.gguf; name=SmolLM2; global=""; long=8192 ;;
    gemma3) file=gemma-3-270m-q4_k_m.gguf; name="Gemma 3"; global="--global-layers 5,11,17"; long=8192 ;;
  esac
  m=$models/$file
  echo "== $name: captures" >&2
  $gaac capture -m "$m" --text $licenses/GPL-3 --tokens 2048 -o $model-gpl.safetensors >&2
  $gaac capture -m "$m" --text $licenses/LGPL-2.1 --tokens 2048 -o $model-prose2.safetensors >&2
  $gaac capture -m "$m" --text code.txt --tokens 2048 -o $model-code.safetensors >&2
  $gaac calibrate $model-gpl.safetensors -o $model-calib-gpl.safetensors >&2
  for text in gpl prose2 code; do
    $gaac stats $model-$text.safetensors --calib $model-calib-gpl.safetensors --json > $model-$text-cross.json
    $gaac stats $model-$text.safetensors --json > $model-$text-oracle.json
  done

  echo "### $name"
  echo "Table 1 (prose B, windows from prose A):"
  $tables table1 "$name" $model-prose2-cross.json $global
  echo "Table 1, per layer (K: entropy, ratio, 3/4/raw %; V: the same):"
  $tables layers "$name" $model-prose2-cross.json
  echo "Table 3:"
  $tables table3 "$name, prose A" $model-gpl-cross.json $model-gpl-oracle.json
  $tables table3 "$name, prose B" $model-prose2-cross.json $model-prose2-oracle.json
  $tables table3 "$name, code" $model-code-cross.json $model-code-oracle.json
  echo "Table 4 (prose B, windows from prose A):"
  $gaac study schemes $model-prose2.safetensors --calib-kv $model-gpl.safetensors
  echo "Escape-slot capacity and resident size (prose B, calibration on prose A):"
  $tables capacity "$name" $model-prose2-cross.json
  echo "Table 7 (FP8 KV, prose B, windows from prose A converted the same way):"
  for fmt in e4m3 e5m2; do
    for scale in per-tensor none; do
      for text in gpl prose2; do
        $gaac convert $model-$text.safetensors --to $fmt --scale $scale -o $model-$text-$fmt-$scale.safetensors >&2
      done
      $gaac calibrate $model-gpl-$fmt-$scale.safetensors -o $model-calib-gpl-$fmt-$scale.safetensors >&2
      $gaac stats $model-prose2-$fmt-$scale.safetensors --calib $model-calib-gpl-$fmt-$scale.safetensors --json \
        > $model-prose2-$fmt-$scale.json
      $tables table7 "$name" $scale $model-prose2-$fmt-$scale.json
    done
  done

  echo "== $name: long prompts" >&2
  $gaac capture -m "$m" --text long-a.txt --tokens $long -o $model-long-a.safetensors >&2
  $gaac capture -m "$m" --text long-b.txt --tokens $long -o $model-long-b.safetensors >&2
  for text in $licenses/GPL-3 $licenses/LGPL-2.1 code.txt; do
    $gaac capture -m "$m" --text $text --tokens 1024 -o $model-short-$(basename $text).safetensors >&2
  done
  $gaac calibrate $model-short-*.safetensors -o $model-calib-short.safetensors >&2
  $gaac calibrate $model-long-b.safetensors -o $model-calib-long.safetensors >&2
  echo "Table 8 (long prompt A, $long tokens): windows from three 1,024-token prompts"
  $gaac study drift $model-long-a.safetensors --calib $model-calib-short.safetensors --segment 1024 --layer 5
  echo "Table 8: windows from another $long-token prompt (long B)"
  $gaac study drift $model-long-a.safetensors --calib $model-calib-long.safetensors --segment 1024 --layer 5
done
