// The .gaac container (docs/format.md, section 11): a 32-byte header, a table of sections with their
// checksums, the sections each at a multiple of 64 bytes, zero padding between them. Snapshots
// (container version 1) and KV chunk objects (version 2, section 14) are both written and read
// through this one implementation; they differ in their sections and in how a section's checksum
// is computed (whole, or over 4 KiB pieces so that many threads can compute it).
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
/// Container versions: 1 hashes each section whole (snapshots), 2 in pieces (KV chunk objects).
inline constexpr uint16_t kWholeChecksumContainer = 1;
inline constexpr uint16_t kPiecewiseChecksumContainer = 2;
/// Bytes of one checksum piece in a version-2 container.
inline constexpr size_t kChecksumPieceBytes = 4096;

/// Section types (docs/format.md, sections 11 and 14).
enum SectionType : uint32_t {
  kMetadataSection = 1,
  kCalibrationSection = 2,
  kTensorSection = 3,
  kChunkTensorSection = 4,
  kEscapeSection = 5,
  kChunkIndexSection = 6,
};

/// `n` rounded up to the section alignment.
constexpr uint64_t align_section(uint64_t n) { return (n + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment; }
/// Offset of the first section of a container with `sections` sections.
constexpr uint64_t first_section_offset(size_t sections) {
  return align_section(kContainerHeaderBytes + kSectionEntryBytes * sections);
}

/// Pieces of a section of `bytes` bytes in a version-2 container (the last one may be shorter).
constexpr size_t checksum_pieces(uint64_t bytes) { return static_cast<size_t>((bytes + kChecksumPieceBytes - 1) / kChecksumPieceBytes); }
/// XXH64 (seed 0) of piece `piece` of `section`.
uint64_t piece_checksum(std::span<const uint8_t> section, size_t piece);
/// A version-2 section checksum from its pieces' checksums: XXH64 (seed 0) of them as little-endian u64.
uint64_t combine_piece_checksums(std::span<const uint64_t> pieces);
/// The checksum of a section in a container of `version`: XXH64 of its bytes (1), or of its pieces' (2).
uint64_t section_checksum(std::span<const uint8_t> section, uint16_t version);

/// One entry of the section table.
struct SectionEntry {
  uint32_t type = 0;
  uint32_t index = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

/// Writes the header and the section table of a container of `version` holding `entries` and
/// `file_bytes` bytes in all, zero-padded to the first section: first_section_offset(entries.size())
/// bytes at `out`.
void write_container_header(uint16_t version, std::span<const SectionEntry> entries, uint64_t file_bytes, uint8_t* out);

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
  /// A reader of `image` expecting container version `version`; `label` starts every message.
  ContainerReader(std::span<const uint8_t> image, std::string label, uint16_t version);

  [[noreturn]] void fail(const std::string& what) const;
  const std::string& label() const { return label_; }

  /// The header's file size (checked: at least the header, at most the image). Bytes of the image
  /// past it are not the container's.
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
  uint16_t version_;
};

/// Little-endian integers.
void put_le(uint8_t* out, uint64_t value, int bytes);
uint64_t get_le(const uint8_t* p, int bytes);

}  // namespace gaac::io
