#!/usr/bin/env bash
# One call on a GPU machine: take the prebuilt CUDA binaries if they run there (else build them with the
# compiler whose C++ runtime python3 loads: scripts/cxx_for_python.sh), run
# the GPU tests, the decode-attention benchmark against PyTorch SDPA and FlashInfer, the codec
# benchmark against the peer codecs (--codecs), the comparisons with earlier kernel versions,
# compute-sanitizer memcheck and racecheck on small cases, and Nsight Compute on chosen cases. $OUT
# (default ./gpu-out) receives bench.json and bench.log (bench-2.json ... for each further --bench-args),
# codecs.json, flashinfer-jit.tar.xz (FlashInfer's kernels compiled in this call) and logs.tar.gz (every
# other log).
#   scripts/gpu_run.sh [--prebuilt DIR] [--data DIR] [--bench-args "..."]... [--skip-tests] [--skip-sanitizer]
#                      [--skip-bench] [--codecs PEERS_DIR] [--codec-args "..."] [--profile SHAPE:CTX:BS]...
#                      [--compare NAME=LIB]... [--compare-args "..."] [--limit SECONDS]
# --prebuilt DIR may hold only some of the GPU tests (cuda_decode_test and the benchmark library at least);
# the others are reported skipped. Each --bench-args is one run of the benchmark (its own shapes and cases),
# one after the other; each --profile one case under Nsight Compute.
# --compare times an earlier build of the benchmark library (another kernel version) on 64K batch 1
# of `llama` (or on --compare-args' shapes and cases) against this one, in the same call, after the
# main benchmark; --limit is the time the
# call may take (default 570 s), from which the benchmark's budget is derived.
# DATA holds kv/ (bench/gpu/cut_layer.py output), flashinfer-site.tar.xz (optional: FlashInfer and
# apache-tvm-ffi unpacked from their wheels) and xxhash/ (xxhash.h, for building where pkg-config's
# libxxhash is missing).
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt="" data="" bench_args=() skip_tests=0 skip_sanitizer=0 profiles=() skip_bench=0 limit=570 compare=()
codecs="" codec_args="" compare_args="--shapes llama --cases 65536:1"
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --bench-args) bench_args+=("$2"); shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-sanitizer) skip_sanitizer=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --codecs) codecs=$2; shift 2 ;;  # PEERS_DIR: scripts/prepare_codec_peers.sh output
    --codec-args) codec_args=$2; shift 2 ;;
    --profile) profiles+=("$2"); shift 2 ;;  # SHAPE:CTX:BS: Nsight Compute on one GAAC and one twin launch
    --compare) compare+=("$2"); shift 2 ;;
    --compare-args) compare_args=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
stage() { printf '\n=== %s (t=%ds)\n' "$*" "$SECONDS"; }

stage "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
nvcc --version | tail -1

# The GPU tests, in the order they run.
gpu_tests=(lane_decode_test cuda_codec_test cuda_decode_test cuda_grow_test cuda_chunk_test)
# Prebuilt binaries run here when the decode test, every other test the directory holds, and the
# benchmark library load (a directory may hold only the tests a change touches).
prebuilt_runs() {
  "$prebuilt/cuda_decode_test" --gtest_list_tests >/dev/null 2>&1 || return 1
  for t in "${gpu_tests[@]}"; do
    [ ! -e "$prebuilt/$t" ] || "$prebuilt/$t" --gtest_list_tests >/dev/null 2>&1 || return 1
  done
  python3 -c "import torch, ctypes; ctypes.CDLL('$prebuilt/libgaac_gpu_bench.so')" 2>/dev/null
}
bin=""
if [ -n "$prebuilt" ] && prebuilt_runs; then
  bin=$prebuilt
  echo "using prebuilt binaries from $prebuilt"
else
  stage "build"
  xx=()
  [ -n "$data" ] && [ -f "$data/xxhash/xxhash.h" ] && xx=(-DGAAC_XXHASH_INCLUDE_DIR="$PWD/$data/xxhash")
  # One C++ runtime in the benchmark's Python process: the compiler whose libstdc++ python3 loads.
  cxx=$(scripts/cxx_for_python.sh) || exit 1
  echo "C++ compiler: $cxx"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAAC_BUILD_BENCHMARKS=OFF -DGAAC_BUILD_TOOLS=OFF \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CUDA_HOST_COMPILER="$cxx" "${xx[@]}" >"$out/cmake.log" 2>&1 ||
    { tail -30 "$out/cmake.log"; exit 1; }
  ninja -C build-gpu "${gpu_tests[@]}" gaac_gpu_bench >"$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; exit 1; }
  mkdir -p build-gpu/collected
  cp "${gpu_tests[@]/#/build-gpu/tests/}" build-gpu/bench/gpu/libgaac_gpu_bench.so build-gpu/collected/
  bin=build-gpu/collected
fi

# A prebuilt directory may carry only the tests a change touches (a call carries at most 64 MiB): true, saying
# so, for a test it does not carry. (In a directory built here every test is present.)
not_carried() {
  [ "$bin" = "$prebuilt" ] && [ ! -x "$bin/$1" ] && echo "$1: SKIPPED, not in $bin"
}

status=0
if [ $skip_tests -eq 0 ]; then
  stage "tests"
  for t in "${gpu_tests[@]}"; do
    not_carried "$t" && continue
    timeout 300 "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    echo "$t: exit $rc"; tail -3 "$out/$t.log"
    [ $rc -ne 0 ] && { status=1; grep -E "Failure|error|Expected|Which is|differ" "$out/$t.log" | head -30; }
  done
