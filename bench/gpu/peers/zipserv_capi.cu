// A tiny C interface to ZipServ's standalone BF16 decompressor (HPMLL/ZipServ_ASPLOS26, Apache-2.0), for ctypes.
// ZipServ ships its decompression kernel both fused with GEMM and standalone: BF16TripleBitmap_Decompress_API
// (csrc/L_API.cu, measured by the authors' kernel_benchmark/test_decompress.cu). Its compressor runs on the
// host: InitBF16MatrixTripleBitmap_Host (kernel_benchmark/utils.h), with the tiling the authors' benchmark uses
// (8x8 small, 16x64 medium, 64x64 global tiles; top-7 exponents picked per matrix). Both are compiled here from
// a fetched copy of their sources (scripts/prepare_codec_peers.sh), which is never committed; only this glue is ours.
//
// Every function returns 0 (or a handle) on success; otherwise zipserv_error() says why.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "L_API.cu"  // ZipServ: kernels and BF16TripleBitmap_Decompress_API (csrc/)
#include "utils.h"   // ZipServ: host compressor InitBF16MatrixTripleBitmap_Host (kernel_benchmark/)

namespace {
thread_local std::string g_error;
std::string g_describe;

struct Compressed {
  int M = 0, K = 0, global_tiles = 0, tiles = 0, median_tiles = 0;
  int max_high_freq = 0, max_full = 0, high_freq_count = 0, full_count = 0;
  uint8_t start_exp = 0;
  uint8_t* sign_mantissa = nullptr;
  __nv_bfloat16* full = nullptr;
  uint64_t *bitmap1 = nullptr, *bitmap2 = nullptr, *bitmap3 = nullptr;
  int *offsets_median = nullptr, *offsets_global = nullptr;
  size_t bytes() const {  // what the decompressor reads (the small-tile offsets are not used by it)
    return size_t(high_freq_count) + size_t(full_count) * 2 + size_t(tiles) * 8 * 3 + size_t(median_tiles) * 2 * 4 +
           size_t(global_tiles + 1) * 2 * 4;
  }
};

bool upload(void** dst, const void* src, size_t bytes) {
  if (cudaMalloc(dst, bytes < 16 ? 16 : bytes) != cudaSuccess) return false;
  if (bytes && cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  return true;
}

// The authors' compressor prints pages of statistics on stdout; keep them out of the harness's output.
struct SilenceStdout {
  int saved = -1;
  SilenceStdout() {
    fflush(stdout);
    std::cout.flush();
    saved = dup(1);
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      dup2(null_fd, 1);
      close(null_fd);
    }
  }
  ~SilenceStdout() {
    fflush(stdout);
    std::cout.flush();
    if (saved >= 0) {
      dup2(saved, 1);
      close(saved);
    }
  }
};
}  // namespace

extern "C" {

const char* zipserv_error() { return g_error.c_str(); }

// Compresses a row-major M x K BF16 matrix from host memory (M, K multiples of 64) and uploads the result to
// the current device. Returns a handle or NULL.
void* zipserv_compress(const uint16_t* host, int M, int K) {
  if (M <= 0 || K <= 0 || M % 64 || K % 64) {
    g_error = "ZipServ needs M and K multiples of 64";
    return nullptr;
  }
  auto* c = new Compressed;
  c->M = M, c->K = K;
  __nv_bfloat16* top = nullptr;
  __nv_bfloat16 *full = nullptr;
  uint8_t* sm = nullptr;
  uint64_t *b1 = nullptr, *b2 = nullptr, *b3 = nullptr;
  int *off = nullptr, *off_med = nullptr, *off_glob = nullptr;
  {
    SilenceStdout quiet;
    c->global_tiles = InitBF16MatrixTripleBitmap_Host(
        reinterpret_cast<__nv_bfloat16*>(const_cast<uint16_t*>(host)), M, K, 8, 16, 64, 8, 64, 64, &top, &full, &sm,
        &b1, &b2, &b3, &off, &off_med, &off_glob, c->max_high_freq, c->max_full, c->start_exp);
  }
  if (c->global_tiles <= 0) {
    g_error = "ZipServ's compressor failed";
    delete c;
    return nullptr;
  }
  c->tiles = (M / 8) * (K / 8);
  c->median_tiles = (M / 16) * (K / 64);
  c->high_freq_count = off_glob[c->global_tiles * 2];
  c->full_count = off_glob[c->global_tiles * 2 + 1];
  bool ok = upload((void**)&c->sign_mantissa, sm, size_t(c->high_freq_count)) &&
            upload((void**)&c->full, full, size_t(c->full_count) * 2) &&
            upload((void**)&c->bitmap1, b1, size_t(c->tiles) * 8) && upload((void**)&c->bitmap2, b2, size_t(c->tiles) * 8) &&
            upload((void**)&c->bitmap3, b3, size_t(c->tiles) * 8) &&
            upload((void**)&c->offsets_median, off_med, size_t(c->median_tiles) * 2 * 4) &&
            upload((void**)&c->offsets_global, off_glob, size_t(c->global_tiles + 1) * 2 * 4);
  free(top), free(full), free(sm), free(b1), free(b2), free(b3), free(off), free(off_med), free(off_glob);
  if (!ok) {
    g_error = std::string("ZipServ upload failed: ") + cudaGetErrorString(cudaGetLastError());
    return nullptr;
  }
  return c;
}

// JSON: M, K, compressed_bytes, high_freq_count, full_count, max_high_freq, max_full, start_exp.
const char* zipserv_describe(void* h) {
  auto* c = static_cast<Compressed*>(h);
  char buf[512];
  snprintf(buf, sizeof buf,
           "{\"M\": %d, \"K\": %d, \"compressed_bytes\": %zu, \"high_freq_count\": %d, \"full_count\": %d, "
           "\"max_high_freq\": %d, \"max_full\": %d, \"start_exp\": %d, \"global_tiles\": %d}",
           c->M, c->K, c->bytes(), c->high_freq_count, c->full_count, c->max_high_freq, c->max_full, c->start_exp,
           c->global_tiles);
  g_describe = buf;
  return g_describe.c_str();
}

// Decompresses the whole matrix into `out` (device, M x K BF16) on `stream`: one kernel launch.
int zipserv_decompress(void* h, void* out, void* stream) {
  auto* c = static_cast<Compressed*>(h);
  cudaError_t e = BF16TripleBitmap_Decompress_API(
      static_cast<cudaStream_t>(stream), c->sign_mantissa, c->full, c->bitmap1, c->bitmap2, c->bitmap3,
      c->offsets_median, c->offsets_global, c->max_high_freq, c->max_full, c->start_exp,
      static_cast<__nv_bfloat16*>(out), c->M, c->K);
  if (e != cudaSuccess) {
    g_error = std::string("ZipServ decompress: ") + cudaGetErrorString(e);
    return 1;
  }
  return 0;
}

void zipserv_free(void* h) {
  auto* c = static_cast<Compressed*>(h);
  if (!c) return;
  cudaFree(c->sign_mantissa), cudaFree(c->full), cudaFree(c->bitmap1), cudaFree(c->bitmap2), cudaFree(c->bitmap3);
  cudaFree(c->offsets_median), cudaFree(c->offsets_global);
  delete c;
}

}  // extern "C"
