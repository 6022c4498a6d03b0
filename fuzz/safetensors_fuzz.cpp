// libFuzzer target: arbitrary bytes as a safetensors image, both as they are and behind a length
// prefix that frames them as header text plus data (see framed()). Parsing must either succeed, with every
// tensor's bytes inside the image and consistent with its shape, or throw gaac::Error; anything
// else (a crash, a sanitizer report, another exception) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "gaac/error.hpp"
#include "io/safetensors.hpp"

namespace {

/// Touches every byte of every tensor so that a view outside the image trips AddressSanitizer,
/// and checks the invariants a successful parse promises.
void walk(const gaac::io::SafetensorsFile& file) {
  unsigned sum = 0;
  for (const gaac::io::TensorView& t : file.tensors()) {
    for (const uint8_t b : t.bytes) sum += b;
    const size_t size = gaac::io::dtype_size(t.dtype);
    if (size != 0 && static_cast<uint64_t>(t.elements()) * size != t.bytes.size()) std::abort();
    if (file.find(t.name) != &t) std::abort();
  }
  for (const auto& [key, value] : file.metadata()) sum += static_cast<unsigned>(key.size() + value.size());
  // Keep the loop from being optimised away.
  volatile unsigned sink = sum;
  (void)sink;
}

/// Parses one image, walking it when it is accepted.
void parse_and_walk(std::span<const uint8_t> image) {
  try {
    walk(gaac::io::SafetensorsFile::parse(image, "fuzz"));
  } catch (const gaac::Error&) {
    // Rejected input: the expected outcome for most of it.
  }
}

/// The input behind a length prefix that claims its bytes up to the first NUL as the header, so
/// that mutations of the JSON reach the validation of tensors instead of failing the length check.
std::vector<uint8_t> framed(std::span<const uint8_t> input) {
  const auto nul = std::find(input.begin(), input.end(), uint8_t{0});
  const auto header_length = static_cast<uint64_t>(nul - input.begin());
  std::vector<uint8_t> image(8);
  for (size_t i = 0; i < 8; ++i) image[i] = static_cast<uint8_t>(header_length >> (8 * i));
  image.insert(image.end(), input.begin(), nul);
  if (nul != input.end()) image.insert(image.end(), nul + 1, input.end());
  return image;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  parse_and_walk(input);
  parse_and_walk(framed(input));
  return 0;
}
