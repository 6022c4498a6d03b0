// The .gaac snapshot container: header, section table, metadata, calibration and one section per
// (layer, K/V). Every read is bounds-checked against the image before it happens.
#include "gaac/snapshot.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "gaac/error.hpp"
#include "gaac/tile_codec.hpp"
#include "io/calibration_section.hpp"
#include "io/container.hpp"
#include "io/files.hpp"

namespace gaac {

namespace io {

std::vector<uint8_t> calibration_section(const CalibrationTable& c) {
  std::vector<uint8_t> out;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int window = 0; window < 2; ++window) {
      for (int l = 0; l < c.layers(); ++l) {
        for (int h = 0; h < c.kv_heads(); ++h) {
          const auto bases = window == 0 ? c.b3(kind, l, h) : c.b4(kind, l, h);
          out.insert(out.end(), bases.begin(), bases.end());
        }
      }
    }
  }
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < c.layers(); ++l) {
      const auto capacity = static_cast<uint16_t>(c.escape_capacity(kind, l));
      out.push_back(static_cast<uint8_t>(capacity));
      out.push_back(static_cast<uint8_t>(capacity >> 8));
    }
  }
  return out;
}

}  // namespace io

namespace {

using io::ContainerReader;
using io::get_le;
using io::kMetadataSection;
using io::kCalibrationSection;
using io::kTensorSection;
using io::SectionRef;
using Reader = ContainerReader;
constexpr uint8_t kStoredSlot = 0;
constexpr uint8_t kStoredRaw = 1;
// Geometry limits a reader accepts: far beyond any model, small enough that sizes cannot overflow.
constexpr int64_t kMaxLayers = 100000;
constexpr int64_t kMaxKvHeads = 4096;
constexpr int64_t kMaxTokens = int64_t{1} << 31;

const char* kind_name(TensorKind kind) { return kind == TensorKind::key ? "K" : "V"; }

void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bf16(std::vector<uint8_t>& out, const uint16_t* x, size_t n) {
  for (size_t i = 0; i < n; ++i) put_u16(out, x[i]);
}
void pad_to(std::vector<uint8_t>& out, size_t alignment) {
  out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
}

struct Section {
  uint32_t type;
  uint32_t index;
  std::vector<uint8_t> bytes;
};

/// Bytes of the storage map of a tensor section: one byte per tile, padded to 16.
size_t storage_map_bytes(size_t tiles) { return (tiles + 15) / 16 * 16; }

std::vector<uint8_t> metadata_section(const KvDump& dump, const CalibrationTable& calibration) {
  nlohmann::json meta;
  meta["format"] = "gaac-snapshot";
  meta["layers"] = dump.layers.size();
  meta["kv_heads"] = dump.kv_heads();
  meta["head_dim"] = dump.head_dim();
  nlohmann::json tokens = nlohmann::json::array();
  for (const KvLayer& l : dump.layers) tokens.push_back(l.k.tokens);
  meta["tokens"] = tokens;
  nlohmann::json dump_meta = nlohmann::json::array();
  for (const auto& [k, v] : dump.metadata) dump_meta.push_back({k, v});
  meta["dump_metadata"] = dump_meta;
  meta["calibration_metadata"] = calibration.metadata();
  const std::string text = meta.dump();
  return {text.begin(), text.end()};
}

std::vector<uint8_t> tensor_section(const KvTensor& tensor, std::span<const TileCodec> codecs) {
  const KvView t = view_of(tensor);
  std::vector<uint8_t> out(storage_map_bytes(tile_count(t)), 0);
  encode_each_tile(t, codecs, [&](size_t i, TilePosition p, const TileEncoding& enc, std::span<const uint8_t> slot) {
    if (enc.fits) {
      out.insert(out.end(), slot.begin(), slot.end());
    } else {
      out[i] = kStoredRaw;
      const uint16_t* origin = tile_origin(t, p);
      for (int row = 0; row < kTileTokens; ++row) {
        put_bf16(out, origin + static_cast<size_t>(row) * t.token_stride, static_cast<size_t>(codecs[0].shape().channels));
      }
    }
  });
  const size_t tail_from = static_cast<size_t>(full_blocks(t.tokens)) * kTileTokens * t.token_stride;
  put_bf16(out, tensor.data.data() + tail_from, tensor.data.size() - tail_from);
  return out;
}

std::vector<Section> build_sections(const KvDump& dump, const CalibrationTable& calibration,
                                    const TensorSectionEncoder& encode, const Progress& progress) {
  validate_dump(dump);
  calibration.validate();
  calibration.check_matches(dump);
  std::vector<Section> sections;
  sections.push_back({kMetadataSection, 0, metadata_section(dump, calibration)});
  sections.push_back({kCalibrationSection, 0, io::calibration_section(calibration)});
  for (size_t l = 0; l < dump.layers.size(); ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      sections.push_back({kTensorSection, static_cast<uint32_t>(2 * l + (kind == TensorKind::key ? 0 : 1)),
                          encode(static_cast<int>(l), kind)});
    }
    if (progress) progress(l + 1, dump.layers.size());
  }
  return sections;
}

