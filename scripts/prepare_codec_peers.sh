#!/usr/bin/env bash
# Prepares the peers of the GPU codec comparison (bench/gpu/bench_codecs.py) on THIS machine (no GPU needed)
# and packs them into one archive to carry to the GPU machine, which has no registry and no internet:
#
#   .gpu/peers/peers.tar.xz   (ignored by git; carry it: carry [".gpu/peers"])
#     site/nvidia/{nvcomp,libnvcomp}  nvCOMP 6.0 Python API, CPython 3.12 only (wheels nvidia-nvcomp-cu13 and
#                                     nvidia-libnvcomp-cu13 6.0.0.12, stripped of other Pythons, the CLI and headers)
#     site/dfloat11/                  dfloat11 0.5.0: decode.ptx and dfloat11_utils.py (its package __init__ pulls
#                                     in transformers/accelerate; the harness loads these two files directly)
#     site/dahuffman/                 dahuffman 0.4.2 (pure Python; DFloat11's code-table builder needs it)
#     splitzip/codec_gpu.py           SplitZip's Triton codec
#     lib/libdietgpu_capi.so          DietGPU's float codec + bench/gpu/peers/dietgpu_capi.cu, sm_90
#     lib/libzipserv_capi.so          ZipServ's decompressor and host compressor + bench/gpu/peers/zipserv_capi.cu
#     manifest.json                   versions, source commits, build flags
#
# Work files (wheels, fetched sources, objects) stay in .gpu/peers-work (also ignored), so that .gpu/peers
# holds the archive alone and can be carried whole. The peers' sources are taken at their HEAD from bare
# clones under $MIRROR/<owner>+<name>/repo when present (MIRROR defaults to /work/.mirror), else cloned
# from GitHub; manifest.json records the commits. They are for reading and measuring only: never commit them.
#
# On the GPU machine:  python3 bench/gpu/bench_codecs.py --peers-dir .gpu/peers ...   (unpacks into /tmp)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/.gpu/peers"
WORK="$ROOT/.gpu/peers-work"
STAGE="$WORK/stage"
MIRROR=${MIRROR:-/work/.mirror}
NVCC=${NVCC:-nvcc}
ARCH=${ARCH:-sm_90}
JOBS=${JOBS:-$(nproc)}

cd "$ROOT"
git check-ignore -q .gpu/peers/x || { echo "error: .gpu/peers is not ignored by git" >&2; exit 1; }
mkdir -p "$WORK/wheels" "$WORK/src" "$WORK/build"
rm -rf "$STAGE"
mkdir -p "$STAGE/site" "$STAGE/lib" "$STAGE/splitzip"

