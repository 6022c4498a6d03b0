// The .gaac snapshot's sections (docs/format.md, sections 11 and 14.8): metadata, calibration, one
// tensor section per (layer, K/V) and, for FP8 dumps with scales, the scales. BF16 and FP8 dumps share
// every step, with the element type (uint16_t or uint8_t) and the tile codec as parameters; the
// container around the sections is io/container.cpp's. Every read is bounds-checked first.
#include "gaac/snapshot.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
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
          const auto bases = window == 0 ? c.narrow(kind, l, h) : c.wide(kind, l, h);
          out.insert(out.end(), bases.begin(), bases.end());
        }
      }
    }
  }
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < c.layers(); ++l) append_le(out, static_cast<uint16_t>(c.escape_capacity(kind, l)), 2);
  }
  return out;
}

}  // namespace io

namespace {

using io::get_le;
using io::kCalibrationSection;
using io::kMetadataSection;
using io::kScalesSection;
using io::kTensorSection;
using io::Section;
using io::SectionRef;
using Reader = io::ContainerReader;
constexpr uint8_t kStoredSlot = 0;
constexpr uint8_t kStoredRaw = 1;
// Geometry limits a reader accepts: far beyond any model, small enough that sizes cannot overflow.
constexpr int64_t kMaxLayers = 100000;
constexpr int64_t kMaxKvHeads = 4096;
constexpr int64_t kMaxTokens = int64_t{1} << 31;

const char* kind_name(TensorKind kind) { return kind == TensorKind::key ? "K" : "V"; }

/// What differs between BF16 and FP8 dumps, for the steps both share.
ElementFormat format_of(const KvDump&) { return ElementFormat::bf16; }
ElementFormat format_of(const Fp8KvDump& dump) { return dump.format; }
uint32_t tile_version_of(ElementFormat format) { return is_fp8(format) ? kFp8TileFormatVersion : kTileFormatVersion; }
int channels_of(const TileCodec& codec) { return codec.shape().channels; }
int channels_of(const Fp8TileCodec& codec) { return codec.shape().tile.channels; }
/// The tile shape (TileShape or Fp8TileShape) of a kind of tensor of a format.
TileShape shape_of(uint16_t, ElementFormat, TensorKind kind, int head_dim) { return tile_shape_for(kind, head_dim); }
Fp8TileShape shape_of(uint8_t, ElementFormat format, TensorKind kind, int head_dim) { return {format, tile_shape_for(kind, head_dim)}; }

/// Elements as little-endian bytes, and back.
template <class T>
void put_elements(std::vector<uint8_t>& out, const T* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < sizeof(T); ++b) out.push_back(static_cast<uint8_t>(x[i] >> (8 * b)));
  }
}
template <class T>
T get_element(const uint8_t* p) {
  return static_cast<T>(get_le(p, sizeof(T)));
}

/// Bytes of the storage map of a tensor section: one byte per tile, padded to 16.
size_t storage_map_bytes(size_t tiles) { return (tiles + 15) / 16 * 16; }

template <class Dump>
std::vector<uint8_t> metadata_section(const Dump& dump, const CalibrationTable& calibration) {
  nlohmann::json meta;
  meta["format"] = "gaac-snapshot";
  meta["element_format"] = to_string(format_of(dump));
  meta["layers"] = dump.layers.size();
  meta["kv_heads"] = dump.kv_heads();
  meta["head_dim"] = dump.head_dim();
  nlohmann::json tokens = nlohmann::json::array();
  for (const auto& l : dump.layers) tokens.push_back(l.k.tokens);
  meta["tokens"] = tokens;
  nlohmann::json dump_meta = nlohmann::json::array();
  for (const auto& [k, v] : dump.metadata) dump_meta.push_back({k, v});
  meta["dump_metadata"] = dump_meta;
  meta["calibration_metadata"] = calibration.metadata();
  if constexpr (std::is_same_v<Dump, Fp8KvDump>) meta["scales"] = !dump.k_scales.empty();
  const std::string text = meta.dump();
  return {text.begin(), text.end()};
}

template <class T, class Codec>
std::vector<uint8_t> tensor_section(const BasicKvTensor<T>& tensor, std::span<const Codec> codecs) {
  const auto t = view_of(tensor);
  std::vector<uint8_t> out(storage_map_bytes(tile_count(t)), 0);
  encode_each_tile(t, codecs, [&](size_t i, TilePosition p, const TileEncoding& enc, std::span<const uint8_t> slot) {
    if (enc.fits) {
      out.insert(out.end(), slot.begin(), slot.end());
    } else {
      out[i] = kStoredRaw;
      const T* origin = tile_origin(t, p);
      for (int row = 0; row < kTileTokens; ++row) {
        put_elements(out, origin + static_cast<size_t>(row) * t.token_stride, static_cast<size_t>(channels_of(codecs[0])));
      }
    }
  });
  const size_t tail_from = static_cast<size_t>(full_blocks(t.tokens)) * kTileTokens * t.token_stride;
  put_elements(out, tensor.data.data() + tail_from, tensor.data.size() - tail_from);
  return out;
}

