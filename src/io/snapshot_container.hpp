// The .gaac container (docs/format.md, section 11): header, section table, 64-byte aligned sections,
// checksums and zero padding. What the sections hold is snapshot.cpp's business; this file only frames
// them and refuses a frame that is not exactly right.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gaac::io::container {

inline constexpr std::array<uint8_t, 8> kMagic = {0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A};
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kSectionEntryBytes = 32;
inline constexpr size_t kSectionAlignment = 64;

/// Little-endian writes and reads.
void put_u16(std::vector<uint8_t>& out, uint16_t v);
void put_u32(std::vector<uint8_t>& out, uint32_t v);
void put_u64(std::vector<uint8_t>& out, uint64_t v);
uint64_t get_le(const uint8_t* p, int bytes);

/// One section to write.
struct Section {
  uint32_t type;
  uint32_t index;
  std::vector<uint8_t> bytes;
};

/// The whole image: header (container `version`, `tile_version`), table and sections, each 64-byte aligned.
std::vector<uint8_t> image_of(const std::vector<Section>& sections, uint16_t version, uint16_t tile_version);

/// One section of a parsed image.
struct SectionRef {
  uint32_t type;
  uint32_t index;
  std::span<const uint8_t> bytes;
};

/// Reads a container without trusting it: every failure throws gaac::Error "<label>: <what>".
class Reader {
 public:
  Reader(std::span<const uint8_t> image, std::string label) : image_(image), label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& what) const;

  /// The container version (1 or 2, else an error) and the tile format version, from the header.
  uint16_t version() const;
  uint16_t tile_version() const;

  /// Validates the header's size, the section table and every section's place and checksum.
  std::vector<SectionRef> sections() const;

  /// Fails unless every byte outside the header, the section table and the sections is zero. Run after
  /// the sections have been validated, so their own errors are reported first; with it, every byte of a
  /// snapshot is either covered by a checksum or known to be zero.
  void check_padding(const std::vector<SectionRef>& sections) const;

 private:
  std::span<const uint8_t> image_;
  std::string label_;
};

}  // namespace gaac::io::container
