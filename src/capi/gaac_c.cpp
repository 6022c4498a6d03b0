// The C API: thin wrappers that translate exceptions into gaac_status and keep the message per thread.
#include "gaac/gaac.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "gaac/bf16.hpp"
#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/tiling.hpp"

struct gaac_calibration {
  gaac::CalibrationTable table;
};

namespace {

thread_local std::string last_error;

gaac_status fail(gaac_status status, const std::string& message) {
  last_error = message;
  return status;
}

/// Runs `body`, mapping exceptions to statuses; `malformed` is the status for gaac::Error that is not
/// an I/O failure (a bad file when loading, a bad argument otherwise).
template <typename Body>
gaac_status guarded(gaac_status malformed, Body&& body) {
  try {
    last_error.clear();
    return body();
  } catch (const gaac::Error& e) {
    return fail(e.code() == gaac::ErrorCode::io ? GAAC_ERROR_IO : malformed, e.what());
  } catch (const std::bad_alloc&) {
    return fail(GAAC_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(GAAC_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(GAAC_ERROR_INTERNAL, "unknown exception");
  }
}

bool valid_kind(gaac_tensor_kind kind) { return kind == GAAC_KEY || kind == GAAC_VALUE; }

gaac::TileShape shape_of(gaac_tensor_kind kind, int channels) {
  return {kind == GAAC_KEY ? gaac::TensorKind::key : gaac::TensorKind::value, channels};
}

gaac::TensorKind kind_of(gaac_tensor_kind kind) { return kind == GAAC_KEY ? gaac::TensorKind::key : gaac::TensorKind::value; }

gaac_status status_of(gaac::DecodeStatus status) {
  switch (status) {
    case gaac::DecodeStatus::ok: return GAAC_OK;
    case gaac::DecodeStatus::invalid_tag: return GAAC_ERROR_INVALID_TAG;
    case gaac::DecodeStatus::escape_overrun: return GAAC_ERROR_ESCAPE_OVERRUN;
    case gaac::DecodeStatus::nonzero_padding: return GAAC_ERROR_NONZERO_PADDING;
  }
  return GAAC_ERROR_INTERNAL;
}

bool valid_fp8(gaac_fp8_format format) { return format == GAAC_E4M3 || format == GAAC_E5M2; }

gaac::Fp8TileShape fp8_shape_of(gaac_fp8_format format, gaac_tensor_kind kind, int channels) {
  return {format == GAAC_E4M3 ? gaac::ElementFormat::e4m3 : gaac::ElementFormat::e5m2, shape_of(kind, channels)};
}

bool valid_layer(const gaac_calibration* t, gaac_tensor_kind kind, int layer) {
  return t && valid_kind(kind) && layer >= 0 && layer < t->table.layers();
}

}  // namespace

extern "C" {

unsigned gaac_version_number(void) { return GAAC_VERSION_NUMBER; }
const char* gaac_version_string(void) { return GAAC_VERSION_STRING; }

const char* gaac_status_string(gaac_status status) {
  switch (status) {
    case GAAC_OK: return "ok";
    case GAAC_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case GAAC_ERROR_IO: return "I/O error";
    case GAAC_ERROR_MALFORMED: return "malformed input";
    case GAAC_ERROR_INVALID_TAG: return "invalid mode tag 3";
    case GAAC_ERROR_ESCAPE_OVERRUN: return "escape bytes overrun the slot";
    case GAAC_ERROR_NONZERO_PADDING: return "unused escape bytes are not zero";
    case GAAC_ERROR_DOES_NOT_FIT: return "escapes do not fit the slot";
    case GAAC_ERROR_OUT_OF_MEMORY: return "out of memory";
    case GAAC_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* gaac_last_error(void) { return last_error.c_str(); }

size_t gaac_tile_slot_bytes(int channels, size_t escape_capacity) {
  const gaac::TileShape shape = shape_of(GAAC_KEY, channels);
  if (!shape.valid() || escape_capacity % gaac::kSlotAlignment != 0 || escape_capacity > shape.max_slot_capacity()) return 0;
  return shape.slot_bytes(escape_capacity);
}

size_t gaac_tile_raw_bytes(int channels) {
  const gaac::TileShape shape = shape_of(GAAC_KEY, channels);
  return shape.valid() ? shape.raw_bytes() : 0;
}

size_t gaac_tile_max_escape_capacity(int channels) {
  const gaac::TileShape shape = shape_of(GAAC_KEY, channels);
  return shape.valid() ? shape.max_slot_capacity() : 0;
}

gaac_status gaac_encode_tile(gaac_tensor_kind kind, int channels, const uint16_t* src, size_t row_stride,
                             const uint8_t* b3, const uint8_t* b4, size_t escape_capacity, void* slot,
                             size_t slot_size, gaac_tile_info* info) {
  if (!valid_kind(kind) || !src || !b3 || !b4 || !slot || !shape_of(kind, channels).valid()) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_encode_tile: null pointer, bad kind or channels not 64/128");
  }
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    const auto n = static_cast<size_t>(channels);
    const gaac::TileEncoding enc =
        gaac::encode_tile(shape_of(kind, channels), src, row_stride, {{b3, n}, {b4, n}}, escape_capacity,
                          {static_cast<uint8_t*>(slot), slot_size});
    if (info) *info = {enc.groups_by_mode[0], enc.groups_by_mode[1], enc.groups_by_mode[2], enc.escape_bytes};
    return enc.fits ? GAAC_OK : fail(GAAC_ERROR_DOES_NOT_FIT, "escapes exceed the slot capacity");
  });
}

gaac_status gaac_decode_tile(gaac_tensor_kind kind, int channels, const void* slot, size_t slot_size,
                             const uint8_t* b3, const uint8_t* b4, size_t escape_capacity, uint16_t* dst,
                             size_t row_stride) {
  if (!valid_kind(kind) || !slot || !b3 || !b4 || !dst || !shape_of(kind, channels).valid()) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_decode_tile: null pointer, bad kind or channels not 64/128");
  }
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    const auto n = static_cast<size_t>(channels);
    const gaac::DecodeStatus status =
        gaac::decode_tile(shape_of(kind, channels), {static_cast<const uint8_t*>(slot), slot_size}, escape_capacity,
                          {{b3, n}, {b4, n}}, dst, row_stride);
    return status == gaac::DecodeStatus::ok ? GAAC_OK : fail(status_of(status), gaac::to_string(status));
  });
}