std::vector<uint8_t> scales_section(const Fp8KvDump& dump) {
  std::vector<uint8_t> out;
  for (const auto* scales : {&dump.k_scales, &dump.v_scales}) {
    for (const float s : *scales) io::append_le(out, std::bit_cast<uint32_t>(s), 4);
  }
  return out;
}

template <class Dump>
std::vector<Section> build_sections(const Dump& dump, const CalibrationTable& calibration,
                                    const std::function<std::vector<uint8_t>(int, TensorKind)>& encode, const Progress& progress) {
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
  if constexpr (std::is_same_v<Dump, Fp8KvDump>) {
    if (!dump.k_scales.empty()) sections.push_back({kScalesSection, 0, scales_section(dump)});
  }
  return sections;
}

template <class Dump>
std::vector<uint8_t> image_of(const Dump& dump, const CalibrationTable& calibration,
                              const std::function<std::vector<uint8_t>(int, TensorKind)>& encode, const Progress& progress) {
  return io::container_image(build_sections(dump, calibration, encode, progress), kSnapshotVersion,
                             static_cast<uint16_t>(tile_version_of(format_of(dump))));
}

// ---- reading -------------------------------------------------------------------------------------

int64_t json_int(const Reader& r, const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) r.fail(std::string("metadata field '") + key + "' missing or not an integer");
  const auto v = it->get<int64_t>();
  if (v < lo || v > hi) r.fail(std::string("metadata field '") + key + "' = " + std::to_string(v) + " out of range");
  return v;
}

/// What the metadata section says: the format, the dump's shape and provenance.
struct Metadata {
  ElementFormat format = ElementFormat::bf16;
  bool scales = false;
  int kv_heads = 0, head_dim = 0;
  std::vector<int> tokens;  ///< per layer
  std::vector<std::pair<std::string, std::string>> dump_metadata;
  std::map<std::string, std::string> calibration_metadata;

  /// A dump of this shape, tensors without data.
  template <class Dump>
  Dump shaped() const {
    Dump dump;
    for (const int t : tokens) {
      typename decltype(dump.layers)::value_type layer;
      layer.k.tokens = layer.v.tokens = t;
      layer.k.kv_heads = layer.v.kv_heads = kv_heads;
      layer.k.head_dim = layer.v.head_dim = head_dim;
      dump.layers.push_back(std::move(layer));
    }
    dump.metadata = dump_metadata;
    return dump;
  }
};

/// The element format a container of `version` says it holds: version 1 is BF16 and names none,
/// version 2 names it.
ElementFormat read_format(const Reader& r, const nlohmann::json& meta, uint16_t version) {
  const auto it = meta.find("element_format");
  if (version == 1) {
    if (it != meta.end()) r.fail("metadata of a version-1 snapshot names an element format");
    return ElementFormat::bf16;
  }
  if (it == meta.end() || !it->is_string()) r.fail("metadata field 'element_format' missing or not a string");
  for (const ElementFormat f : {ElementFormat::bf16, ElementFormat::e4m3, ElementFormat::e5m2}) {
    if (*it == to_string(f)) return f;
  }
  r.fail("metadata field 'element_format' is not bf16, e4m3 or e5m2");
}

Metadata read_metadata(const Reader& r, std::span<const uint8_t> bytes) {
  const auto meta = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  const auto format = meta.is_object() ? meta.find("format") : meta.end();
  if (!meta.is_object() || format == meta.end() || !format->is_string() || *format != "gaac-snapshot") {
    r.fail("metadata section is not gaac-snapshot JSON");
  }
  Metadata out;
  const auto layers = json_int(r, meta, "layers", 1, kMaxLayers);
  out.kv_heads = static_cast<int>(json_int(r, meta, "kv_heads", 1, kMaxKvHeads));
  out.head_dim = static_cast<int>(json_int(r, meta, "head_dim", 64, 256));
  if (out.head_dim != 64 && out.head_dim != 128 && out.head_dim != 256) r.fail("head_dim must be 64, 128 or 256");
  const auto tokens = meta.find("tokens");
  if (tokens == meta.end() || !tokens->is_array() || tokens->size() != static_cast<size_t>(layers)) {
    r.fail("metadata 'tokens' is not a list of one count per layer");
  }
  for (const auto& t : *tokens) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() >= static_cast<uint64_t>(kMaxTokens)) r.fail("bad token count in metadata");
    out.tokens.push_back(static_cast<int>(t.get<uint64_t>()));
  }
  if (const auto m = meta.find("dump_metadata"); m != meta.end() && m->is_array()) {
    for (const auto& kv : *m) {
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) r.fail("bad dump_metadata entry");
      out.dump_metadata.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    }
  }
  if (const auto m = meta.find("calibration_metadata"); m != meta.end() && m->is_object()) {
    for (const auto& [k, v] : m->items()) {
      if (!v.is_string()) r.fail("bad calibration_metadata entry");
      out.calibration_metadata[k] = v.get<std::string>();
    }
  }
  out.format = read_format(r, meta, r.version());
  if (r.tile_version() != tile_version_of(out.format)) {
    r.fail("tile format version " + std::to_string(r.tile_version()) + " is not supported");
  }
  if (const auto s = meta.find("scales"); s != meta.end()) {
    if (!s->is_boolean() || !is_fp8(out.format)) r.fail("metadata field 'scales' is not a boolean of an FP8 snapshot");
    out.scales = s->get<bool>();
  }
  return out;
}

