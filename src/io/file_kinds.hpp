// Recognising gaac's other file formats by their first bytes, so that a file given in the wrong
// place is named for what it is ("a .gaac snapshot") rather than misread as a bad one.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

namespace gaac::io {

/// A format recognised by its first bytes: what it is, and what a user may want to do with it.
struct OtherFormat {
  const char* what;  ///< "a .gaac snapshot"
  const char* hint;  ///< "`gaac decompress` restores the KV dump it holds"
};

/// What a file that is not of the expected format is, from its first bytes; `what` is nullptr when
/// they are not those of a format gaac knows. The magic numbers are docs/format.md's.
inline OtherFormat other_format(std::span<const uint8_t> image) {
  constexpr std::array<uint8_t, 8> kSnapshotMagic = {0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A};
  constexpr std::array<uint8_t, 4> kGgufMagic = {'G', 'G', 'U', 'F'};
  if (image.size() >= kSnapshotMagic.size() && std::equal(kSnapshotMagic.begin(), kSnapshotMagic.end(), image.begin())) {
    return {"a .gaac snapshot", "`gaac decompress` restores the KV dump it holds"};
  }
  if (image.size() >= kGgufMagic.size() && std::equal(kGgufMagic.begin(), kGgufMagic.end(), image.begin())) {
    return {"a GGUF model", "`gaac capture` writes the KV dump of a text run through it"};
  }
  return {nullptr, nullptr};
}

}  // namespace gaac::io