fi
sanitize() {
  stage "compute-sanitizer"
  for t in cuda_decode_test:GpuDecode cuda_decode_test:GpuFp8Decode cuda_codec_test:GpuCodec; do
    not_carried "${t%%:*}" && continue
    for tool in memcheck racecheck; do
      log="$out/sanitizer-${t%%:*}-${t#*:}-$tool.log"
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$bin/${t%%:*}" \
        --gtest_filter="${t#*:}.SmallCaseForTheSanitizers" >"$log" 2>&1
      rc=$?
      echo "${t%%:*} $tool: exit $rc"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Invalid" "$log" | head -5
      [ $rc -ne 0 ] && status=1
    done
  done
}

profile_kernels() {
  local profile=$1 name=${1//:/-}
  stage "nsight compute $profile"
  timeout 120 ncu --clock-control none --kernel-name regex:decode_attention_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 bench/gpu/bench_decode.py --lib "$bin/libgaac_gpu_bench.so" --out "$out/profile-$name.json" --profile "$profile" \
    ${kv_dir:+--kv-dir "$kv_dir"} >"$out/ncu-$name.txt" 2>&1
  echo "ncu: exit $?"
  grep -E "decode_attention_kernel|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|pipe_alu|pipe_fma|inst_executed.sum|Warp Cycles Per Issued|issue_stalled" "$out/ncu-$name.txt" |
    awk '!/issue_stalled/ || $NF + 0 >= 0.1' | head -60
}

# Logs go into one archive at the end (a call returns few files): bench.json, bench.log, logs.tar.gz.
finish() {
  stage "done"
  (cd "$out" && tar -czf logs.tar.gz --exclude='bench*.json' --exclude='bench*.log' --exclude=codecs.json \
    --exclude=codecs.log --exclude=flashinfer-jit.tar.xz --exclude=logs.tar.gz -- * 2>/dev/null &&
    find . -maxdepth 1 -type f ! -name 'bench*.json' ! -name 'bench*.log' ! -name codecs.json ! -name codecs.log \
      ! -name flashinfer-jit.tar.xz ! -name logs.tar.gz -delete)
  exit $status
}

if [ -n "$data" ] && [ -f "$data/flashinfer-site.tar.xz" ]; then
  mkdir -p /tmp/gaac-site && tar -xJf "$data/flashinfer-site.tar.xz" -C /tmp/gaac-site && export PYTHONPATH=/tmp/gaac-site
fi
if [ -n "$data" ] && [ -f "$data/flashinfer-jit.tar.xz" ]; then
  mkdir -p ~/.cache && tar -xJf "$data/flashinfer-jit.tar.xz" -C ~/.cache  # kernels compiled by an earlier call
fi
kv_dir=${data:+$data/kv}

if [ $skip_bench -eq 0 ]; then
  [ ${#bench_args[@]} -eq 0 ] && bench_args=("")
  for i in "${!bench_args[@]}"; do
    name=bench$([ "$i" -gt 0 ] && echo "-$((i + 1))")
    stage "benchmark $((i + 1)) of ${#bench_args[@]}: ${bench_args[$i]}"
    # What runs after the benchmark: the comparisons (~8 s each), the sanitizers (~45 s), ncu (~20 s each);
    # the time left is shared by the benchmark runs still to come.
    reserve=$((8 * ${#compare[@]} + (skip_sanitizer ? 0 : 65) + 20 * ${#profiles[@]} + 10))
    left=$(((limit - SECONDS - reserve) / (${#bench_args[@]} - i)))
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout $((left + 30)) python3 bench/gpu/bench_decode.py --lib "$bin/libgaac_gpu_bench.so" \
      --out "$out/$name.json" ${kv_dir:+--kv-dir "$kv_dir"} --budget-s $((left - 20)) ${bench_args[$i]} 2>&1 |
      grep -v "^  \(gaac\|bf16\)_.*stages\|^$" | tail -70
  done
  # FlashInfer's kernels compiled here, for a later call's --data (it compiles each on first use, 10-20 s).
  if [ -d ~/.cache/flashinfer ] && [ ! -f "$data/flashinfer-jit.tar.xz" ]; then
    tar -cJf "$out/flashinfer-jit.tar.xz" -C ~/.cache flashinfer 2>/dev/null &&
      [ "$(stat -c %s "$out/flashinfer-jit.tar.xz")" -le $((16 << 20)) ] || rm -f "$out/flashinfer-jit.tar.xz"
  fi
fi
if [ -n "$codecs" ]; then
  stage "codec benchmark (peers from $codecs)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout $((limit - SECONDS - 30 > 60 ? limit - SECONDS - 30 : 60)) python3 bench/gpu/bench_codecs.py \
    --lib "$bin/libgaac_gpu_bench.so" --peers-dir "$codecs" ${kv_dir:+--kv-dir "$kv_dir"} --out "$out/codecs.json" \
    $codec_args 2>&1 | tee "$out/codecs.log" | tail -80
fi
for c in "${compare[@]}"; do
  name=${c%%=*} lib=${c#*=}
  stage "compare $name ($lib)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout 60 python3 bench/gpu/bench_decode.py --lib "$lib" --out "$out/compare-$name.json" \
    ${kv_dir:+--kv-dir "$kv_dir"} $compare_args --quick-variants --no-flashinfer 2>&1 | grep -E "^(  (gaac|bf16_twin) |[a-z])"
done
[ $skip_sanitizer -eq 0 ] && sanitize
for p in "${profiles[@]}"; do profile_kernels "$p"; done
finish