/// Reads the calibration section. Its size is checked before the table is allocated, so hostile
/// geometry in the metadata cannot force a large allocation.
CalibrationTable read_calibration(const Reader& r, std::span<const uint8_t> bytes, const Metadata& m) {
  const auto layers = static_cast<uint64_t>(m.tokens.size());
  const uint64_t per_window = layers * static_cast<uint64_t>(m.kv_heads) * static_cast<uint64_t>(m.head_dim);
  if (bytes.size() != 4 * per_window + 4 * layers) r.fail("calibration section has the wrong size");
  CalibrationTable c(static_cast<int>(layers), m.kv_heads, m.head_dim, m.format);
  size_t at = 0;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int window = 0; window < 2; ++window) {
      for (int l = 0; l < c.layers(); ++l) {
        for (int h = 0; h < c.kv_heads(); ++h) {
          auto dst = window == 0 ? c.narrow(kind, l, h) : c.wide(kind, l, h);
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

template <class T, class Codecs>
void read_tensor(const Reader& r, std::span<const uint8_t> bytes, BasicKvTensor<T>& t, ElementFormat format, TensorKind kind,
                 int layer, const Codecs& codecs) {
  const std::string where = "layer " + std::to_string(layer) + " " + kind_name(kind);
  const auto shape = shape_of(T{}, format, kind, t.head_dim);
  const auto tensor_codecs = codecs.tensor_codecs(kind, layer);
  const int channels = channels_of(tensor_codecs.front());
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
                          sizeof(T) * tail_elements;
  if (bytes.size() != expected) {
    r.fail(where + ": section is " + std::to_string(bytes.size()) + " bytes, its tiles need " + std::to_string(expected));
  }
  t.data.assign(t.elements(), 0);  // only now: the size check bounds the allocation by the file size
  const auto view = mutable_view_of(t);
  const int halves = tiles_per_head(t.head_dim);
  size_t at = map_bytes;
  for (size_t i = 0; i < tiles; ++i) {
    const TilePosition p = tile_position(view, i);
    T* origin = tile_origin(view, p);
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
        for (int ch = 0; ch < channels; ++ch, at += sizeof(T)) {
          origin[static_cast<size_t>(row) * view.token_stride + ch] = get_element<T>(&bytes[at]);
        }
      }
    }
  }
  const size_t tail_from = t.elements() - tail_elements;
  for (size_t i = 0; i < tail_elements; ++i, at += sizeof(T)) t.data[tail_from + i] = get_element<T>(&bytes[at]);
}

/// Reads the scales section into `dump` (after its tensors).
void read_scales(const Reader& r, std::span<const uint8_t> bytes, Fp8KvDump& dump) {
  const size_t layers = dump.layers.size();
  if (bytes.size() != 8 * layers) r.fail("scales section has the wrong size");
  for (size_t i = 0; i < 2 * layers; ++i) {
    const float s = std::bit_cast<float>(static_cast<uint32_t>(get_le(&bytes[4 * i], 4)));
    if (!std::isfinite(s) || !(s > 0)) r.fail("scale " + std::to_string(i) + " is not finite and positive");
    (i < layers ? dump.k_scales : dump.v_scales).push_back(s);
  }
}

/// The tensor sections (and scales) of a parsed container, into a dump of the metadata's shape.
template <class Dump, class Codecs>
Dump read_tensors(const Reader& r, const std::vector<SectionRef>& sections, const Metadata& m, const CalibrationTable& table,
                  const Progress& progress) {
  Dump dump = m.shaped<Dump>();
  if constexpr (std::is_same_v<Dump, Fp8KvDump>) dump.format = m.format;
  const size_t layers = dump.layers.size();
  if (sections.size() != 2 + 2 * layers + (m.scales ? 1 : 0)) r.fail("expected one section per layer and K/V");
  const Codecs codecs(table);
  for (size_t l = 0; l < layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const size_t index = 2 * l + (kind == TensorKind::key ? 0 : 1);
      const SectionRef& s = sections[2 + index];
      if (s.type != kTensorSection || s.index != index) r.fail("tensor sections out of order");
      read_tensor(r, s.bytes, dump.layers[l].of(kind), m.format, kind, static_cast<int>(l), codecs);
    }
    if (progress) progress(l + 1, layers);
  }
  if constexpr (std::is_same_v<Dump, Fp8KvDump>) {
    if (m.scales) {
      const SectionRef& s = sections.back();
      if (s.type != kScalesSection || s.index != 0) r.fail("the scales section is missing or out of order");
      read_scales(r, s.bytes, dump);
    }
  }
  return dump;
}

}  // namespace

