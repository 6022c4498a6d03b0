#include "io/snapshot_container.hpp"

#include <xxhash.h>

#include <algorithm>

#include "gaac/error.hpp"

namespace gaac::io::container {
namespace {

uint64_t align(uint64_t n) { return (n + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment; }

}  // namespace

void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::vector<uint8_t> image_of(const std::vector<Section>& sections, uint16_t version, uint16_t tile_version) {
  std::vector<uint8_t> table;
  uint64_t offset = align(kHeaderBytes + kSectionEntryBytes * sections.size());
  for (const Section& s : sections) {
    put_u32(table, s.type);
    put_u32(table, s.index);
    put_u64(table, offset);
    put_u64(table, s.bytes.size());
    put_u64(table, XXH64(s.bytes.data(), s.bytes.size(), 0));
    offset += align(s.bytes.size());
  }
  std::vector<uint8_t> image(kMagic.begin(), kMagic.end());
  put_u16(image, version);
  put_u16(image, tile_version);
  put_u32(image, static_cast<uint32_t>(sections.size()));
  put_u64(image, offset);  // file bytes
  put_u64(image, XXH64(table.data(), table.size(), 0));
  image.insert(image.end(), table.begin(), table.end());
  image.resize(align(image.size()), 0);
  for (const Section& s : sections) {
    image.insert(image.end(), s.bytes.begin(), s.bytes.end());
    image.resize(align(image.size()), 0);
  }
  return image;
}

void Reader::fail(const std::string& what) const { throw Error(label_ + ": " + what); }

uint16_t Reader::version() const { return static_cast<uint16_t>(get_le(&image_[8], 2)); }
uint16_t Reader::tile_version() const { return static_cast<uint16_t>(get_le(&image_[10], 2)); }

std::vector<SectionRef> Reader::sections() const {
  if (image_.size() < kHeaderBytes) fail("too short to be a .gaac file (" + std::to_string(image_.size()) + " bytes)");
  if (!std::equal(kMagic.begin(), kMagic.end(), image_.begin())) fail("not a .gaac file (bad magic)");
  if (version() != 1 && version() != 2) fail("container version " + std::to_string(version()) + " is not supported");
  const uint64_t count = get_le(&image_[12], 4);
  const uint64_t file_bytes = get_le(&image_[16], 8);
  if (file_bytes != image_.size()) {
    fail("file is " + std::to_string(image_.size()) + " bytes, its header says " + std::to_string(file_bytes) +
         " (truncated or padded)");
  }
  if (count > (image_.size() - kHeaderBytes) / kSectionEntryBytes) fail("section table runs past the end of the file");
  const auto table = image_.subspan(kHeaderBytes, count * kSectionEntryBytes);
  if (XXH64(table.data(), table.size(), 0) != get_le(&image_[24], 8)) fail("section table checksum mismatch");
  std::vector<SectionRef> out;
  uint64_t previous_end = kHeaderBytes + table.size();
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = table.data() + i * kSectionEntryBytes;
    const uint64_t offset = get_le(e + 8, 8);
    const uint64_t bytes = get_le(e + 16, 8);
    if (offset < previous_end || offset > image_.size() || bytes > image_.size() - offset) {
      fail("section " + std::to_string(i) + " lies outside the file or overlaps another");
    }
    if (offset != align(previous_end)) fail("section " + std::to_string(i) + " does not start at the next 64-byte boundary");
    const auto data = image_.subspan(offset, bytes);
    if (XXH64(data.data(), data.size(), 0) != get_le(e + 24, 8)) fail("section " + std::to_string(i) + " checksum mismatch");
    out.push_back({static_cast<uint32_t>(get_le(e, 4)), static_cast<uint32_t>(get_le(e + 4, 4)), data});
    previous_end = offset + bytes;
  }
  if (image_.size() != align(previous_end)) fail("file does not end at the 64-byte boundary after its last section");
  return out;
}

void Reader::check_padding(const std::vector<SectionRef>& sections) const {
  const uint8_t* from = image_.data() + kHeaderBytes + sections.size() * kSectionEntryBytes;
  for (const SectionRef& s : sections) {
    if (std::any_of(from, s.bytes.data(), [](uint8_t b) { return b != 0; })) fail("padding between sections is not zero");
    from = s.bytes.data() + s.bytes.size();
  }
  if (std::any_of(from, image_.data() + image_.size(), [](uint8_t b) { return b != 0; })) {
    fail("padding after the last section is not zero");
  }
}

}  // namespace gaac::io::container