size_t gaac_fp8_tile_slot_bytes(gaac_fp8_format format, int channels, size_t escape_capacity) {
  if (!valid_fp8(format)) return 0;
  const gaac::Fp8TileShape shape = fp8_shape_of(format, GAAC_KEY, channels);
  if (!shape.valid() || escape_capacity % gaac::kSlotAlignment != 0 || escape_capacity > shape.max_slot_capacity()) return 0;
  return shape.slot_bytes(escape_capacity);
}

size_t gaac_fp8_tile_raw_bytes(int channels) {
  const gaac::Fp8TileShape shape = fp8_shape_of(GAAC_E4M3, GAAC_KEY, channels);
  return shape.valid() ? shape.raw_bytes() : 0;
}

size_t gaac_fp8_tile_max_escape_capacity(gaac_fp8_format format, int channels) {
  if (!valid_fp8(format)) return 0;
  const gaac::Fp8TileShape shape = fp8_shape_of(format, GAAC_KEY, channels);
  return shape.valid() ? shape.max_slot_capacity() : 0;
}

gaac_status gaac_fp8_encode_tile(gaac_fp8_format format, gaac_tensor_kind kind, int channels, const uint8_t* src,
                                 size_t row_stride, const uint8_t* b2, const uint8_t* b3, size_t escape_capacity, void* slot,
                                 size_t slot_size, gaac_fp8_tile_info* info) {
  if (!valid_fp8(format) || !valid_kind(kind) || !src || !b2 || !b3 || !slot || !shape_of(kind, channels).valid()) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_fp8_encode_tile: null pointer, bad format or kind, or channels not 64/128");
  }
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    const auto n = static_cast<size_t>(channels);
    const gaac::TileEncoding enc = gaac::encode_fp8_tile(fp8_shape_of(format, kind, channels), src, row_stride, {{b2, n}, {b3, n}},
                                                         escape_capacity, {static_cast<uint8_t*>(slot), slot_size});
    if (info) *info = {enc.groups_by_mode[0], enc.groups_by_mode[1], enc.groups_by_mode[2], enc.escape_bytes};
    return enc.fits ? GAAC_OK : fail(GAAC_ERROR_DOES_NOT_FIT, "escapes exceed the slot capacity");
  });
}

