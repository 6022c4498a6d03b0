// libFuzzer target: arbitrary bytes as a KV chunk object (input layout in chunk_fuzz_setup.hpp).
// gaac::ChunkCodec::decode must either fill the chunk or throw gaac::Error; a crash, a sanitizer report
// or any other exception is a bug.
//
// Each object is decoded twice: as it is, and "fixed up" (magic, version and file size set, every
// section checksum recomputed), so that mutations get past the checksums to the validation of the
// structure, the metadata, the storage maps, the tiles and the padding. An accepted object must
// survive a round trip: the values encoded again decode to the same values.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "chunk_fuzz_setup.hpp"
#include "gaac/error.hpp"
#include "io/container.hpp"

namespace {

using gaac::io::get_le;
using gaac::io::put_le;

std::vector<uint8_t> fixed_up(std::span<const uint8_t> input) {
  std::vector<uint8_t> image(input.begin(), input.end());
  if (image.size() < gaac::io::kContainerHeaderBytes) return image;
  std::copy(gaac::io::kContainerMagic.begin(), gaac::io::kContainerMagic.end(), image.begin());
  put_le(&image[8], gaac::kChunkVersion, 2);
  put_le(&image[10], gaac::kTileFormatVersion, 2);
  put_le(&image[16], image.size(), 8);
  const uint64_t count = std::min<uint64_t>(get_le(&image[12], 4), (image.size() - gaac::io::kContainerHeaderBytes) / gaac::io::kSectionEntryBytes);
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t* e = &image[gaac::io::kContainerHeaderBytes + i * gaac::io::kSectionEntryBytes];
    const uint64_t offset = get_le(e + 8, 8), bytes = get_le(e + 16, 8);
    if (offset <= image.size() && bytes <= image.size() - offset) {
      put_le(e + 24, gaac::io::section_checksum(std::span<const uint8_t>(image).subspan(offset, bytes), gaac::kChunkVersion), 8);
    }
  }
  const std::span<const uint8_t> table(&image[gaac::io::kContainerHeaderBytes], count * gaac::io::kSectionEntryBytes);
  put_le(&image[24], gaac::io::table_checksum(table), 8);
  return image;
}

void decode_one(const gaac::ChunkCodec& codec, int tokens, std::span<const uint8_t> object) {
  const gaac::ChunkGeometry g = codec.geometry(tokens);
  std::vector<uint16_t> values(g.elements());
  try {
    codec.decode(object, gaac::fuzz::kChunkKey, gaac::dense_chunk_view(values.data(), g));
  } catch (const gaac::Error&) {
    return;  // rejected: the usual outcome
  }
  // Accepted: encoding the values again must work (a gaac::Error here is not caught, so it aborts)
  // and give back the same values.
  std::vector<uint8_t> again(codec.object_bytes(tokens));
  again.resize(codec.encode(gaac::dense_chunk_view(static_cast<const uint16_t*>(values.data()), g), gaac::fuzz::kChunkKey, again));
  std::vector<uint16_t> back(values.size());
  codec.decode(again, gaac::fuzz::kChunkKey, gaac::dense_chunk_view(back.data(), g));
  if (back != values) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < gaac::fuzz::kChunkInputHeader) return 0;
  const gaac::ChunkCodec& codec = gaac::fuzz::chunk_codec(gaac::fuzz::chunk_head_dim(data[0]));
  const int tokens = gaac::fuzz::chunk_tokens(data[1], data[2]);
  const std::span<const uint8_t> object(data + gaac::fuzz::kChunkInputHeader, size - gaac::fuzz::kChunkInputHeader);
  decode_one(codec, tokens, object);
  decode_one(codec, tokens, fixed_up(object));
  return 0;
}
