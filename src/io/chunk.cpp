// KV chunk objects on the CPU (docs/format.md, section 15), coded in phases on the codec's threads,
// each thread taking whole tensor sections in order. Encoding: (1) a thread encodes each of its
// sections' tiles straight into their fixed places, its escape bytes into a stream of its own, writes
// the tail and the padding, and hashes the section while it is in cache; (2) the sections' stream sizes
// give the index and each stream its place; the streams are copied there, the padding zeroed; (3) the
// other sections are hashed; the header goes last. Decoding: the structure, the metadata and the index
// first; then a thread hashes each of its sections and decodes its tiles, walking the escapes from the
// section's index entry (bounds checked, and its end must be the next entry); problems are kept per
// section and reported after the checksums, in section order, so that the message does not depend on
// which thread got where first.
#include "gaac/chunk.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/parallel.hpp"
#include "gaac/error.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/tiling.hpp"
#include "io/calibration_section.hpp"
#include "io/container.hpp"

namespace gaac {

static_assert(std::endian::native == std::endian::little, "chunk objects store BF16 little-endian, as the host does");

namespace {

using io::get_le;

constexpr int kMaxThreads = 256;
constexpr uint64_t kFixedAlignment = 4096;
constexpr uint8_t kCodedTile = 0;
constexpr uint8_t kRawTile = 1;

const char* kind_name(TensorKind kind) { return kind == TensorKind::key ? "K" : "V"; }

std::string hex16(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

/// Set bits of a word whose set bits are all at even positions (a bit per 2-bit field), without the
/// library call a popcount is on a CPU not known to have the instruction.
inline uint64_t count_fields(uint64_t x) {
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return (x * 0x0101010101010101ull) >> 56;
}

/// Escape bytes a coded tile's tags ask for: one per 4-bit group, five per raw group (tag 3 counts
/// nothing here; the decoder rejects it).
size_t escapes_of_tags(const uint8_t* tags, size_t tag_bytes) {
  uint64_t n4 = 0, nraw = 0;
  for (size_t i = 0; i < tag_bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, tags + i, 8);
    const uint64_t lo = w & 0x5555555555555555ull, hi = (w >> 1) & 0x5555555555555555ull;
    n4 += count_fields(lo & ~hi);
    nraw += count_fields(hi & ~lo);
  }
  return static_cast<size_t>(n4 + 5 * nraw);
}

/// A byte buffer that grows without initialising what it adds.
class Stream {
 public:
  uint8_t* end_with_room(size_t room) {
    if (used_ + room > capacity_) {
      const size_t capacity = std::max(2 * capacity_, used_ + room);
      auto bigger = std::make_unique_for_overwrite<uint8_t[]>(capacity);
      if (used_ > 0) std::memcpy(bigger.get(), data_.get(), used_);
      data_ = std::move(bigger);
      capacity_ = capacity;
    }
    return data_.get() + used_;
  }
  void grow(size_t n) { used_ += n; }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return used_; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0, used_ = 0;
};

/// Copies the 16 rows of a tile (row-major, C channels, rows `stride` elements apart) into a raw image.
void gather_raw(const uint16_t* origin, size_t stride, int channels, uint8_t* raw) {
  for (int r = 0; r < kTileTokens; ++r) {
    std::memcpy(raw + static_cast<size_t>(r) * channels * 2, origin + static_cast<size_t>(r) * stride, static_cast<size_t>(channels) * 2);
  }
}
void scatter_raw(const uint8_t* raw, int channels, uint16_t* origin, size_t stride) {
  for (int r = 0; r < kTileTokens; ++r) {
    std::memcpy(origin + static_cast<size_t>(r) * stride, raw + static_cast<size_t>(r) * channels * 2, static_cast<size_t>(channels) * 2);
  }
}

/// Rows `from .. from + count − 1` of a tensor as dense BF16 bytes `[token, head, channel]`.
void copy_rows_out(const KvView& t, int from, int count, uint8_t* out) {
  const size_t row = static_cast<size_t>(t.heads) * t.head_dim * 2;
  for (int r = 0; r < count; ++r) std::memcpy(out + static_cast<size_t>(r) * row, t.at(from + r, 0), row);
}
void copy_rows_in(const uint8_t* in, int from, int count, const MutableKvView& t) {
  const size_t row = static_cast<size_t>(t.heads) * t.head_dim * 2;
  for (int r = 0; r < count; ++r) std::memcpy(t.at(from + r, 0), in + static_cast<size_t>(r) * row, row);
}

/// Section numbers: 0 metadata, 1 index, 2 .. 2 + 2L − 1 tensors (2·layer + kind), then the escapes.
constexpr size_t kFirstTensor = 2;

std::string section_name(const ChunkLayout& layout, size_t s) {
  if (s == 0) return "metadata section";
  if (s == 1) return "index section";
  if (s + 1 == layout.sections()) return "escape section";
  const size_t t = s - kFirstTensor;
  return "section of layer " + std::to_string(t / 2) + " " + kind_name(t % 2 == 0 ? TensorKind::key : TensorKind::value);
}

/// Checksums of a section's pieces [first, last) into `out`.
void hash_pieces(std::span<const uint8_t> section, size_t first, size_t last, std::vector<uint64_t>& out) {
  for (size_t i = first; i < last; ++i) out[i] = io::piece_checksum(section, i);
}

int checked_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads) {
    throw Error("chunk codec threads must be 1.." + std::to_string(kMaxThreads) + ", got " + std::to_string(threads));
  }
  return threads;
}