gaac_status gaac_fp8_decode_tile(gaac_fp8_format format, gaac_tensor_kind kind, int channels, const void* slot, size_t slot_size,
                                 const uint8_t* b2, const uint8_t* b3, size_t escape_capacity, uint8_t* dst, size_t row_stride) {
  if (!valid_fp8(format) || !valid_kind(kind) || !slot || !b2 || !b3 || !dst || !shape_of(kind, channels).valid()) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_fp8_decode_tile: null pointer, bad format or kind, or channels not 64/128");
  }
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    const auto n = static_cast<size_t>(channels);
    const gaac::DecodeStatus status =
        gaac::decode_fp8_tile(fp8_shape_of(format, kind, channels), {static_cast<const uint8_t*>(slot), slot_size}, escape_capacity,
                              {{b2, n}, {b3, n}}, dst, row_stride);
    return status == gaac::DecodeStatus::ok ? GAAC_OK : fail(status_of(status), gaac::to_string(status));
  });
}

gaac_status gaac_fp8_from_bf16(gaac_fp8_format format, const uint16_t* src, size_t n, float scale, uint8_t* dst) {
  if (!valid_fp8(format) || (n != 0 && (!src || !dst)) || !std::isfinite(scale) || !(scale > 0)) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_fp8_from_bf16: bad format, null pointer, or a scale not finite and positive");
  }
  const gaac::ElementFormat f = format == GAAC_E4M3 ? gaac::ElementFormat::e4m3 : gaac::ElementFormat::e5m2;
  for (size_t i = 0; i < n; ++i) dst[i] = gaac::fp8_from_float(gaac::bf16_to_float(src[i]) / scale, f);
  return GAAC_OK;
}

gaac_status gaac_calibration_create_fp8(int layers, int kv_heads, int head_dim, gaac_fp8_format format, gaac_calibration** out) {
  if (!out || !valid_fp8(format)) return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_create_fp8: out is NULL or bad format");
  *out = nullptr;
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    const gaac::ElementFormat f = format == GAAC_E4M3 ? gaac::ElementFormat::e4m3 : gaac::ElementFormat::e5m2;
    *out = new gaac_calibration{gaac::CalibrationTable(layers, kv_heads, head_dim, f)};
    return GAAC_OK;
  });
}

gaac_status gaac_calibration_create(int layers, int kv_heads, int head_dim, gaac_calibration** out) {
  if (!out) return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_create: out is NULL");
  *out = nullptr;
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    *out = new gaac_calibration{gaac::CalibrationTable(layers, kv_heads, head_dim)};
    return GAAC_OK;
  });
}

gaac_status gaac_calibration_load(const char* path, gaac_calibration** out) {
  if (!path || !out) return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_load: NULL argument");
  *out = nullptr;
  return guarded(GAAC_ERROR_MALFORMED, [&] {
    *out = new gaac_calibration{gaac::load_calibration(path)};
    return GAAC_OK;
  });
}

gaac_status gaac_calibration_save(const gaac_calibration* table, const char* path) {
  if (!table || !path) return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_save: NULL argument");
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    gaac::save_calibration(table->table, path);
    return GAAC_OK;
  });
}

void gaac_calibration_free(gaac_calibration* table) { delete table; }

int gaac_calibration_layers(const gaac_calibration* t) { return t ? t->table.layers() : 0; }
int gaac_calibration_kv_heads(const gaac_calibration* t) { return t ? t->table.kv_heads() : 0; }
int gaac_calibration_head_dim(const gaac_calibration* t) { return t ? t->table.head_dim() : 0; }
int gaac_calibration_element_format(const gaac_calibration* t) { return t ? static_cast<int>(t->table.element_format()) : -1; }

