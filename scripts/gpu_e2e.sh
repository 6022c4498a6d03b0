#!/usr/bin/env bash
# One call on a GPU machine for the Python package and the end-to-end experiments: installs gaac there
# (pip, the CUDA kernels built by nvcc), runs the C++ GPU tests (sequences grown on the device, the codec,
# decode attention, KV chunk objects: prebuilt binaries when given and they run), the Python GPU tests
# (gaac.KvCacheMirror, gaac.BatchKvCache, GaacCache(device="cuda") on random-weight models and, when given,
# SmolLM2 and Gemma 3) and bench/gpu/bench_e2e.py. $OUT (default ./gpu-out) receives e2e.json and the logs.
#   scripts/gpu_e2e.sh --data DIR [--models DIR] [--prebuilt DIR] [--wheel FILE] [--skip-tests] [--skip-bench]
#                      [--bench-args "..."] [--build-only] [--lmcache DIR] [--serde-args "..."]
# (--wheel: the package built elsewhere for this machine's Python, used when it imports and sees the GPU)
# (without --models: the tests that need no model files, random-weight models among them; the benchmark
# only when --bench-args names models that need no files, e.g. "--only llama8b,gemma3_geometry")
# (--build-only: the package alone, e.g. in the background while the models are still on their way).
# (--lmcache DIR: wheels of LMCache and those of its light dependencies the machine lacks; after the tests, its
# tests (tests/python/test_lmcache.py) and bench/lmcache_serde.py --device cuda on DATA/kv, into lmcache.json,
# with --serde-args added to its arguments; where DIR also holds nvcomp-site.tar.xz (nvCOMP's Python package
# unpacked from its wheels, as scripts/prepare_codec_peers.sh stages it), nvCOMP ANS is timed beside them.)
# (DATA may also hold flashinfer-site.tar.xz and flashinfer-jit.tar.xz, as for scripts/gpu_run.sh: the benchmark
# then measures FlashInfer's paged decode too; $OUT gets the kernels it compiled as flashinfer-jit.tar.xz.)
# MODELS holds the two GGUF files; DATA holds xxhash/ (xxhash.h: the build machine may lack it) and the
# gguf wheel (gguf-*.whl), which transformers needs to read GGUF files. The package is built once per
# machine (into /tmp/gaac-site), and the models are converted once (save_pretrained, into /tmp/gaac-hf)
# so that every later load takes seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
models="" data="" prebuilt="" wheel="" skip_tests=0 skip_bench=0 bench_args="" build_only=0 lmcache="" serde_args=""
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    --wheel) wheel=$2; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --build-only) build_only=1; shift ;;
    --lmcache) lmcache=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --serde-args) serde_args=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] || { echo "usage: $0 --data DIR [--models DIR] [...]" >&2; exit 2; }
[ -n "$models" ] || [ -n "$bench_args" ] || skip_bench=1  # the GGUF models, or models of their own (--only llama8b)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
stage() { printf '\n=== %s (t=%ds)\n' "$*" "$SECONDS"; }
status=0

stage "device"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv

stage "python package"
site=/tmp/gaac-site
# The copy of the tree there may not be a git repository: the sources' own hash says whether to rebuild.
sources=$(find CMakeLists.txt pyproject.toml cmake include src python -type f -print0 | sort -z | xargs -0 cat | sha1sum | cut -c1-16)
if [ -n "$wheel" ] && [ ! -f "$site/.built-$sources" ]; then
  rm -rf "$site" && mkdir -p "$site"
  python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel" || exit 1
  if PYTHONPATH=$site python3 -c "import gaac, sys; sys.exit(0 if gaac.cuda_available() else 1)"; then
    touch "$site/.built-$sources"
    echo "using the wheel $wheel"
  else
    echo "the wheel $wheel does not run here (or sees no GPU): building the package"
  fi
fi
if [ ! -f "$site/.built-$sources" ]; then
  rm -rf "$site" && mkdir -p "$site"
  # One C++ runtime in the Python process: the compiler whose libstdc++ python3 loads (or an older one).
  cxx=$(scripts/cxx_for_python.sh) || exit 1
  echo "C++ compiler: $cxx"
  python3 -m pip install --no-build-isolation --no-deps -q --target "$site" . -C build-dir=/tmp/gaac-py \
    -C cmake.define.CMAKE_CXX_COMPILER="$cxx" -C cmake.define.CMAKE_CUDA_HOST_COMPILER="$cxx" \
    -C cmake.define.GAAC_XXHASH_INCLUDE_DIR="$PWD/$data/xxhash" >"$out/pip.log" 2>&1 || { tail -40 "$out/pip.log"; exit 1; }
  touch "$site/.built-$sources"