void check_ratio(double ratio) {
  if (ratio != 0 && !(ratio >= 1 && std::isfinite(ratio))) {
    throw Error("chunk object_ratio must be 0 (objects of their own size) or a finite number ≥ 1, got " + std::to_string(ratio));
  }
}

}  // namespace

std::string ChunkGeometry::describe() const {
  return std::to_string(layers) + " layers × " + std::to_string(tokens) + " tokens × " + std::to_string(kv_heads) +
         " KV heads × " + std::to_string(head_dim) + " channels";
}

void validate(const ChunkGeometry& g) {
  if (g.layers < 1 || g.layers > 100000 || g.kv_heads < 1 || g.kv_heads > 4096 || g.tokens < 0 ||
      (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256)) {
    throw Error("chunk geometry out of range (layers 1..100000, KV heads 1..4096, head_dim 64, 128 or 256, tokens ≥ 0): " +
                g.describe());
  }
}

std::string chunk_metadata(const ChunkGeometry& g, uint64_t calibration_id, uint64_t key_id) {
  // Written out rather than through a JSON object: every chunk coded makes one, and these are the bytes
  // nlohmann::json's dump() gives (keys sorted, no spaces; a test holds the two equal).
  return "{\"calibration\":\"" + hex16(calibration_id) + "\",\"format\":\"gaac-chunk\",\"head_dim\":" + std::to_string(g.head_dim) +
         ",\"key\":\"" + hex16(key_id) + "\",\"kv_heads\":" + std::to_string(g.kv_heads) + ",\"layers\":" + std::to_string(g.layers) +
         ",\"tokens\":" + std::to_string(g.tokens) + "}";
}

ChunkLayout chunk_layout(const ChunkGeometry& g) {
  validate(g);
  ChunkLayout l;
  l.geometry = g;
  l.shape = tile_shape_for(TensorKind::key, g.head_dim);
  l.tiles_per_tensor = static_cast<size_t>(full_blocks(g.tokens)) * g.kv_heads * tiles_per_head(g.head_dim);
  l.fixed_bytes = l.shape.fixed_bytes();
  l.map_bytes = (l.tiles_per_tensor + 15) / 16 * 16;
  l.tail_bytes = static_cast<size_t>(g.tokens % kTileTokens) * g.kv_heads * g.head_dim * 2;
  l.tensor_bytes = l.map_bytes + l.tiles_per_tensor * l.fixed_bytes + l.tail_bytes;
  l.metadata_bytes = chunk_metadata(g, 0, 0).size();
  l.metadata_offset = io::first_section_offset(l.sections());
  l.index_offset = l.metadata_offset + io::align_section(l.metadata_bytes);
  l.index_bytes = 8 * l.tensors();
  l.first_tensor_offset = l.index_offset + io::align_section(l.index_bytes);
  l.tensor_stride = io::align_section(l.tensor_bytes);
  l.escape_offset = l.first_tensor_offset + l.tensors() * l.tensor_stride;
  return l;
}

uint64_t calibration_id(const CalibrationTable& calibration) {
  const std::vector<uint8_t> bytes = io::calibration_section(calibration);
  return XXH64(bytes.data(), bytes.size(), 0);
}

