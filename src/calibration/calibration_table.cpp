#include <nlohmann/json.hpp>

#include <array>
#include <string>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/tiling.hpp"
#include "io/safetensors.hpp"

namespace gaac {
namespace {

constexpr const char* kFormatName = "gaac-calibration";
constexpr const char* kKindPrefix[2] = {"k", "v"};

void check_geometry(int layers, int kv_heads, int head_dim) {
  if (layers < 1 || layers > 100000 || kv_heads < 1 || kv_heads > 4096) {
    throw Error("calibration geometry out of range: " + std::to_string(layers) + " layers, " +
                std::to_string(kv_heads) + " KV heads");
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    throw Error("head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  }
}

std::string capacities_json(const CalibrationTable& table, TensorKind kind) {
  nlohmann::json list = nlohmann::json::array();
  for (int l = 0; l < table.layers(); ++l) list.push_back(table.escape_capacity(kind, l));
  return list.dump();
}

/// The window names of a format's table: {narrow, wide}.
std::array<const char*, 2> window_names(ElementFormat format) {
  return is_fp8(format) ? std::array<const char*, 2>{".b2", ".b3"} : std::array<const char*, 2>{".b3", ".b4"};
}

/// Largest escape capacity of a (kind)'s tiles in a table of this format and head width.
size_t max_capacity(ElementFormat format, TensorKind kind, int head_dim) {
  const TileShape shape = tile_shape_for(kind, head_dim);
  return is_fp8(format) ? Fp8TileShape{format, shape}.max_slot_capacity() : shape.max_slot_capacity();
}

/// The format a table's metadata names (BF16 when it names none).
ElementFormat table_format(const io::SafetensorsFile& file) {
  const auto it = file.metadata().find("element_format");
  if (it == file.metadata().end()) return ElementFormat::bf16;
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    if (it->second == to_string(f)) return f;
  }
  throw Error(file.label() + ": calibration metadata 'element_format' is '" + it->second + "', not e4m3 or e5m2");
}

int metadata_int(const io::SafetensorsFile& file, const std::string& key) {
  const auto it = file.metadata().find(key);
  if (it == file.metadata().end()) throw Error(file.label() + ": calibration metadata lacks '" + key + "'");
  try {
    size_t used = 0;
    const int value = std::stoi(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing characters");
    return value;
  } catch (const std::exception&) {
    throw Error(file.label() + ": calibration metadata '" + key + "' is not an integer: " + it->second);
  }
}

}  // namespace

CalibrationTable::CalibrationTable(int layers, int kv_heads, int head_dim, ElementFormat format)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), format_(format) {
  check_geometry(layers, kv_heads, head_dim);
  if (format != ElementFormat::bf16 && !is_fp8(format)) throw Error("calibration element format is not bf16, e4m3 or e5m2");
  per_kind_ = static_cast<size_t>(layers) * kv_heads * head_dim;
  for (size_t k = 0; k < 2; ++k) {
    narrow_[k].assign(per_kind_, 0);
    wide_[k].assign(per_kind_, 0);
    capacity_[k].assign(static_cast<size_t>(layers), 0);
  }
}

size_t CalibrationTable::offset(int layer, int head) const {
  if (layer < 0 || layer >= layers_ || head < 0 || head >= kv_heads_) {
    throw Error("calibration lookup out of range: layer " + std::to_string(layer) + ", head " + std::to_string(head));
  }
  return (static_cast<size_t>(layer) * kv_heads_ + head) * head_dim_;
}

void CalibrationTable::require_format(bool fp8, const char* what) const {
  if (is_fp8(format_) != fp8) {
    throw Error(std::string(what) + " of a calibration table for " + to_string(format_) + " elements; it needs " +
                (fp8 ? "an FP8 table" : "a BF16 table"));
  }
}

std::span<uint8_t> CalibrationTable::narrow(TensorKind kind, int layer, int head) {
  return std::span(narrow_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<const uint8_t> CalibrationTable::narrow(TensorKind kind, int layer, int head) const {
  return std::span(narrow_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<uint8_t> CalibrationTable::wide(TensorKind kind, int layer, int head) {
  return std::span(wide_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<const uint8_t> CalibrationTable::wide(TensorKind kind, int layer, int head) const {
  return std::span(wide_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}

std::span<uint8_t> CalibrationTable::b3(TensorKind kind, int layer, int head) {
  require_format(false, "BF16 bases b3");
  return narrow(kind, layer, head);
}
std::span<const uint8_t> CalibrationTable::b3(TensorKind kind, int layer, int head) const {
  require_format(false, "BF16 bases b3");
  return narrow(kind, layer, head);
}
std::span<uint8_t> CalibrationTable::b4(TensorKind kind, int layer, int head) {
  require_format(false, "BF16 bases b4");
  return wide(kind, layer, head);
}
std::span<const uint8_t> CalibrationTable::b4(TensorKind kind, int layer, int head) const {
  require_format(false, "BF16 bases b4");
  return wide(kind, layer, head);
}

TileBases CalibrationTable::tile_bases(TensorKind kind, int layer, int head, int half) const {
  require_format(false, "BF16 tile bases");
  const TileShape shape = tile_shape_for(kind, head_dim_);
  const auto from = static_cast<size_t>(half) * static_cast<size_t>(shape.channels);
  const auto width = static_cast<size_t>(shape.channels);
  return {narrow(kind, layer, head).subspan(from, width), wide(kind, layer, head).subspan(from, width)};
}

Fp8TileBases CalibrationTable::fp8_tile_bases(TensorKind kind, int layer, int head, int half) const {
  require_format(true, "FP8 tile bases");
  const TileShape shape = tile_shape_for(kind, head_dim_);
  const auto from = static_cast<size_t>(half) * static_cast<size_t>(shape.channels);
  const auto width = static_cast<size_t>(shape.channels);
  return {narrow(kind, layer, head).subspan(from, width), wide(kind, layer, head).subspan(from, width)};
}

void CalibrationTable::set_escape_capacity(TensorKind kind, int layer, size_t bytes) {
  const size_t max = max_capacity(format_, kind, head_dim_);
  if (layer < 0 || layer >= layers_) throw Error("no layer " + std::to_string(layer) + " in the calibration table");
  if (bytes % kSlotAlignment != 0 || bytes > max) {
    throw Error("escape capacity " + std::to_string(bytes) + " is not a multiple of 16 in [0, " + std::to_string(max) + "]");
  }
  capacity_[index(kind)][static_cast<size_t>(layer)] = bytes;
}

void CalibrationTable::validate() const {
  check_geometry(layers_, kv_heads_, head_dim_);
  const int max_narrow = is_fp8(format_) ? fp8_max_base2(format_) : kMaxBase3;
  const int max_wide = is_fp8(format_) ? fp8_max_base3(format_) : kMaxBase4;
  for (size_t k = 0; k < 2; ++k) {
    for (size_t i = 0; i < per_kind_; ++i) {
      if (narrow_[k][i] > max_narrow || wide_[k][i] > max_wide) {
        throw Error(std::string("calibration base out of range in ") + kKindPrefix[k] + " at index " + std::to_string(i));
      }
    }
    const size_t max = max_capacity(format_, k == 0 ? TensorKind::key : TensorKind::value, head_dim_);
    for (size_t c : capacity_[k]) {
      if (c % kSlotAlignment != 0 || c > max) {
        throw Error("calibration escape capacity " + std::to_string(c) + " is invalid");
      }
    }
  }
}

void CalibrationTable::check_geometry_matches(size_t layers, int kv_heads, int head_dim) const {
  if (static_cast<int>(layers) != layers_ || kv_heads != kv_heads_ || head_dim != head_dim_) {
    throw Error("calibration is for " + std::to_string(layers_) + " layers × " + std::to_string(kv_heads_) +
                " KV heads × head_dim " + std::to_string(head_dim_) + ", the KV dump has " + std::to_string(layers) +
                " × " + std::to_string(kv_heads) + " × " + std::to_string(head_dim));
  }
}

void CalibrationTable::check_matches(const KvDump& dump) const {
  if (format_ != ElementFormat::bf16) {
    throw Error(std::string("calibration is for ") + to_string(format_) + " elements, the KV dump is BF16");
  }
  check_geometry_matches(dump.layers.size(), dump.kv_heads(), dump.head_dim());
}

void CalibrationTable::check_matches(const Fp8KvDump& dump) const {
  if (format_ != dump.format) {
    throw Error(std::string("calibration is for ") + to_string(format_) + " elements, the KV dump is " + to_string(dump.format));
  }
  check_geometry_matches(dump.layers.size(), dump.kv_heads(), dump.head_dim());
}

void save_calibration(const CalibrationTable& table, const std::string& path, std::span<const std::string> inputs) {
  table.validate();
  io::SafetensorsWriter writer;
  const std::vector<int64_t> shape{table.layers(), table.kv_heads(), table.head_dim()};
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const std::string prefix = kKindPrefix[kind == TensorKind::key ? 0 : 1];
    std::vector<uint8_t> narrow, wide;
    for (int l = 0; l < table.layers(); ++l) {
      for (int h = 0; h < table.kv_heads(); ++h) {
        const auto n = table.narrow(kind, l, h);
        const auto w = table.wide(kind, l, h);
        narrow.insert(narrow.end(), n.begin(), n.end());
        wide.insert(wide.end(), w.begin(), w.end());
      }
    }
    const auto names = window_names(table.element_format());
    writer.add(prefix + names[0], io::Dtype::u8, shape, narrow);
    writer.add(prefix + names[1], io::Dtype::u8, shape, wide);
    writer.set_metadata(prefix + ".escape_capacity", capacities_json(table, kind));
  }
  for (const auto& [key, value] : table.metadata()) writer.set_metadata("info." + key, value);
  writer.set_metadata("format", kFormatName);
  writer.set_metadata("format_version", "1");
  const bool fp8 = is_fp8(table.element_format());
  writer.set_metadata("tile_format_version", std::to_string(fp8 ? kFp8TileFormatVersion : kTileFormatVersion));
  if (fp8) writer.set_metadata("element_format", to_string(table.element_format()));
  writer.set_metadata("layers", std::to_string(table.layers()));
  writer.set_metadata("kv_heads", std::to_string(table.kv_heads()));
  writer.set_metadata("head_dim", std::to_string(table.head_dim()));
  writer.write(path, inputs);
}

CalibrationTable load_calibration(const std::string& path) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const auto kind_of_file = file.metadata().find("format");
  if (kind_of_file == file.metadata().end() || kind_of_file->second != kFormatName) {
    throw Error(path + ": not a gaac calibration table (metadata 'format' is not '" + kFormatName + "')");
  }
  if (metadata_int(file, "format_version") != 1) throw Error(path + ": calibration table format version is not 1");
  const ElementFormat format = table_format(file);
  const uint32_t tile_version = is_fp8(format) ? kFp8TileFormatVersion : kTileFormatVersion;
  if (metadata_int(file, "tile_format_version") != static_cast<int>(tile_version)) {
    throw Error(path + ": calibration made for another tile format version");
  }
  CalibrationTable table(metadata_int(file, "layers"), metadata_int(file, "kv_heads"), metadata_int(file, "head_dim"), format);
  const auto per_head = static_cast<size_t>(table.head_dim());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const std::string prefix = kKindPrefix[kind == TensorKind::key ? 0 : 1];
    const auto names = window_names(format);
    for (size_t w = 0; w < 2; ++w) {
      const std::string name = prefix + names[w];
      const io::TensorView* t = file.find(name);
      const std::vector<int64_t> want{table.layers(), table.kv_heads(), table.head_dim()};
      if (!t || t->dtype != io::Dtype::u8 || t->shape != want) {
        throw Error(path + ": tensor '" + name + "' missing, or not U8 [layers, kv_heads, head_dim]");
      }
      for (int l = 0; l < table.layers(); ++l) {
        for (int h = 0; h < table.kv_heads(); ++h) {
          auto dst = w == 0 ? table.narrow(kind, l, h) : table.wide(kind, l, h);
          const size_t from = (static_cast<size_t>(l) * table.kv_heads() + h) * per_head;
          std::copy_n(t->bytes.begin() + static_cast<std::ptrdiff_t>(from), per_head, dst.begin());
        }
      }
    }
    const auto caps = file.metadata().find(prefix + ".escape_capacity");
    if (caps == file.metadata().end()) throw Error(path + ": metadata lacks '" + prefix + ".escape_capacity'");
    const nlohmann::json list = nlohmann::json::parse(caps->second, nullptr, false);
    if (!list.is_array() || list.size() != static_cast<size_t>(table.layers())) {
      throw Error(path + ": '" + prefix + ".escape_capacity' is not a list of one capacity per layer");
    }
    for (int l = 0; l < table.layers(); ++l) {
      const auto& v = list[static_cast<size_t>(l)];
      if (!v.is_number_unsigned()) throw Error(path + ": escape capacity of layer " + std::to_string(l) + " is not a count");
      try {
        table.set_escape_capacity(kind, l, v.get<size_t>());
      } catch (const Error& e) {
        throw e.with_context(path);
      }
    }
  }
  for (const auto& [key, value] : file.metadata()) {
    if (key.rfind("info.", 0) == 0) table.metadata()[key.substr(5)] = value;
  }
  try {
    table.validate();
  } catch (const Error& e) {
    throw e.with_context(path);
  }
  return table;
}

}  // namespace gaac
