#include "gaac/studies.hpp"

#include <algorithm>

#include "gaac/fp8_codec.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/error.hpp"
#include "gaac/format.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

constexpr TensorKind kKinds[] = {TensorKind::key, TensorKind::value};


/// The element format of a dump.
ElementFormat format_of(const KvDump&) { return ElementFormat::bf16; }
ElementFormat format_of(const Fp8KvDump& dump) { return dump.format; }

/// The exponent of an element, BF16 or FP8.
uint8_t exponent_of(uint16_t x, ElementFormat) { return bf16_exponent(x); }
uint8_t exponent_of(uint8_t x, ElementFormat format) { return fp8_exponent(x, format); }

template <class Dump>
void check_same_geometry(const Dump& a, const Dump& b) {
  if (format_of(a) != format_of(b)) throw Error("the KV dumps have different element formats");
  if (a.layers.size() != b.layers.size() || a.kv_heads() != b.kv_heads() || a.head_dim() != b.head_dim()) {
    throw Error("the KV dumps have different geometries (layers, KV heads or head width)");
  }
}

/// Per-channel bases of one window width for every (kind, layer, head): [kind][(layer·heads + head)·head_dim + channel].
using Bases = std::array<std::vector<uint8_t>, 2>;

template <class Dump>
std::vector<Bases> choose_bases(std::span<const Dump* const> dumps, std::span<const int> window_bits) {
  const Dump& first = *dumps.front();
  const auto layers = static_cast<int>(first.layers.size());
  const int heads = first.kv_heads(), head_dim = first.head_dim();
  Calibrator calibrator(layers, heads, head_dim, format_of(first));
  for (const Dump* dump : dumps) calibrator.add_exponents(*dump);
  std::vector<Bases> bases(window_bits.size());
  for (size_t w = 0; w < window_bits.size(); ++w) {
    for (size_t k = 0; k < 2; ++k) {
      std::vector<uint8_t>& b = bases[w][k];
      for (int l = 0; l < layers; ++l) {
        for (int h = 0; h < heads; ++h) {
          for (int c = 0; c < head_dim; ++c) b.push_back(calibrator.window_base(kKinds[k], l, h, c, 1 << window_bits[w]));
        }
      }
    }
  }
  return bases;
}