uint64_t chunk_key_id(std::string_view key) { return XXH64(key.data(), key.size(), 0); }

ChunkCodec::ChunkCodec(const CalibrationTable& calibration, ChunkOptions options)
    : calibration_(calibration),
      options_(options),
      calibration_id_(gaac::calibration_id(calibration)),
      codecs_(calibration, tile_shape_for(TensorKind::key, calibration.head_dim()).max_slot_capacity()) {
  checked_threads(options.threads);
  check_ratio(options.object_ratio);
}

ChunkGeometry ChunkCodec::geometry(int tokens) const {
  return {calibration_.layers(), calibration_.kv_heads(), calibration_.head_dim(), tokens};
}

size_t chunk_object_bytes(const ChunkGeometry& geometry, const ChunkOptions& options) {
  check_ratio(options.object_ratio);
  const ChunkLayout layout = chunk_layout(geometry);
  if (options.object_ratio == 0) return layout.max_object_bytes();
  // The tiles' BF16 bytes over the ratio; the tokens of an incomplete last block are BF16 in the object too.
  const uint64_t tails = 2 * static_cast<uint64_t>(geometry.layers) * layout.tail_bytes;
  const uint64_t wanted = static_cast<uint64_t>(std::ceil(static_cast<double>(geometry.bf16_bytes() - tails) / options.object_ratio)) + tails;
  // In whole 4 KiB pages (what O_DIRECT reads and writes), and never past the most an object can take.
  const uint64_t fixed = (std::max<uint64_t>(wanted, layout.escape_offset) + kFixedAlignment - 1) / kFixedAlignment * kFixedAlignment;
  return std::min<uint64_t>(fixed, layout.max_object_bytes());
}

size_t ChunkCodec::object_bytes(int tokens) const { return chunk_object_bytes(geometry(tokens), options_); }

namespace {

/// The tensor sections thread `t` of `threads` takes: [first, last).
struct Sections {
  size_t first, last;
};
Sections sections_of(const ChunkLayout& layout, int t, int threads) {
  return {part_begin(layout.tensors(), t, threads), part_begin(layout.tensors(), t + 1, threads)};
}

/// The tensor section number s (0 .. 2L − 1): its layer and kind.
int layer_of(size_t s) { return static_cast<int>(s / 2); }
TensorKind kind_of(size_t s) { return s % 2 == 0 ? TensorKind::key : TensorKind::value; }

}  // namespace