/// Header and section table for sections laid out one after another, each 64-byte aligned.
std::vector<uint8_t> header_for(const std::vector<Section>& sections) {
  std::vector<io::SectionEntry> entries;
  uint64_t offset = io::first_section_offset(sections.size());
  for (const Section& s : sections) {
    entries.push_back({s.type, s.index, offset, s.bytes.size(), io::section_checksum(s.bytes, io::kWholeChecksumContainer)});
    offset += io::align_section(s.bytes.size());
  }
  std::vector<uint8_t> header(io::first_section_offset(sections.size()));
  io::write_container_header(kSnapshotVersion, entries, offset, header.data());
  return header;
}

int64_t json_int(const Reader& r, const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) r.fail(std::string("metadata field '") + key + "' missing or not an integer");
  const auto v = it->get<int64_t>();
  if (v < lo || v > hi) r.fail(std::string("metadata field '") + key + "' = " + std::to_string(v) + " out of range");
  return v;
}

/// What the metadata section says: the dump's shape (tensors without data) and provenance.
struct Metadata {
  KvDump dump;
  std::map<std::string, std::string> calibration_metadata;
};

Metadata read_metadata(const Reader& r, std::span<const uint8_t> bytes) {
  const auto meta = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  const auto format = meta.is_object() ? meta.find("format") : meta.end();
  if (!meta.is_object() || format == meta.end() || !format->is_string() || *format != "gaac-snapshot") {
    r.fail("metadata section is not gaac-snapshot JSON");
  }
  const auto layers = json_int(r, meta, "layers", 1, kMaxLayers);
  const auto heads = json_int(r, meta, "kv_heads", 1, kMaxKvHeads);
  const auto head_dim = json_int(r, meta, "head_dim", 64, 256);
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) r.fail("head_dim must be 64, 128 or 256");
  const auto tokens = meta.find("tokens");
  if (tokens == meta.end() || !tokens->is_array() || tokens->size() != static_cast<size_t>(layers)) {
    r.fail("metadata 'tokens' is not a list of one count per layer");
  }
  Metadata out;
  for (const auto& t : *tokens) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() >= static_cast<uint64_t>(kMaxTokens)) r.fail("bad token count in metadata");
    KvTensor shape{static_cast<int>(t.get<uint64_t>()), static_cast<int>(heads), static_cast<int>(head_dim), {}};
    out.dump.layers.push_back({shape, shape});
  }
  if (const auto m = meta.find("dump_metadata"); m != meta.end() && m->is_array()) {
    for (const auto& kv : *m) {
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) r.fail("bad dump_metadata entry");
      out.dump.metadata.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    }
  }
  if (const auto m = meta.find("calibration_metadata"); m != meta.end() && m->is_object()) {
    for (const auto& [k, v] : m->items()) {
      if (!v.is_string()) r.fail("bad calibration_metadata entry");
      out.calibration_metadata[k] = v.get<std::string>();
    }
  }
  return out;
}