template <class Dump>
std::vector<ModeSchemeResult> compare_schemes(std::span<const Dump* const> calibration, const Dump& evaluated,
                                              std::span<const ModeScheme> schemes) {
  if (calibration.empty()) throw Error("comparing mode schemes needs at least one calibration dump");
  check_same_geometry(*calibration.front(), evaluated);
  const ElementFormat format = format_of(evaluated);
  const int raw_bits = exponent_bits(format);
  std::vector<int> all_bits;
  for (const ModeScheme& s : schemes) {
    if (s.widths.empty() || !std::is_sorted(s.widths.begin(), s.widths.end()) || s.widths.front() < 1 || s.widths.back() >= raw_bits) {
      throw Error("mode scheme " + s.name + ": widths must be ascending, between 1 and " + std::to_string(raw_bits - 1) + " bits");
    }
    all_bits.insert(all_bits.end(), s.widths.begin(), s.widths.end());
  }
  std::sort(all_bits.begin(), all_bits.end());
  all_bits.erase(std::unique(all_bits.begin(), all_bits.end()), all_bits.end());
  const std::vector<Bases> bases = choose_bases<Dump>(calibration, all_bits);
  const auto window_index = [&](int bits) { return static_cast<size_t>(std::find(all_bits.begin(), all_bits.end(), bits) - all_bits.begin()); };

  // counts[s][i]: groups of scheme s coded with its i-th width (i == widths.size(): raw).
  std::vector<std::vector<uint64_t>> counts(schemes.size());
  for (size_t s = 0; s < schemes.size(); ++s) counts[s].assign(schemes[s].widths.size() + 1, 0);
  uint64_t groups = 0;
  const int head_dim = evaluated.head_dim(), heads = evaluated.kv_heads();
  for (size_t k = 0; k < 2; ++k) {
    const TileShape shape = tile_shape_for(kKinds[k], head_dim);
    for (size_t l = 0; l < evaluated.layers.size(); ++l) {
      const auto t = view_of(evaluated.layers[l].of(kKinds[k]));
      for (size_t tile = 0; tile < tile_count(t); ++tile) {
        const TilePosition p = tile_position(t, tile);
        const auto* origin = tile_origin(t, p);
        const size_t channel0 = (l * static_cast<size_t>(heads) + static_cast<size_t>(p.head)) * static_cast<size_t>(head_dim) +
                                static_cast<size_t>(p.half) * kMaxTileChannels;
        for (int lane = 0; lane < kWarpLanes; ++lane) {
          for (int g = 0; g < shape.groups_per_lane(); ++g) {
            uint8_t exponents[kGroupSize];
            size_t channels[kGroupSize];
            for (int e = 0; e < kGroupSize; ++e) {
              const ElementSlot slot = element_slot(shape, lane, 2 * g + e / kQuadSize, e % kQuadSize);
              exponents[e] = exponent_of(origin[static_cast<size_t>(slot.token) * t.token_stride + slot.channel], format);
              channels[e] = channel0 + slot.channel;
            }
            const auto fits = [&](int bits) {
              const std::vector<uint8_t>& b = bases[window_index(bits)][k];
              for (int e = 0; e < kGroupSize; ++e) {
                if (exponents[e] < b[channels[e]] || exponents[e] - b[channels[e]] >= (1 << bits)) return false;
              }
              return true;
            };
            for (size_t s = 0; s < schemes.size(); ++s) {
              const auto& widths = schemes[s].widths;
              size_t choice = widths.size();
              for (size_t i = 0; i < widths.size() && choice == widths.size(); ++i) {
                if (fits(widths[i])) choice = i;
              }
              ++counts[s][choice];
            }
            ++groups;
          }
        }
      }
    }
  }

  std::vector<ModeSchemeResult> results;
  for (size_t s = 0; s < schemes.size(); ++s) {
    ModeSchemeResult r{schemes[s], {}, 0, 0};
    double exponent_bits = 0;
    for (size_t i = 0; i < counts[s].size(); ++i) {
      const double fraction = groups == 0 ? 0.0 : static_cast<double>(counts[s][i]) / static_cast<double>(groups);
      r.fractions.push_back(fraction);
      exponent_bits += fraction * (i < schemes[s].widths.size() ? schemes[s].widths[i] : raw_bits);
    }
    r.bits_per_element = (mantissa_bits(format) + 1) + 2.0 / kGroupSize + exponent_bits;
    r.ratio = 8.0 * element_bytes(format) / r.bits_per_element;
    results.push_back(std::move(r));
  }
  return results;
}

/// The largest-capacity codecs of a table, so every tile's escape size is exact.
CalibratedCodecs measuring_codecs(const KvDump&, const CalibrationTable& table) {
  return CalibratedCodecs(table, tile_shape_for(TensorKind::key, table.head_dim()).max_slot_capacity());
}
Fp8CalibratedCodecs measuring_codecs(const Fp8KvDump& dump, const CalibrationTable& table) {
  return Fp8CalibratedCodecs(table, Fp8TileShape{dump.format, tile_shape_for(TensorKind::key, table.head_dim())}.max_slot_capacity());
}

