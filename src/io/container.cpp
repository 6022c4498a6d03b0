// The .gaac container: header and section table written and read, section checksums.
#include "io/container.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include <utility>

#include "gaac/chunk.hpp"
#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"

namespace gaac::io {

static_assert(kSnapshotVersion == kSnapshotContainer && kChunkVersion == kChunkContainer,
              "the versions written are those container.hpp describes");

void put_le(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

void append_le(std::vector<uint8_t>& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint64_t piece_checksum(std::span<const uint8_t> section, size_t piece) {
  const size_t from = piece * kChecksumPieceBytes;
  return XXH64(section.data() + from, std::min(kChecksumPieceBytes, section.size() - from), 0);
}

uint64_t combine_piece_checksums(std::span<const uint64_t> pieces) {
  std::vector<uint8_t> bytes(8 * pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) put_le(bytes.data() + 8 * i, pieces[i], 8);
  return XXH64(bytes.data(), bytes.size(), 0);
}

uint64_t section_checksum(std::span<const uint8_t> section, uint16_t version) {
  if (version != kChunkContainer) return XXH64(section.data(), section.size(), 0);
  std::vector<uint64_t> pieces(checksum_pieces(section.size()));
  for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = piece_checksum(section, i);
  return combine_piece_checksums(pieces);
}

uint64_t table_checksum(std::span<const uint8_t> table) { return XXH64(table.data(), table.size(), 0); }

void write_container_header(uint16_t version, uint16_t tile_version, std::span<const SectionEntry> entries,
                            uint64_t file_bytes, uint8_t* out) {
  const size_t table_bytes = kSectionEntryBytes * entries.size();
  std::memset(out, 0, first_section_offset(entries.size()));
  uint8_t* table = out + kContainerHeaderBytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    uint8_t* e = table + i * kSectionEntryBytes;
    put_le(e, entries[i].type, 4);
    put_le(e + 4, entries[i].index, 4);
    put_le(e + 8, entries[i].offset, 8);
    put_le(e + 16, entries[i].bytes, 8);
    put_le(e + 24, entries[i].checksum, 8);
  }
  std::copy(kContainerMagic.begin(), kContainerMagic.end(), out);
  put_le(out + 8, version, 2);
  put_le(out + 10, tile_version, 2);
  put_le(out + 12, entries.size(), 4);
  put_le(out + 16, file_bytes, 8);
  put_le(out + 24, table_checksum({table, table_bytes}), 8);
}

std::vector<uint8_t> container_image(const std::vector<Section>& sections, uint16_t version, uint16_t tile_version) {
  if (version == kChunkContainer) throw Error("container_image writes snapshots (versions 1 and 2), not KV chunk objects");
  std::vector<SectionEntry> entries;
  uint64_t offset = first_section_offset(sections.size());
  for (const Section& s : sections) {
    entries.push_back({s.type, s.index, offset, s.bytes.size(), section_checksum(s.bytes, version)});
    offset += align_section(s.bytes.size());
  }
  std::vector<uint8_t> image(offset, 0);
  write_container_header(version, tile_version, entries, offset, image.data());
  for (size_t i = 0; i < sections.size(); ++i) {
    std::copy(sections[i].bytes.begin(), sections[i].bytes.end(), image.begin() + static_cast<std::ptrdiff_t>(entries[i].offset));
  }
  return image;
}

ContainerReader::ContainerReader(std::span<const uint8_t> image, std::string label, std::vector<uint16_t> versions)
    : image_(image), label_(std::move(label)), versions_(std::move(versions)) {}

void ContainerReader::fail(const std::string& what) const { throw Error(label_ + ": " + what); }

uint16_t ContainerReader::version() const {
  if (image_.size() < kContainerHeaderBytes) fail("too short to be a .gaac file (" + std::to_string(image_.size()) + " bytes)");
  if (!std::equal(kContainerMagic.begin(), kContainerMagic.end(), image_.begin())) fail("not a .gaac file (bad magic)");
  const auto version = static_cast<uint16_t>(get_le(&image_[8], 2));
  if (std::find(versions_.begin(), versions_.end(), version) == versions_.end()) {
    const char* kind = version == kBf16SnapshotContainer || version == kSnapshotContainer ? "a .gaac snapshot; "
                       : version == kChunkContainer                                         ? "a KV chunk object; "
                                                                                            : "";
    std::string expected;
    for (size_t i = 0; i < versions_.size(); ++i) {
      expected += (i == 0 ? "" : i + 1 == versions_.size() ? " or " : ", ") + std::to_string(versions_[i]);
    }
    fail("container version " + std::to_string(version) + " is not supported here (" + kind + "expected " + expected + ")");
  }
  return version;
}

uint16_t ContainerReader::tile_version() const {
  version();
  return static_cast<uint16_t>(get_le(&image_[10], 2));
}

uint64_t ContainerReader::file_bytes() const {
  version();
  return get_le(&image_[16], 8);
}

std::vector<SectionRef> ContainerReader::sections(bool verify_checksums, bool allow_trailing) const {
  const uint64_t file_bytes = this->file_bytes();
  if (allow_trailing ? file_bytes > image_.size() : file_bytes != image_.size()) {
    fail("file is " + std::to_string(image_.size()) + " bytes, its header says " + std::to_string(file_bytes) +
         (allow_trailing ? " (truncated)" : " (truncated or padded)"));
  }
  if (file_bytes < kContainerHeaderBytes) fail("its header gives a size shorter than the header");
  const std::span<const uint8_t> image = image_.first(file_bytes);
  const uint64_t count = get_le(&image[12], 4);
  if (count > (image.size() - kContainerHeaderBytes) / kSectionEntryBytes) fail("section table runs past the end of the file");
  const auto table = image.subspan(kContainerHeaderBytes, count * kSectionEntryBytes);
  if (table_checksum(table) != get_le(&image[24], 8)) fail("section table checksum mismatch");
  const uint16_t version = this->version();
  std::vector<SectionRef> out;
  uint64_t previous_end = kContainerHeaderBytes + table.size();
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = table.data() + i * kSectionEntryBytes;
    const uint64_t offset = get_le(e + 8, 8);
    const uint64_t bytes = get_le(e + 16, 8);
    if (offset < previous_end || offset > image.size() || bytes > image.size() - offset) {
      fail("section " + std::to_string(i) + " lies outside the file or overlaps another");
    }
    if (offset != align_section(previous_end)) fail("section " + std::to_string(i) + " does not start at the next 64-byte boundary");
    const auto data = image.subspan(offset, bytes);
    const uint64_t checksum = get_le(e + 24, 8);
    if (verify_checksums && section_checksum(data, version) != checksum) fail("section " + std::to_string(i) + " checksum mismatch");
    out.push_back({static_cast<uint32_t>(get_le(e, 4)), static_cast<uint32_t>(get_le(e + 4, 4)), data, checksum});
    previous_end = offset + bytes;
  }
  if (image.size() != align_section(previous_end)) fail("file does not end at the 64-byte boundary after its last section");
  return out;
}

void ContainerReader::check_padding(const std::vector<SectionRef>& sections) const {
  const uint8_t* from = image_.data() + kContainerHeaderBytes + sections.size() * kSectionEntryBytes;
  for (const SectionRef& s : sections) {
    if (std::any_of(from, s.bytes.data(), [](uint8_t b) { return b != 0; })) fail("padding between sections is not zero");
    from = s.bytes.data() + s.bytes.size();
  }
  const uint8_t* end = image_.data() + get_le(&image_[16], 8);
  if (std::any_of(from, end, [](uint8_t b) { return b != 0; })) fail("padding after the last section is not zero");
}

}  // namespace gaac::io