fi
# transformers reads GGUF files with it (the real-model tests); the other tests need no wheel. Installed whenever
# it is missing, also into a package built by an earlier call.
for w in "$data"/gguf-*.whl; do
  [ -f "$w" ] && [ ! -d "$site/gguf" ] && { python3 -m pip install -q --no-index --no-deps --target "$site" "$w" || exit 1; }
done
export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -c "import gaac; print('gaac', gaac.__file__, 'cuda', gaac.cuda_available())" || exit 1
[ $build_only = 1 ] && exit 0

hf=/tmp/gaac-hf
if [ -n "$models" ]; then
  stage "models"
  python3 scripts/convert_models.py "$models" "$hf" || echo "not converted: the GGUF files are loaded as they are"
fi

if [ $skip_tests = 0 ]; then
  stage "C++ GPU tests"
  for t in cuda_grow_test cuda_codec_test cuda_decode_test cuda_chunk_test; do
    if [ -n "$prebuilt" ] && [ -f "$prebuilt/$t.xz" ]; then
      xz -dc "$prebuilt/$t.xz" >"/tmp/$t" && chmod +x "/tmp/$t"
      if /tmp/$t --gtest_list_tests >/dev/null 2>&1; then
        /tmp/$t --gtest_brief=1 >"$out/$t.log" 2>&1; rc=$?
        tail -4 "$out/$t.log"; [ $rc = 0 ] || { echo "$t FAILED"; status=1; }
      else
        echo "$t: the prebuilt binary does not run here; skipped"
      fi
    fi
  done
  stage "Python GPU tests"
  select="cuda or gpu or device"
  [ -n "$models" ] || select="($select) and not smollm2 and not gemma3_gpu and not gguf"  # those need the model files
  GAAC_MODEL_DIR=${models:-/nonexistent} GAAC_HF_MODELS=$hf GAAC_REQUIRE_TRANSFORMERS=1 GAAC_SLOW_TESTS=1 \
    python3 -m pytest -q -s -p no:cacheprovider tests/python/test_cuda.py tests/python/test_transformers.py -k "$select" \
    2>&1 | tee "$out/pytest.log" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ -n "$lmcache" ]; then
  stage "LMCache"
  lm=/tmp/gaac-lmcache
  rm -rf "$lm" && mkdir -p "$lm" && python3 -m pip install -q --no-index --no-deps --target "$lm" "$lmcache"/*.whl || exit 1
  [ -f "$lmcache/nvcomp-site.tar.xz" ] && { tar -xJf "$lmcache/nvcomp-site.tar.xz" -C "$lm" || exit 1; }
  GAAC_REQUIRE_LMCACHE=1 GAAC_MODEL_DIR=${models:-/nonexistent} GAAC_KV_DIR=$(cd "$data" && pwd)/kv PYTHONPATH=$site:$lm \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_lmcache.py 2>&1 | tee "$out/pytest-lmcache.log" | tail -8
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # shellcheck disable=SC2086
  PYTHONPATH=$site:$lm python3 bench/lmcache_serde.py --kv-dir "$data/kv" --device cuda --out "$out/lmcache.json" $serde_args \
    2>&1 | tee "$out/lmcache.log" | grep -v Warning | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ $skip_bench = 0 ]; then
  stage "end-to-end benchmark"
  # FlashInfer's paged decode as a configuration of its own, where DATA holds its package (and the kernels an
  # earlier call compiled), as for scripts/gpu_run.sh.
  fi_site=""
  if [ -f "$data/flashinfer-site.tar.xz" ]; then
    fi_site=/tmp/gaac-fi
    mkdir -p "$fi_site" && tar -xJf "$data/flashinfer-site.tar.xz" -C "$fi_site" || exit 1
    [ -f "$data/flashinfer-jit.tar.xz" ] && mkdir -p ~/.cache && tar -xJf "$data/flashinfer-jit.tar.xz" -C ~/.cache
  fi
  # shellcheck disable=SC2086
  PYTHONPATH=$site${fi_site:+:$fi_site} \
    python3 bench/gpu/bench_e2e.py ${models:+--models "$models"} --hf-models "$hf" --out "$out/e2e.json" $bench_args \
    2>&1 | tee "$out/e2e.log" | grep -v Warning
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # FlashInfer's kernels as compiled by now, for a later call's DATA (each compiles on first use).
  if [ -n "$fi_site" ] && [ -d ~/.cache/flashinfer ]; then
    tar -cJf "$out/flashinfer-jit.tar.xz" -C ~/.cache flashinfer 2>/dev/null &&
      [ "$(stat -c %s "$out/flashinfer-jit.tar.xz")" -le $((16 << 20)) ] || rm -f "$out/flashinfer-jit.tar.xz"
  fi
fi
stage "done, status $status"
exit $status