template <class Dump>
std::vector<SegmentEscapes> escapes_by_segment(const Dump& dump, const CalibrationTable& table, int segment_tokens) {
  if (segment_tokens <= 0 || segment_tokens % kTileTokens != 0) {
    throw Error("the segment length must be a positive multiple of " + std::to_string(kTileTokens) + " tokens");
  }
  table.check_matches(dump);
  const int heads = dump.kv_heads(), tokens = dump.layers.empty() ? 0 : dump.layers[0].k.tokens;
  const int blocks_per_segment = segment_tokens / kTileTokens;
  const int segments = (full_blocks(tokens) + blocks_per_segment - 1) / blocks_per_segment;
  const size_t series = dump.layers.size() * static_cast<size_t>(heads);
  std::vector<SegmentEscapes> out(static_cast<size_t>(segments));
  std::vector<std::array<std::vector<uint64_t>, 2>> tiles(out.size());
  for (int s = 0; s < segments; ++s) {
    out[static_cast<size_t>(s)].first_token = s * segment_tokens;
    out[static_cast<size_t>(s)].end_token = std::min((s + 1) * segment_tokens, full_blocks(tokens) * kTileTokens);
    for (size_t k = 0; k < 2; ++k) {
      out[static_cast<size_t>(s)].mean_escape_bytes[k].assign(series, 0.0);
      tiles[static_cast<size_t>(s)][k].assign(series, 0);
    }
  }
  // The largest capacity makes every tile's escape size exact, whatever the table's capacity.
  const auto measuring = measuring_codecs(dump, table);
  for (size_t k = 0; k < 2; ++k) {
    for (size_t l = 0; l < dump.layers.size(); ++l) {
      const auto layer = static_cast<int>(l);
      encode_each_tile(view_of(dump.layers[l].of(kKinds[k])), measuring.tensor_codecs(kKinds[k], layer),
                       [&](size_t, TilePosition p, const TileEncoding& e, auto) {
                         const auto segment = static_cast<size_t>(p.block / blocks_per_segment);
                         const size_t index = l * static_cast<size_t>(heads) + static_cast<size_t>(p.head);
                         out[segment].mean_escape_bytes[k][index] += e.escape_bytes;
                         ++tiles[segment][k][index];
                       });
    }
  }
  for (size_t s = 0; s < out.size(); ++s) {
    for (size_t k = 0; k < 2; ++k) {
      for (size_t i = 0; i < series; ++i) {
        if (tiles[s][k][i] != 0) out[s].mean_escape_bytes[k][i] /= static_cast<double>(tiles[s][k][i]);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<ModeScheme> paper_mode_schemes() {
  return {{"2+3+4+raw", {2, 3, 4}}, {"3+4+raw", {3, 4}}, {"4+raw", {4}}};
}

std::vector<ModeScheme> fp8_mode_schemes(ElementFormat format) {
  if (format == ElementFormat::e4m3) return {{"3+raw", {3}}, {"2+3+raw", {2, 3}}, {"1+2+3+raw", {1, 2, 3}}, {"2+raw", {2}}};
  if (format == ElementFormat::e5m2) {
    return {{"3+raw", {3}}, {"2+3+raw", {2, 3}}, {"3+4+raw", {3, 4}}, {"2+3+4+raw", {2, 3, 4}}, {"2+4+raw", {2, 4}}};
  }
  throw Error("FP8 mode schemes need E4M3 or E5M2");
}

std::vector<ModeSchemeResult> compare_mode_schemes(std::span<const KvDump* const> calibration, const KvDump& evaluated,
                                                   std::span<const ModeScheme> schemes) {
  return compare_schemes(calibration, evaluated, schemes);
}

std::vector<ModeSchemeResult> compare_mode_schemes(std::span<const Fp8KvDump* const> calibration, const Fp8KvDump& evaluated,
                                                   std::span<const ModeScheme> schemes) {
  return compare_schemes(calibration, evaluated, schemes);
}

std::vector<SegmentEscapes> escape_bytes_by_segment(const KvDump& dump, const CalibrationTable& table, int segment_tokens) {
  return escapes_by_segment(dump, table, segment_tokens);
}

std::vector<SegmentEscapes> escape_bytes_by_segment(const Fp8KvDump& dump, const CalibrationTable& table, int segment_tokens) {
  return escapes_by_segment(dump, table, segment_tokens);
}

}  // namespace gaac