size_t ChunkCodec::encode(const ChunkView& chunk, std::string_view key, std::span<uint8_t> out) const {
  if (chunk.geometry != geometry(chunk.geometry.tokens)) {
    throw Error("chunk of " + chunk.geometry.describe() + " does not match the calibration's geometry (" +
                geometry(chunk.geometry.tokens).describe() + ")");
  }
  const ChunkLayout layout = chunk_layout(chunk.geometry);
  const size_t row = static_cast<size_t>(layout.geometry.kv_heads) * layout.geometry.head_dim;
  if (chunk.data == nullptr && layout.geometry.elements() > 0) throw Error("chunk has no data");
  if (chunk.token_stride < row) throw Error("chunk token stride shorter than a token's row");
  const size_t object_bytes = this->object_bytes(chunk.geometry.tokens);
  if (out.size() < object_bytes) {
    throw Error("output of " + std::to_string(out.size()) + " bytes is smaller than the " + std::to_string(object_bytes) +
                " a chunk object of " + layout.geometry.describe() + " may take");
  }
  const bool fixed_size = options_.object_ratio != 0;
  uint8_t* const base = out.data();
  const int threads = options_.threads;
  const size_t tensors = layout.tensors();
  const int channels = layout.shape.channels;
  const size_t max_escapes = layout.shape.max_slot_capacity();
  const size_t raw_rest = layout.raw_stream_bytes();
  const int tail_rows = layout.geometry.tokens % kTileTokens;
  std::vector<Stream> streams(static_cast<size_t>(threads));
  std::vector<uint64_t> stream_of(tensors + 1, 0);  // a tensor section's stream bytes, then where it starts
  std::vector<std::vector<uint64_t>> hashes(layout.sections());
  for (size_t s = 0; s < tensors; ++s) hashes[kFirstTensor + s].resize(io::checksum_pieces(layout.tensor_bytes));
  uint64_t object_end = 0;
  std::vector<std::span<const uint8_t>> sections(layout.sections());
  const auto tensor_section = [&](size_t s) { return base + layout.tensor_offset(layer_of(s), kind_of(s)); };

  // The metadata and the padding after the metadata and the index, on the calling thread.
  const std::string meta = chunk_metadata(layout.geometry, calibration_id_, chunk_key_id(key));
  std::memset(base + layout.metadata_offset, 0, layout.first_tensor_offset - layout.metadata_offset);
  std::memcpy(base + layout.metadata_offset, meta.data(), meta.size());
  sections[0] = {base + layout.metadata_offset, layout.metadata_bytes};
  sections[1] = {base + layout.index_offset, layout.index_bytes};

  const auto work = [&](int phase, int t) {
    const Sections mine = sections_of(layout, t, threads);
    if (phase == 0) {  // each section: tiles, tail, padding, then its checksum pieces
      Stream& stream = streams[static_cast<size_t>(t)];
      alignas(64) uint8_t raw[2 * kTileTokens * kMaxTileChannels];
      for (size_t s = mine.first; s < mine.last; ++s) {
        const int layer = layer_of(s);
        const TensorKind kind = kind_of(s);
        const KvView tensor = chunk.tensor(kind, layer);
        uint8_t* section = tensor_section(s);
        const size_t before = stream.size();
        for (size_t i = 0; i < layout.tiles_per_tensor; ++i) {
          const TilePosition p = tile_position(tensor, i);
          uint8_t* fixed = section + layout.fixed_offset(i);
          const uint16_t* origin = tile_origin(tensor, p);
          const TileEncoding e = codecs_.codec(kind, layer, p.head, p.half)
                                     .encode_split(origin, tensor.token_stride, fixed, stream.end_with_room(std::max(max_escapes, raw_rest)));
          if (e.fits) {
            section[i] = kCodedTile;
            stream.grow(e.escape_bytes);
          } else {
            section[i] = kRawTile;
            gather_raw(origin, tensor.token_stride, channels, raw);
            std::memcpy(fixed, raw, layout.fixed_bytes);
            std::memcpy(stream.end_with_room(raw_rest), raw + layout.fixed_bytes, raw_rest);
            stream.grow(raw_rest);
          }
        }
        std::memset(section + layout.tiles_per_tensor, 0, layout.map_bytes - layout.tiles_per_tensor);
        copy_rows_out(tensor, layout.geometry.tokens - tail_rows, tail_rows, section + layout.fixed_offset(layout.tiles_per_tensor));
        std::memset(section + layout.tensor_bytes, 0, layout.tensor_stride - layout.tensor_bytes);
        stream_of[s] = stream.size() - before;
        std::vector<uint64_t>& h = hashes[kFirstTensor + s];
        hash_pieces({section, layout.tensor_bytes}, 0, h.size(), h);
      }
    } else if (phase == 1) {  // streams into the escape section, zeros after them
      const Stream& stream = streams[static_cast<size_t>(t)];
      if (stream.size() > 0) std::memcpy(base + layout.escape_offset + stream_of[mine.first], stream.data(), stream.size());
      const uint64_t from = layout.escape_offset + stream_of[tensors];
      const uint64_t span = object_end - from;
      const uint64_t a = from + part_begin(span, t, threads), b = from + part_begin(span, t + 1, threads);
      std::memset(base + a, 0, b - a);
    } else {  // the escape section's pieces; the metadata's and the index's on thread 0
      std::vector<uint64_t>& h = hashes.back();
      hash_pieces(sections.back(), part_begin(h.size(), t, threads), part_begin(h.size(), t + 1, threads), h);
      if (t == 0) {
        for (size_t s = 0; s < kFirstTensor; ++s) hash_pieces(sections[s], 0, hashes[s].size(), hashes[s]);
      }
    }
  };
  const auto between = [&](int phase) {
    if (phase == 0) {  // the index: where each section's escapes start
      uint64_t at = 0;
      for (size_t s = 0; s < tensors; ++s) {
        const uint64_t bytes = stream_of[s];
        stream_of[s] = at;
        io::put_le(base + layout.index_offset + 8 * s, at, 8);
        at += bytes;
      }
      stream_of[tensors] = at;
      object_end = fixed_size ? object_bytes : layout.escape_offset + io::align_section(at);
      if (layout.escape_offset + at > object_end) {
        throw Error(ErrorCode::out_of_space,
                    "chunk of " + layout.geometry.describe() + " needs " + std::to_string(layout.escape_offset + at) +
                        " bytes, more than the fixed object size of " + std::to_string(object_end) + " (object_ratio " +
                        std::to_string(options_.object_ratio) + ")");
      }
      for (size_t s = 0; s < tensors; ++s) sections[kFirstTensor + s] = {tensor_section(s), layout.tensor_bytes};
      sections.back() = {base + layout.escape_offset, object_end - layout.escape_offset};
      for (const size_t s : {size_t{0}, size_t{1}, sections.size() - 1}) hashes[s].resize(io::checksum_pieces(sections[s].size()));
    } else if (phase == 2) {
      std::vector<io::SectionEntry> entries;
      for (size_t s = 0; s < sections.size(); ++s) {
        const uint32_t type = s == 0                     ? io::kMetadataSection
                              : s == 1                   ? io::kChunkIndexSection
                              : s + 1 == sections.size() ? io::kEscapeSection
                                                         : io::kChunkTensorSection;
        const auto index = static_cast<uint32_t>(type == io::kChunkTensorSection ? s - kFirstTensor : 0);
        entries.push_back({type, index, static_cast<uint64_t>(sections[s].data() - base), sections[s].size(),
                           io::combine_piece_checksums(hashes[s])});
      }
      io::write_container_header(kChunkVersion, static_cast<uint16_t>(kTileFormatVersion), entries, object_end, base);
    }
  };
  run_phases(threads, 3, work, between);
  return object_end;
}