std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration, const Progress& progress) {
  std::optional<CalibratedCodecs> codecs;  // made once the calibration has been checked against the dump
  const TensorSectionEncoder encode = [&](int layer, TensorKind kind) {
    if (!codecs) codecs.emplace(calibration);
    return tensor_section(dump.layers[static_cast<size_t>(layer)].of(kind), codecs->tensor_codecs(kind, layer));
  };
  return image_of(dump, calibration, encode, progress);
}

std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration,
                                    const TensorSectionEncoder& encode, const Progress& progress) {
  return image_of(dump, calibration, encode, progress);
}

std::vector<uint8_t> snapshot_image(const Fp8KvDump& dump, const CalibrationTable& calibration, const Progress& progress) {
  std::optional<Fp8CalibratedCodecs> codecs;
  const auto encode = [&](int layer, TensorKind kind) {
    if (!codecs) codecs.emplace(calibration);
    return tensor_section(dump.layers[static_cast<size_t>(layer)].of(kind), codecs->tensor_codecs(kind, layer));
  };
  return image_of(dump, calibration, encode, progress);
}

void write_snapshot(const KvDump& dump, const CalibrationTable& calibration, const std::string& path,
                    const Progress& progress) {
  const std::vector<uint8_t> image = snapshot_image(dump, calibration, progress);
  const std::span<const uint8_t> parts[] = {image};
  io::write_file_atomic(path, parts);
}

void write_snapshot(const Fp8KvDump& dump, const CalibrationTable& calibration, const std::string& path,
                    const Progress& progress) {
  const std::vector<uint8_t> image = snapshot_image(dump, calibration, progress);
  const std::span<const uint8_t> parts[] = {image};
  io::write_file_atomic(path, parts);
}

AnySnapshot parse_any_snapshot(std::span<const uint8_t> image, const std::string& label, const Progress& progress) {
  const Reader reader(image, label, {io::kBf16SnapshotContainer, io::kSnapshotContainer});
  const std::vector<SectionRef> sections = reader.sections(true);
  if (sections.size() < 2 || sections[0].type != kMetadataSection || sections[1].type != kCalibrationSection) {
    reader.fail("sections must start with metadata and calibration");
  }
  Metadata metadata = read_metadata(reader, sections[0].bytes);
  CalibrationTable calibration = read_calibration(reader, sections[1].bytes, metadata);
  calibration.metadata() = metadata.calibration_metadata;
  AnySnapshot out;
  if (is_fp8(metadata.format)) {
    out = Fp8Snapshot{read_tensors<Fp8KvDump, Fp8CalibratedCodecs>(reader, sections, metadata, calibration, progress), std::move(calibration)};
  } else {
    out = Snapshot{read_tensors<KvDump, CalibratedCodecs>(reader, sections, metadata, calibration, progress), std::move(calibration)};
  }
  reader.check_padding(sections);
  return out;
}

Snapshot parse_snapshot(std::span<const uint8_t> image, const std::string& label, const Progress& progress) {
  AnySnapshot any = parse_any_snapshot(image, label, progress);
  if (auto* fp8 = std::get_if<Fp8Snapshot>(&any)) {
    throw Error(label + ": this is a snapshot of " + to_string(fp8->dump.format) + " KV, not BF16");
  }
  return std::get<Snapshot>(std::move(any));
}

std::vector<uint8_t> read_snapshot_image(const std::string& path) {
  return io::read_file(path, {io::kContainerMagic, "a .gaac snapshot"});
}

Snapshot read_snapshot(const std::string& path, const Progress& progress) {
  const std::vector<uint8_t> image = read_snapshot_image(path);
  return parse_snapshot(image, path, progress);
}

AnySnapshot read_any_snapshot(const std::string& path, const Progress& progress) {
  const std::vector<uint8_t> image = read_snapshot_image(path);
  return parse_any_snapshot(image, path, progress);
}

}  // namespace gaac
