#include <nlohmann/json.hpp>
#include <string>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
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

CalibrationTable::CalibrationTable(int layers, int kv_heads, int head_dim)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim) {
  check_geometry(layers, kv_heads, head_dim);
  per_kind_ = static_cast<size_t>(layers) * kv_heads * head_dim;
  for (size_t k = 0; k < 2; ++k) {
    b3_[k].assign(per_kind_, 0);
    b4_[k].assign(per_kind_, 0);
    capacity_[k].assign(static_cast<size_t>(layers), 0);
  }
}

size_t CalibrationTable::offset(int layer, int head) const {
  if (layer < 0 || layer >= layers_ || head < 0 || head >= kv_heads_) {
    throw Error("calibration lookup out of range: layer " + std::to_string(layer) + ", head " + std::to_string(head));
  }
  return (static_cast<size_t>(layer) * kv_heads_ + head) * head_dim_;
}

std::span<uint8_t> CalibrationTable::b3(TensorKind kind, int layer, int head) {
  return std::span(b3_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<const uint8_t> CalibrationTable::b3(TensorKind kind, int layer, int head) const {
  return std::span(b3_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<uint8_t> CalibrationTable::b4(TensorKind kind, int layer, int head) {
  return std::span(b4_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}
std::span<const uint8_t> CalibrationTable::b4(TensorKind kind, int layer, int head) const {
  return std::span(b4_[index(kind)]).subspan(offset(layer, head), static_cast<size_t>(head_dim_));
}

TileBases CalibrationTable::tile_bases(TensorKind kind, int layer, int head, int half) const {
  const TileShape shape = tile_shape_for(kind, head_dim_);
  const auto from = static_cast<size_t>(half) * static_cast<size_t>(shape.channels);
  const auto width = static_cast<size_t>(shape.channels);
  return {b3(kind, layer, head).subspan(from, width), b4(kind, layer, head).subspan(from, width)};
}

void CalibrationTable::set_escape_capacity(TensorKind kind, int layer, size_t bytes) {
  const TileShape shape = tile_shape_for(kind, head_dim_);
  if (layer < 0 || layer >= layers_) throw Error("no layer " + std::to_string(layer) + " in the calibration table");
  if (bytes % kSlotAlignment != 0 || bytes > shape.max_slot_capacity()) {
    throw Error("escape capacity " + std::to_string(bytes) + " is not a multiple of 16 in [0, " +
                std::to_string(shape.max_slot_capacity()) + "]");
  }
  capacity_[index(kind)][static_cast<size_t>(layer)] = bytes;
}

void CalibrationTable::validate() const {
  check_geometry(layers_, kv_heads_, head_dim_);
  for (size_t k = 0; k < 2; ++k) {
    for (size_t i = 0; i < per_kind_; ++i) {
      if (b3_[k][i] > kMaxBase3 || b4_[k][i] > kMaxBase4) {
        throw Error(std::string("calibration base out of range in ") + kKindPrefix[k] + " at index " + std::to_string(i));
      }
    }
    const TileShape shape = tile_shape_for(k == 0 ? TensorKind::key : TensorKind::value, head_dim_);
    for (size_t c : capacity_[k]) {
      if (c % kSlotAlignment != 0 || c > shape.max_slot_capacity()) {
        throw Error("calibration escape capacity " + std::to_string(c) + " is invalid");
      }
    }
  }
}

void CalibrationTable::check_matches(const KvDump& dump) const {
  if (static_cast<int>(dump.layers.size()) != layers_ || dump.kv_heads() != kv_heads_ || dump.head_dim() != head_dim_) {
    throw Error("calibration is for " + std::to_string(layers_) + " layers × " + std::to_string(kv_heads_) +
                " KV heads × head_dim " + std::to_string(head_dim_) + ", the KV dump has " +
                std::to_string(dump.layers.size()) + " × " + std::to_string(dump.kv_heads()) + " × " +
                std::to_string(dump.head_dim()));
  }
}

void save_calibration(const CalibrationTable& table, const std::string& path, std::span<const std::string> inputs) {
  table.validate();
  io::SafetensorsWriter writer;
  const std::vector<int64_t> shape{table.layers(), table.kv_heads(), table.head_dim()};
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const std::string prefix = kKindPrefix[kind == TensorKind::key ? 0 : 1];
    std::vector<uint8_t> b3, b4;
    for (int l = 0; l < table.layers(); ++l) {
      for (int h = 0; h < table.kv_heads(); ++h) {
        const auto s3 = table.b3(kind, l, h);
        const auto s4 = table.b4(kind, l, h);
        b3.insert(b3.end(), s3.begin(), s3.end());
        b4.insert(b4.end(), s4.begin(), s4.end());
      }
    }
    writer.add(prefix + ".b3", io::Dtype::u8, shape, b3);
    writer.add(prefix + ".b4", io::Dtype::u8, shape, b4);
    writer.set_metadata(prefix + ".escape_capacity", capacities_json(table, kind));
  }
  for (const auto& [key, value] : table.metadata()) writer.set_metadata("info." + key, value);
  writer.set_metadata("format", kFormatName);
  writer.set_metadata("format_version", "1");
  writer.set_metadata("tile_format_version", std::to_string(kTileFormatVersion));
  writer.set_metadata("layers", std::to_string(table.layers()));
  writer.set_metadata("kv_heads", std::to_string(table.kv_heads()));
  writer.set_metadata("head_dim", std::to_string(table.head_dim()));
  writer.write(path, inputs);
}

CalibrationTable load_calibration(const std::string& path) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const auto format = file.metadata().find("format");
  if (format == file.metadata().end() || format->second != kFormatName) {
    throw Error(path + ": not a gaac calibration table (metadata 'format' is not '" + kFormatName + "')");
  }
  if (metadata_int(file, "format_version") != 1) throw Error(path + ": calibration table format version is not 1");
  if (metadata_int(file, "tile_format_version") != static_cast<int>(kTileFormatVersion)) {
    throw Error(path + ": calibration made for another tile format version");
  }
  CalibrationTable table(metadata_int(file, "layers"), metadata_int(file, "kv_heads"), metadata_int(file, "head_dim"));
  const auto per_head = static_cast<size_t>(table.head_dim());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const std::string prefix = kKindPrefix[kind == TensorKind::key ? 0 : 1];
    for (const char* window : {".b3", ".b4"}) {
      const std::string name = prefix + window;
      const io::TensorView* t = file.find(name);
      const std::vector<int64_t> want{table.layers(), table.kv_heads(), table.head_dim()};
      if (!t || t->dtype != io::Dtype::u8 || t->shape != want) {
        throw Error(path + ": tensor '" + name + "' missing, or not U8 [layers, kv_heads, head_dim]");
      }
      for (int l = 0; l < table.layers(); ++l) {
        for (int h = 0; h < table.kv_heads(); ++h) {
          auto dst = window[2] == '3' ? table.b3(kind, l, h) : table.b4(kind, l, h);
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
