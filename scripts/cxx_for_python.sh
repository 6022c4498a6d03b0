#!/usr/bin/env bash
# Prints the C++ compiler to build anything that python3 will load (the Python package, the GPU
# benchmark library): one whose C++ runtime (libstdc++) is the one python3 has loaded once PyTorch is
# imported, or older. Code built by a newer GCC than the runtime in the process calls into a library
# that does not match its headers: it may load and then crash far from the cause (seen: a segfault in
# std::ostringstream's codecvt inside gaac_bench_create, built by a GCC 13.3 that was not the system's).
# Tries the distribution's /usr/bin/g++ first, then $CXX, g++, c++ and /usr/bin/g++-N; says on standard
# error what it found; exits 1 naming the runtime when none qualifies.
set -euo pipefail

loaded=$(python3 - <<'PY'
import ctypes, os
try:
    import torch  # noqa: F401 -- the process that loads gaac has PyTorch's runtime in it first
except ImportError:
    pass
ctypes.CDLL("libstdc++.so.6")
for line in open("/proc/self/maps"):
    fields = line.split()
    if len(fields) >= 6 and "libstdc++.so" in fields[5]:
        print(os.path.realpath(fields[5]))
        break
PY
)
[ -n "$loaded" ] || { echo "cxx_for_python: python3 loads no libstdc++" >&2; exit 1; }

version() { basename "$1" | sed -n 's/^libstdc++\.so\.\([0-9.]*\)$/\1/p'; }
want=$(version "$loaded")
best="" best_version=""
echo "cxx_for_python: python3 (with PyTorch) loads $loaded" >&2
for c in /usr/bin/g++ "${CXX:-}" g++ c++ /usr/bin/c++ /usr/bin/g++-[0-9]*; do
  [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
  lib=$(realpath "$("$c" -print-file-name=libstdc++.so.6)" 2>/dev/null) || continue
  have=$(version "$lib")
  echo "cxx_for_python: $(command -v "$c") links $lib" >&2
  [ -n "$have" ] || continue
  if [ "$lib" = "$loaded" ]; then command -v "$c"; exit 0; fi  # the very runtime python3 uses
  # Otherwise the newest runtime that is not newer than the loaded one.
  if [ "$(printf '%s\n%s\n' "$have" "$want" | sort -V | tail -1)" = "$want" ] &&
     { [ -z "$best_version" ] || [ "$(printf '%s\n%s\n' "$have" "$best_version" | sort -V | tail -1)" = "$have" ]; }; then
    best=$(command -v "$c") best_version=$have
  fi
done
[ -n "$best" ] && { echo "$best"; exit 0; }
echo "cxx_for_python: no C++ compiler here has a runtime no newer than the one python3 loads ($loaded);" \
     "a library built here could crash inside python3. Install the system g++ or set CXX." >&2
exit 1