void ChunkCodec::decode(std::span<const uint8_t> object, std::string_view key, const MutableChunkView& chunk) const {
  const io::ContainerReader reader(object, "KV chunk object", {kChunkVersion});
  if (chunk.geometry != geometry(chunk.geometry.tokens)) {
    throw Error("destination of " + chunk.geometry.describe() + " does not match the calibration's geometry (" +
                geometry(chunk.geometry.tokens).describe() + ")");
  }
  const ChunkLayout layout = chunk_layout(chunk.geometry);
  const size_t row = static_cast<size_t>(layout.geometry.kv_heads) * layout.geometry.head_dim;
  if (chunk.data == nullptr && layout.geometry.elements() > 0) throw Error("destination has no data");
  if (chunk.token_stride < row) throw Error("destination token stride shorter than a token's row");

  // Structure, metadata and index, before anything else is read.
  if (reader.tile_version() != kTileFormatVersion) {
    reader.fail("tile format version " + std::to_string(reader.tile_version()) + " is not supported");
  }
  const std::vector<io::SectionRef> refs = reader.sections(false, true);
  if (refs.empty() || refs[0].type != io::kMetadataSection || refs[0].index != 0) reader.fail("first section is not the metadata");
  if (io::section_checksum(refs[0].bytes, kChunkVersion) != refs[0].checksum) reader.fail("metadata section checksum mismatch");
  const auto meta = nlohmann::json::parse(refs[0].bytes.begin(), refs[0].bytes.end(), nullptr, false);
  const auto text = [&](const char* k) -> std::string {
    const auto it = meta.is_object() ? meta.find(k) : meta.end();
    if (it == meta.end() || !it->is_string()) reader.fail(std::string("metadata field '") + k + "' missing or not a string");
    return it->get<std::string>();
  };
  const auto number = [&](const char* k) -> int {
    const auto it = meta.is_object() ? meta.find(k) : meta.end();
    if (it == meta.end() || !it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (int64_t{1} << 31) - 1) {
      reader.fail(std::string("metadata field '") + k + "' missing or not a count");
    }
    return static_cast<int>(it->get<int64_t>());
  };
  if (!meta.is_object() || text("format") != "gaac-chunk") reader.fail("not a KV chunk object (metadata format is not gaac-chunk)");
  const ChunkGeometry stored{number("layers"), number("kv_heads"), number("head_dim"), number("tokens")};
  if (stored != layout.geometry) {
    reader.fail("holds a chunk of " + stored.describe() + ", not of " + layout.geometry.describe() +
                " (another model, or another chunk size)");
  }
  if (text("calibration") != hex16(calibration_id_)) {
    reader.fail("was made with calibration " + text("calibration") + ", not with this codec's " + hex16(calibration_id_) +
                " (another calibration file, or another model)");
  }
  if (text("key") != hex16(chunk_key_id(key))) reader.fail("was stored under another key (key id " + text("key") + ")");
  if (refs[0].bytes.size() != layout.metadata_bytes ||
      std::string_view(reinterpret_cast<const char*>(refs[0].bytes.data()), refs[0].bytes.size()) !=
          chunk_metadata(layout.geometry, calibration_id_, chunk_key_id(key))) {
    reader.fail("metadata is not written as docs/format.md says");
  }
  if (refs.size() != layout.sections()) {
    reader.fail("has " + std::to_string(refs.size()) + " sections, a chunk of " + layout.geometry.describe() + " has " +
                std::to_string(layout.sections()));
  }
  const uint8_t* const base = object.data();
  const size_t tensors = layout.tensors();
  const io::SectionRef& index_ref = refs[1];
  if (index_ref.type != io::kChunkIndexSection || index_ref.index != 0 || index_ref.bytes.size() != layout.index_bytes) {
    reader.fail("second section is not the index of " + std::to_string(tensors) + " tensors");
  }
  if (io::section_checksum(index_ref.bytes, kChunkVersion) != index_ref.checksum) reader.fail("index section checksum mismatch");
  for (size_t s = kFirstTensor; s + 1 < refs.size(); ++s) {
    if (refs[s].type != io::kChunkTensorSection || refs[s].index != s - kFirstTensor) reader.fail(section_name(layout, s) + ": wrong type or order");
    if (refs[s].bytes.size() != layout.tensor_bytes) {
      reader.fail(section_name(layout, s) + " is " + std::to_string(refs[s].bytes.size()) + " bytes, not " +
                  std::to_string(layout.tensor_bytes));
    }
  }
  const io::SectionRef& escape_ref = refs.back();
  if (escape_ref.type != io::kEscapeSection || escape_ref.index != 0) reader.fail("last section is not the escape section");
  if (static_cast<uint64_t>(escape_ref.bytes.data() - base) != layout.escape_offset) reader.fail("escape section out of place");
  std::vector<uint64_t> starts(tensors + 1);
  for (size_t s = 0; s < tensors; ++s) {
    starts[s] = io::get_le(index_ref.bytes.data() + 8 * s, 8);
    if ((s == 0 && starts[s] != 0) || (s > 0 && starts[s] < starts[s - 1]) || starts[s] > escape_ref.bytes.size()) {
      reader.fail("index entry " + std::to_string(s) + " is out of order or past the escape section");
    }
  }

  const int threads = options_.threads;
  const int channels = layout.shape.channels;
  const size_t max_escapes = layout.shape.max_slot_capacity();
  const size_t raw_rest = layout.raw_stream_bytes();
  const size_t tag_offset = layout.shape.tag_offset(), tag_bytes = layout.shape.tag_bytes();
  const int tail_rows = layout.geometry.tokens % kTileTokens;
  const uint8_t* const escapes_begin = escape_ref.bytes.data();
  std::vector<std::vector<uint64_t>> hashes(refs.size());
  for (size_t s = 2; s < refs.size(); ++s) hashes[s].resize(io::checksum_pieces(refs[s].bytes.size()));
  std::vector<std::string> problems(tensors);  // the first problem of each tensor section
  std::vector<uint64_t> ends(tensors, 0);      // where each section's escapes end

  const auto work = [&](int, int t) {
    std::vector<uint64_t>& eh = hashes.back();
    hash_pieces(escape_ref.bytes, part_begin(eh.size(), t, threads), part_begin(eh.size(), t + 1, threads), eh);
    const Sections mine = sections_of(layout, t, threads);
    alignas(64) uint8_t scratch[2 * kTileTokens * kMaxTileChannels];
    for (size_t s = mine.first; s < mine.last; ++s) {
      const int layer = layer_of(s);
      const TensorKind kind = kind_of(s);
      const std::span<const uint8_t> bytes = refs[kFirstTensor + s].bytes;
      std::vector<uint64_t>& h = hashes[kFirstTensor + s];
      hash_pieces(bytes, 0, h.size(), h);
      const uint8_t* section = bytes.data();
      const MutableKvView tensor = chunk.tensor(kind, layer);
      uint64_t at = starts[s];
      const auto problem = [&](size_t i, const std::string& what) {
        problems[s] = reader.label() + ": " + section_name(layout, kFirstTensor + s) + ", tile " + std::to_string(i) + ": " + what;
      };
      for (size_t i = 0; i < layout.tiles_per_tensor && problems[s].empty(); ++i) {
        const TilePosition p = tile_position(tensor, i);
        const uint8_t* fixed = section + layout.fixed_offset(i);
        uint16_t* origin = tile_origin(tensor, p);
        if (section[i] > kRawTile) {
          problem(i, "unknown storage kind " + std::to_string(section[i]));
        } else if (section[i] == kRawTile) {
          if (at + raw_rest > escape_ref.bytes.size()) {
            problem(i, "its escapes run past the escape section");
            break;
          }
          std::memcpy(scratch, fixed, layout.fixed_bytes);
          std::memcpy(scratch + layout.fixed_bytes, escapes_begin + at, raw_rest);
          scatter_raw(scratch, channels, origin, tensor.token_stride);
          at += raw_rest;
        } else {
          const size_t n = escapes_of_tags(fixed + tag_offset, tag_bytes);
          if (n > max_escapes) {
            problem(i, "tags ask for more escape bytes than a tile may have");
          } else if (at + n > escape_ref.bytes.size()) {
            problem(i, "its escapes run past the escape section");
          } else {
            const size_t capacity = (n + 15) / 16 * 16;
            std::memcpy(scratch, escapes_begin + at, n);
            std::memset(scratch + n, 0, capacity - n);
            const DecodeStatus status = codecs_.codec(kind, layer, p.head, p.half).decode_split(fixed, scratch, capacity, origin, tensor.token_stride);
            if (status != DecodeStatus::ok) problem(i, std::string("(block ") + std::to_string(p.block) + ", head " + std::to_string(p.head) + ") " + to_string(status));
            at += n;
          }
        }
      }
      ends[s] = at;
      if (std::any_of(section + layout.tiles_per_tensor, section + layout.map_bytes, [](uint8_t x) { return x != 0; }) &&
          problems[s].empty()) {
        problems[s] = reader.label() + ": " + section_name(layout, kFirstTensor + s) + ": storage map padding is not zero";
      }
      copy_rows_in(section + layout.fixed_offset(layout.tiles_per_tensor), layout.geometry.tokens - tail_rows, tail_rows, tensor);
    }
  };
  const auto between = [&](int) {
    for (size_t s = 0; s < refs.size(); ++s) {
      if (s < 2) continue;  // checked before
      if (io::combine_piece_checksums(hashes[s]) != refs[s].checksum) reader.fail(section_name(layout, s) + " checksum mismatch");
    }
    for (size_t s = 0; s < tensors; ++s) {
      if (!problems[s].empty()) throw Error(problems[s]);
      const uint64_t next = s + 1 < tensors ? starts[s + 1] : ends[s];
      if (ends[s] != next) reader.fail("index entry " + std::to_string(s + 1) + " is not where the escapes of " + section_name(layout, kFirstTensor + s) + " end");
    }
    const uint8_t* tail = escapes_begin + (tensors > 0 ? ends[tensors - 1] : 0);
    if (std::any_of(tail, escapes_begin + escape_ref.bytes.size(), [](uint8_t x) { return x != 0; })) {
      reader.fail("escape section bytes after the tiles' escapes are not zero");
    }
    reader.check_padding(refs);
  };
  run_phases(threads, 1, work, between);
}

CalibrationTable calibrate_chunk(const ChunkView& chunk) {
  validate(chunk.geometry);
  KvDump dump;
  for (int l = 0; l < chunk.geometry.layers; ++l) {
    KvLayer layer;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvView v = chunk.tensor(kind, l);
      KvTensor& t = layer.of(kind);
      t.tokens = v.tokens, t.kv_heads = v.heads, t.head_dim = v.head_dim;
      t.data.resize(t.elements());
      copy_rows_out(v, 0, v.tokens, reinterpret_cast<uint8_t*>(t.data.data()));
    }
    dump.layers.push_back(std::move(layer));
  }
  const KvDump* dumps[] = {&dump};
  return calibrate(dumps);
}

}  // namespace gaac