/// Reads the calibration section of a dump with the given geometry. The section's size is checked
/// before the table is allocated, so hostile geometry in the metadata cannot force a large allocation.
CalibrationTable read_calibration(const Reader& r, std::span<const uint8_t> bytes, const KvDump& geometry) {
  const auto layers = static_cast<uint64_t>(geometry.layers.size());
  const uint64_t per_window = layers * static_cast<uint64_t>(geometry.kv_heads()) * static_cast<uint64_t>(geometry.head_dim());
  if (bytes.size() != 4 * per_window + 4 * layers) r.fail("calibration section has the wrong size");
  CalibrationTable c(static_cast<int>(layers), geometry.kv_heads(), geometry.head_dim());
  size_t at = 0;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int window = 0; window < 2; ++window) {
      for (int l = 0; l < c.layers(); ++l) {
        for (int h = 0; h < c.kv_heads(); ++h) {
          auto dst = window == 0 ? c.b3(kind, l, h) : c.b4(kind, l, h);
          std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), dst.size(), dst.begin());
          at += dst.size();
        }
      }
    }
  }
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < c.layers(); ++l, at += 2) {
      try {
        c.set_escape_capacity(kind, l, get_le(&bytes[at], 2));
      } catch (const Error& e) {
        r.fail(std::string("calibration of layer ") + std::to_string(l) + " " + kind_name(kind) + ": " + e.what());
      }
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    r.fail(e.what());
  }
  return c;
}

void read_tensor(const Reader& r, std::span<const uint8_t> bytes, KvTensor& t, TensorKind kind, int layer,
                 const CalibratedCodecs& codecs) {
  const std::string where = "layer " + std::to_string(layer) + " " + kind_name(kind);
  const TileShape shape = tile_shape_for(kind, t.head_dim);
  const std::span<const TileCodec> tensor_codecs = codecs.tensor_codecs(kind, layer);
  const size_t capacity = tensor_codecs.front().escape_capacity();
  const size_t tiles = tile_count(view_of(t));
  const size_t map_bytes = storage_map_bytes(tiles);
  if (bytes.size() < map_bytes) r.fail(where + ": section shorter than its storage map");
  size_t raw_tiles = 0;
  for (size_t i = 0; i < tiles; ++i) {
    if (bytes[i] > kStoredRaw) r.fail(where + ": tile " + std::to_string(i) + " has unknown storage kind");
    raw_tiles += bytes[i];
  }
  for (size_t i = tiles; i < map_bytes; ++i) {
    if (bytes[i] != 0) r.fail(where + ": storage map padding is not zero");
  }
  const size_t tail_elements = t.elements() - tiles * static_cast<size_t>(shape.elements());
  const size_t expected = map_bytes + (tiles - raw_tiles) * shape.slot_bytes(capacity) + raw_tiles * shape.raw_bytes() +
                          2 * tail_elements;
  if (bytes.size() != expected) {
    r.fail(where + ": section is " + std::to_string(bytes.size()) + " bytes, its tiles need " + std::to_string(expected));
  }
  t.data.assign(t.elements(), 0);  // only now: the size check bounds the allocation by the file size
  const MutableKvView view = mutable_view_of(t);
  const int halves = tiles_per_head(t.head_dim);
  size_t at = map_bytes;
  for (size_t i = 0; i < tiles; ++i) {
    const TilePosition p = tile_position(view, i);
    uint16_t* origin = tile_origin(view, p);
    if (bytes[i] == kStoredSlot) {
      const auto slot = bytes.subspan(at, shape.slot_bytes(capacity));
      const DecodeStatus status = tensor_codecs[static_cast<size_t>(p.head * halves + p.half)]
                                      .decode_blocks(slot.data(), 0, 1, origin, view.token_stride, 0)
                                      .status;
      if (status != DecodeStatus::ok) {
        r.fail(where + ": tile " + std::to_string(i) + " (block " + std::to_string(p.block) + ", head " +
               std::to_string(p.head) + "): " + to_string(status));
      }
      at += slot.size();
    } else {
      for (int row = 0; row < kTileTokens; ++row) {
        for (int ch = 0; ch < shape.channels; ++ch, at += 2) {
          origin[static_cast<size_t>(row) * view.token_stride + ch] = static_cast<uint16_t>(get_le(&bytes[at], 2));
        }
      }
    }
  }
  const size_t tail_from = t.elements() - tail_elements;
  for (size_t i = 0; i < tail_elements; ++i, at += 2) t.data[tail_from + i] = static_cast<uint16_t>(get_le(&bytes[at], 2));
}

}  // namespace