echo "== wheels"
WHEELS=(nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12 dfloat11==0.5.0 dahuffman==0.4.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$WORK/wheels" "${WHEELS[@]}"
wheel() { ls "$WORK/wheels/"$1 | head -1; }
unzip -q -o "$(wheel 'nvidia_nvcomp_cu13-6.0.0.12-*.whl')" 'nvidia/nvcomp/__init__.py' 'nvidia/nvcomp/external_memory.py' \
  'nvidia/nvcomp/nvcomp_impl.cpython-312-x86_64-linux-gnu.so' -d "$STAGE/site"
unzip -q -o "$(wheel 'nvidia_libnvcomp_cu13-6.0.0.12-*.whl')" 'nvidia/libnvcomp/__init__.py' 'nvidia/libnvcomp/load.py' \
  'nvidia/libnvcomp/lib64/libnvcomp.so.6' 'nvidia/libnvcomp/LICENSE' -d "$STAGE/site"
unzip -q -o "$(wheel 'dfloat11-0.5.0-*.whl')" 'dfloat11/decode.ptx' 'dfloat11/dfloat11_utils.py' -d "$STAGE/site"
unzip -q -o "$(wheel 'dahuffman-0.4.2-*.whl')" 'dahuffman/*' -d "$STAGE/site"

echo "== sources"
declare -A COMMITS
source_of() {  # owner/name -> $WORK/src/name at the mirror's (or a fresh clone's) HEAD
  local repo=$1 name=${1#*/} git_dir="$MIRROR/${1/\//+}/repo"
  rm -rf "$WORK/src/$name"
  mkdir -p "$WORK/src/$name"
  if [ ! -d "$git_dir" ]; then
    git_dir="$WORK/src/$name.git"
    [ -d "$git_dir" ] || git clone -q --bare "https://github.com/$repo" "$git_dir"
  fi
  git --git-dir="$git_dir" archive HEAD | tar -x -C "$WORK/src/$name"
  COMMITS[$repo]=$(git --git-dir="$git_dir" rev-parse HEAD)
  echo "$repo ${COMMITS[$repo]}"
}
source_of facebookresearch/dietgpu
source_of HPMLL/ZipServ_ASPLOS26
source_of Intelligent-Microsystems-Lab/SplitZip
cp "$WORK/src/SplitZip/codec_gpu.py" "$WORK/src/SplitZip/LICENSE" "$STAGE/splitzip/"

echo "== DietGPU ($ARCH)"
D="$WORK/src/dietgpu"
B="$WORK/build/dietgpu"
rm -rf "$B" && mkdir -p "$B"
DFLAGS=(-O3 -std=c++17 "-arch=$ARCH" -Xcompiler -fPIC --expt-relaxed-constexpr "-I$D" -Ibench/gpu/peers/glog_stub)
DSRC=(dietgpu/float/GpuFloatCompress.cu dietgpu/float/GpuFloatDecompress.cu dietgpu/float/GpuFloatInfo.cu
      dietgpu/ans/GpuANSEncode.cu dietgpu/ans/GpuANSDecode.cu dietgpu/ans/GpuANSInfo.cu)
pids=()
for f in "${DSRC[@]}"; do
  "$NVCC" "${DFLAGS[@]}" -c "$D/$f" -o "$B/$(basename "$f" .cu).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
"$NVCC" "${DFLAGS[@]}" -x cu -c "$D/dietgpu/utils/DeviceUtils.cpp" -o "$B/DeviceUtils.o"
"$NVCC" "${DFLAGS[@]}" -x cu -c "$D/dietgpu/utils/StackDeviceMemory.cpp" -o "$B/StackDeviceMemory.o"
"$NVCC" "${DFLAGS[@]}" -c bench/gpu/peers/dietgpu_capi.cu -o "$B/dietgpu_capi.o"
"$NVCC" -shared "-arch=$ARCH" -o "$STAGE/lib/libdietgpu_capi.so" "$B"/*.o
cp "$D/LICENSE.md" "$STAGE/lib/DIETGPU_LICENSE.md"

echo "== ZipServ ($ARCH)"
Z="$WORK/src/ZipServ_ASPLOS26"
"$NVCC" -O3 -std=c++17 -gencode "arch=compute_${ARCH#sm_},code=$ARCH" -Xcompiler -fPIC -maxrregcount=255 --use_fast_math \
  -diag-suppress 177 "-I$Z/csrc" "-I$Z/kernel_benchmark" -shared bench/gpu/peers/zipserv_capi.cu \
  -o "$STAGE/lib/libzipserv_capi.so"
cp "$Z/LICENSE" "$STAGE/lib/ZIPSERV_LICENSE"

for so in "$STAGE"/lib/*.so; do  # they must not need anything the GPU machine may lack
  if ldd "$so" | grep -q 'not found'; then ldd "$so"; echo "error: $so has unresolved libraries" >&2; exit 1; fi
  nm -D --defined-only "$so" | grep -q -E ' T (dietgpu|zipserv)_error$' || { echo "error: $so lacks its C API" >&2; exit 1; }
done

echo "== manifest"
python3 - "$STAGE/manifest.json" "$ARCH" "$($NVCC --version | tail -1)" \
  "facebookresearch/dietgpu=${COMMITS[facebookresearch/dietgpu]}" \
  "HPMLL/ZipServ_ASPLOS26=${COMMITS[HPMLL/ZipServ_ASPLOS26]}" \
  "Intelligent-Microsystems-Lab/SplitZip=${COMMITS[Intelligent-Microsystems-Lab/SplitZip]}" <<'EOF'
import json, sys
path, arch, nvcc, *commits = sys.argv[1:]
json.dump({
    "wheels": ["nvidia-nvcomp-cu13==6.0.0.12", "nvidia-libnvcomp-cu13==6.0.0.12", "dfloat11==0.5.0", "dahuffman==0.4.2"],
    "sources": dict(c.split("=", 1) for c in commits),
    "build": {"arch": arch, "nvcc": nvcc,
              "dietgpu": "float codec (ANS on the exponent byte), probBits 10, glog replaced by bench/gpu/peers/glog_stub",
              "zipserv": "BF16TripleBitmap_Decompress_API + InitBF16MatrixTripleBitmap_Host, tiles 8/16x64/64x64"},
}, open(path, "w"), indent=1)
EOF

echo "== pack"
rm -f "$OUT/peers.tar.xz"
tar -C "$STAGE" -cf - . | xz -T "$JOBS" -9e > "$OUT/peers.tar.xz.tmp"
mv "$OUT/peers.tar.xz.tmp" "$OUT/peers.tar.xz"
du -sh "$STAGE" "$OUT/peers.tar.xz"
size=$(stat -c %s "$OUT/peers.tar.xz")
if [ "$size" -gt $((48 << 20)) ]; then echo "warning: peers.tar.xz is over 48 MiB: little room left in a 64 MiB carry" >&2; fi
echo "carry: .gpu/peers (peers.tar.xz, $((size >> 20)) MiB); on the GPU machine: bench/gpu/bench_codecs.py --peers-dir .gpu/peers"
