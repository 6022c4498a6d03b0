// Argument checks and the choice between the AVX2 and reference implementations.
#include <string>

#include "gaac/error.hpp"
#include "model/quants.hpp"

namespace gaac::model {
namespace {

/// The type's name for messages: ggml's, or "type <id>" for an id not in the type table.
std::string name_of(GgmlType type) {
  return supported_type(type) ? ggml_type_info(type).name : "type " + std::to_string(static_cast<uint32_t>(type));
}

void check_type(GgmlType type) {
  if (!supported_type(type)) throw Error("quantized products: unsupported tensor type " + name_of(type));
}

bool use_avx2() {
  static const bool available = avx2::available();
  return available;
}

}  // namespace

const char* active_backend() { return use_avx2() ? "avx2" : "reference"; }

namespace detail {

void check_dequantize(GgmlType type, const uint8_t* src, const float* dst, int64_t n) {
  check_type(type);
  const int64_t block = ggml_type_info(type).block_elements;
  if (n < 0 || n % block != 0) {
    throw Error("dequantize " + name_of(type) + ": " + std::to_string(n) + " elements is not a multiple of the block size " +
                std::to_string(block));
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) throw Error("dequantize " + name_of(type) + ": null buffer");
}

void check_matmul(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                  const float* x, int64_t tokens, const float* y, int64_t y_stride) {
  check_type(type);
  const std::string what = "matmul " + name_of(type) + ": ";
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (cols < 0 || cols % info.block_elements != 0) {
    throw Error(what + std::to_string(cols) + " columns is not a multiple of the block size " +
                std::to_string(info.block_elements));
  }
  const auto encoded = static_cast<size_t>(cols / info.block_elements) * info.block_bytes;
  if (row_bytes < encoded) {
    throw Error(what + "row stride of " + std::to_string(row_bytes) + " bytes is less than a row's " +
                std::to_string(encoded) + " bytes");
  }
  if (row_begin < 0 || row_end < row_begin) {
    throw Error(what + "bad row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) + ")");
  }
  if (tokens < 0) throw Error(what + "negative token count " + std::to_string(tokens));
  if (tokens > 0 && y_stride < row_end) {
    throw Error(what + "output stride " + std::to_string(y_stride) + " is less than the row end " + std::to_string(row_end));
  }
  if (row_end > row_begin && tokens > 0) {
    if (y == nullptr || (cols > 0 && (w == nullptr || x == nullptr))) throw Error(what + "null buffer");
  }
}

}  // namespace detail

void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  if (use_avx2()) {
    avx2::dequantize_row(type, src, dst, n);
  } else {
    scalar::dequantize_row(type, src, dst, n);
  }
}

void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride) {
  if (use_avx2()) {
    avx2::matmul_rows(type, w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  } else {
    scalar::matmul_rows(type, w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  }
}

}  // namespace gaac::model
