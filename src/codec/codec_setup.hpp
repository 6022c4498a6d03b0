// What building a tile codec and a table of them involves for either element format (tile_codec.cpp for
// BF16, fp8_tile_codec.cpp for FP8): the capacity and backend checks, the codecs of a calibration table
// in their one order and the index into it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/error.hpp"
#include "gaac/tiling.hpp"

namespace gaac::detail {

/// Throws gaac::Error unless `capacity` is a multiple of 16 no larger than `max_capacity`.
inline void check_escape_capacity(size_t capacity, size_t max_capacity) {
  if (capacity % kSlotAlignment != 0 || capacity > max_capacity) {
    throw Error("escape capacity " + std::to_string(capacity) + " is not a multiple of 16 in [0, " +
                std::to_string(max_capacity) + "]");
  }
}

/// The backend a codec runs on: `backend`, or the best one for Backend::automatic. Throws gaac::Error
/// when it is not available on this machine.
inline Backend resolve_backend(Backend backend) {
  if (backend == Backend::automatic) backend = best_backend();
  if (!backend_available(backend)) throw Error(std::string("backend not available on this machine: ") + to_string(backend));
  return backend;
}

/// The codecs of every tile of `table`, ordered [kind][layer][head][half], each made by
/// `make(kind, layer, head, half, capacity)`; `capacity` is `escape_capacity` when given, else the
/// (kind, layer)'s calibrated one.
template <class Codec, class Make>
std::vector<Codec> codecs_of_table(const CalibrationTable& table, std::optional<size_t> escape_capacity, Make&& make) {
  const int halves = tiles_per_head(table.head_dim());
  std::vector<Codec> codecs;
  codecs.reserve(2 * static_cast<size_t>(table.layers()) * table.kv_heads() * halves);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < table.layers(); ++l) {
      const size_t capacity = escape_capacity.value_or(table.escape_capacity(kind, l));
      for (int h = 0; h < table.kv_heads(); ++h) {
        for (int half = 0; half < halves; ++half) codecs.push_back(make(kind, l, h, half, capacity));
      }
    }
  }
  return codecs;
}

/// Where the codecs of (kind, layer) start in codecs_of_table's order. Throws gaac::Error for a layer
/// outside [0, layers).
inline size_t codec_table_index(TensorKind kind, int layer, int layers, int per_layer) {
  if (layer < 0 || layer >= layers) {
    throw Error("layer " + std::to_string(layer) + " outside the calibration's " + std::to_string(layers) + " layers");
  }
  return ((kind == TensorKind::key ? 0 : static_cast<size_t>(layers)) + static_cast<size_t>(layer)) *
         static_cast<size_t>(per_layer);
}

}  // namespace gaac::detail