gaac_status gaac_calibration_tile_bases(const gaac_calibration* t, gaac_tensor_kind kind, int layer, int head, int half,
                                        const uint8_t** b3, const uint8_t** b4) {
  if (!valid_layer(t, kind, layer) || head < 0 || head >= t->table.kv_heads() || half < 0 ||
      half >= gaac::tiles_per_head(t->table.head_dim()) || !b3 || !b4) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_tile_bases: argument out of range");
  }
  if (gaac::is_fp8(t->table.element_format())) return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_tile_bases: an FP8 table");
  const gaac::TileBases bases = t->table.tile_bases(kind_of(kind), layer, head, half);
  *b3 = bases.b3.data();
  *b4 = bases.b4.data();
  return GAAC_OK;
}

gaac_status gaac_calibration_set_bases(gaac_calibration* t, gaac_tensor_kind kind, int layer, int head,
                                       const uint8_t* b3, const uint8_t* b4) {
  if (!valid_layer(t, kind, layer) || head < 0 || head >= t->table.kv_heads() || !b3 || !b4) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_set_bases: argument out of range");
  }
  if (gaac::is_fp8(t->table.element_format())) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_set_bases: an FP8 table (use gaac_calibration_set_fp8_bases)");
  }
  const auto n = static_cast<size_t>(t->table.head_dim());
  for (size_t c = 0; c < n; ++c) {
    if (b3[c] > gaac::kMaxBase3 || b4[c] > gaac::kMaxBase4) {
      return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_set_bases: base outside its window range");
    }
  }
  std::copy_n(b3, n, t->table.b3(kind_of(kind), layer, head).begin());
  std::copy_n(b4, n, t->table.b4(kind_of(kind), layer, head).begin());
  return GAAC_OK;
}

gaac_status gaac_calibration_fp8_tile_bases(const gaac_calibration* t, gaac_tensor_kind kind, int layer, int head, int half,
                                            const uint8_t** b2, const uint8_t** b3) {
  if (!valid_layer(t, kind, layer) || head < 0 || head >= t->table.kv_heads() || half < 0 ||
      half >= gaac::tiles_per_head(t->table.head_dim()) || !b2 || !b3 || !gaac::is_fp8(t->table.element_format())) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_fp8_tile_bases: argument out of range or not an FP8 table");
  }
  const gaac::Fp8TileBases bases = t->table.fp8_tile_bases(kind_of(kind), layer, head, half);
  *b2 = bases.b2.data();
  *b3 = bases.b3.data();
  return GAAC_OK;
}

gaac_status gaac_calibration_set_fp8_bases(gaac_calibration* t, gaac_tensor_kind kind, int layer, int head, const uint8_t* b2,
                                           const uint8_t* b3) {
  if (!valid_layer(t, kind, layer) || head < 0 || head >= t->table.kv_heads() || !b2 || !b3 ||
      !gaac::is_fp8(t->table.element_format())) {
    return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_set_fp8_bases: argument out of range or not an FP8 table");
  }
  const gaac::ElementFormat f = t->table.element_format();
  const auto n = static_cast<size_t>(t->table.head_dim());
  for (size_t c = 0; c < n; ++c) {
    if (b2[c] > gaac::fp8_max_base2(f) || b3[c] > gaac::fp8_max_base3(f)) {
      return fail(GAAC_ERROR_INVALID_ARGUMENT, "gaac_calibration_set_fp8_bases: base outside its window range");
    }
  }
  std::copy_n(b2, n, t->table.narrow(kind_of(kind), layer, head).begin());
  std::copy_n(b3, n, t->table.wide(kind_of(kind), layer, head).begin());
  return GAAC_OK;
}

gaac_status gaac_calibration_escape_capacity(const gaac_calibration* t, gaac_tensor_kind kind, int layer, size_t* bytes) {
  if (!valid_layer(t, kind, layer) || !bytes) return fail(GAAC_ERROR_INVALID_ARGUMENT, "escape capacity: bad argument");
  *bytes = t->table.escape_capacity(kind_of(kind), layer);
  return GAAC_OK;
}

gaac_status gaac_calibration_set_escape_capacity(gaac_calibration* t, gaac_tensor_kind kind, int layer, size_t bytes) {
  if (!valid_layer(t, kind, layer)) return fail(GAAC_ERROR_INVALID_ARGUMENT, "set escape capacity: bad argument");
  return guarded(GAAC_ERROR_INVALID_ARGUMENT, [&] {
    t->table.set_escape_capacity(kind_of(kind), layer, bytes);
    return GAAC_OK;
  });
}

}  // extern "C"