std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration, const Progress& progress) {
  std::optional<CalibratedCodecs> codecs;  // made once the calibration has been checked against the dump
  const TensorSectionEncoder encode = [&](int layer, TensorKind kind) {
    if (!codecs) codecs.emplace(calibration);
    return tensor_section(dump.layers[static_cast<size_t>(layer)].of(kind), codecs->tensor_codecs(kind, layer));
  };
  return snapshot_image(dump, calibration, encode, progress);
}

std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration,
                                    const TensorSectionEncoder& encode, const Progress& progress) {
  const std::vector<Section> sections = build_sections(dump, calibration, encode, progress);
  std::vector<uint8_t> image = header_for(sections);
  for (const Section& s : sections) {
    image.insert(image.end(), s.bytes.begin(), s.bytes.end());
    pad_to(image, io::kSectionAlignment);
  }
  return image;
}

void write_snapshot(const KvDump& dump, const CalibrationTable& calibration, const std::string& path,
                    const Progress& progress) {
  const std::vector<uint8_t> image = snapshot_image(dump, calibration, progress);
  const std::span<const uint8_t> parts[] = {image};
  io::write_file_atomic(path, parts);
}

Snapshot parse_snapshot(std::span<const uint8_t> image, const std::string& label, const Progress& progress) {
  const Reader reader(image, label, kSnapshotVersion);
  const std::vector<SectionRef> sections = reader.sections(true);
  if (sections.size() < 2 || sections[0].type != kMetadataSection || sections[1].type != kCalibrationSection) {
    reader.fail("sections must start with metadata and calibration");
  }
  Metadata metadata = read_metadata(reader, sections[0].bytes);
  Snapshot snapshot;
  snapshot.dump = std::move(metadata.dump);
  snapshot.calibration = read_calibration(reader, sections[1].bytes, snapshot.dump);
  snapshot.calibration.metadata() = std::move(metadata.calibration_metadata);
  const size_t layers = snapshot.dump.layers.size();
  if (sections.size() != 2 + 2 * layers) reader.fail("expected one section per layer and K/V");
  const CalibratedCodecs codecs(snapshot.calibration);
  for (size_t l = 0; l < layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const size_t index = 2 * l + (kind == TensorKind::key ? 0 : 1);
      const SectionRef& s = sections[2 + index];
      if (s.type != kTensorSection || s.index != index) reader.fail("tensor sections out of order");
      read_tensor(reader, s.bytes, snapshot.dump.layers[l].of(kind), kind, static_cast<int>(l), codecs);
    }
    if (progress) progress(l + 1, layers);
  }
  reader.check_padding(sections);
  return snapshot;
}

std::vector<uint8_t> read_snapshot_image(const std::string& path) {
  return io::read_file(path, {io::kContainerMagic, "a .gaac snapshot"});
}

Snapshot read_snapshot(const std::string& path, const Progress& progress) {
  const std::vector<uint8_t> image = read_snapshot_image(path);
  return parse_snapshot(image, path, progress);
}

}  // namespace gaac
