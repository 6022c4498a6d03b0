// The .gaac container (docs/format.md, section 11): a 32-byte header, a table of sections with their
// checksums, the sections each at a multiple of 64 bytes, zero padding between them. Snapshots
// (container versions 1 and 2) and KV chunk objects (version 3, section 15) are all written and read
// through this one implementation; they differ in their sections and in how a section's checksum is
// computed (whole, or over 4 KiB pieces so that many threads can compute it). What the sections hold
// is snapshot.cpp's and chunk.cpp's business; this file only frames them and refuses a frame that is
// not exactly right.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gaac::io {

/// The first eight bytes of every container: "\x89GAAC\r\n\x1a".
inline constexpr std::array<uint8_t, 8> kContainerMagic = {0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A};
inline constexpr size_t kContainerHeaderBytes = 32;
inline constexpr size_t kSectionEntryBytes = 32;
inline constexpr size_t kSectionAlignment = 64;
/// Container versions (docs/format.md, section 12). Snapshots: 1 (BF16 only) and 2 (names its element
/// format, may hold FP8 scales), each section hashed whole. KV chunk objects: 3, each section hashed
/// over 4 KiB pieces. gaac::kSnapshotVersion and gaac::kChunkVersion are the ones written.
inline constexpr uint16_t kBf16SnapshotContainer = 1;
inline constexpr uint16_t kSnapshotContainer = 2;
inline constexpr uint16_t kChunkContainer = 3;
/// Bytes of one checksum piece in a version-3 container.
inline constexpr size_t kChecksumPieceBytes = 4096;

/// Section types (docs/format.md, sections 11, 14.8 and 15), one numbering for every kind of container.
enum SectionType : uint32_t {
  kMetadataSection = 1,
  kCalibrationSection = 2,
  kTensorSection = 3,
  kScalesSection = 4,
  kChunkTensorSection = 5,
  kEscapeSection = 6,
  kChunkIndexSection = 7,
};

/// `n` rounded up to the section alignment.
constexpr uint64_t align_section(uint64_t n) { return (n + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment; }
/// Offset of the first section of a container with `sections` sections.
constexpr uint64_t first_section_offset(size_t sections) {
  return align_section(kContainerHeaderBytes + kSectionEntryBytes * sections);
}

/// Pieces of a section of `bytes` bytes in a version-3 container (the last one may be shorter).
constexpr size_t checksum_pieces(uint64_t bytes) { return static_cast<size_t>((bytes + kChecksumPieceBytes - 1) / kChecksumPieceBytes); }
/// XXH64 (seed 0) of piece `piece` of `section`.
uint64_t piece_checksum(std::span<const uint8_t> section, size_t piece);
/// A version-3 section checksum from its pieces' checksums: XXH64 (seed 0) of them as little-endian u64.
uint64_t combine_piece_checksums(std::span<const uint64_t> pieces);
/// The checksum of a section in a container of `version`: XXH64 of its bytes (1, 2), or of its pieces' (3).
uint64_t section_checksum(std::span<const uint8_t> section, uint16_t version);
/// XXH64 (seed 0) of a section table's bytes, as the header holds it in every version.
uint64_t table_checksum(std::span<const uint8_t> table);

/// One entry of the section table.
struct SectionEntry {
  uint32_t type = 0;
  uint32_t index = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

/// Writes the header (container `version`, `tile_version`) and the section table of a container
/// holding `entries` and `file_bytes` bytes in all, zero-padded to the first section:
/// first_section_offset(entries.size()) bytes at `out`.
void write_container_header(uint16_t version, uint16_t tile_version, std::span<const SectionEntry> entries,
                            uint64_t file_bytes, uint8_t* out);

/// One section to write whole.
struct Section {
  uint32_t type;
  uint32_t index;
  std::vector<uint8_t> bytes;
};

/// The whole image of a container of `version` (1 or 2: sections hashed whole) and `tile_version`:
/// header, table and the sections in order, each 64-byte aligned.
std::vector<uint8_t> container_image(const std::vector<Section>& sections, uint16_t version, uint16_t tile_version);

/// A section found in a container: its table entry and its bytes (inside the image).
struct SectionRef {
  uint32_t type;
  uint32_t index;
  std::span<const uint8_t> bytes;
  uint64_t checksum;  ///< as the table says
};

/// Reads a container image, checking every size and offset before it uses them; nothing outside
/// the image is ever read. Every failure is a gaac::Error starting with the image's label.
class ContainerReader {
 public:
  /// A reader of `image` accepting the container versions `versions` (the first is the oldest, the
  /// last the newest); `label` starts every message.
  ContainerReader(std::span<const uint8_t> image, std::string label, std::vector<uint16_t> versions);

  [[noreturn]] void fail(const std::string& what) const;
  const std::string& label() const { return label_; }

  /// The header's container version (checked: one of those accepted) and tile format version (not
  /// checked here: what it must be depends on what the container holds).
  uint16_t version() const;
  uint16_t tile_version() const;

  /// The header's file size (checked with the magic and the version: at least the header, at most
  /// the image). Bytes of the image past it are not the container's.
  uint64_t file_bytes() const;
  /// The sections, in table order: the magic, the version, the file size (equal to the image's, or
  /// with `allow_trailing` at most it), the table's checksum, each section placed at the next 64-byte
  /// boundary after the previous one and the container ending at the boundary after the last.
  /// With `verify_checksums` every section's checksum too (otherwise the caller verifies them).
  std::vector<SectionRef> sections(bool verify_checksums, bool allow_trailing = false) const;
  /// Fails unless every byte outside the header, the table and the sections is zero. Run after the
  /// sections have been validated, so their own errors are reported first.
  void check_padding(const std::vector<SectionRef>& sections) const;

 private:
  std::span<const uint8_t> image_;
  std::string label_;
  std::vector<uint16_t> versions_;
};

/// Little-endian integers: written at `out`, appended to `out`, read.
void put_le(uint8_t* out, uint64_t value, int bytes);
void append_le(std::vector<uint8_t>& out, uint64_t value, int bytes);
uint64_t get_le(const uint8_t* p, int bytes);

}  // namespace gaac::io
