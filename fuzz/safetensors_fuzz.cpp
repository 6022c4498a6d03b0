// libFuzzer target: arbitrary bytes as a safetensors image. Parsing must either succeed, with every
// tensor's bytes inside the image and consistent with its shape, or throw gaac::Error; anything
// else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    walk(gaac::io::SafetensorsFile::parse(std::span<const uint8_t>(data, size), "fuzz"));
  } catch (const gaac::Error&) {
    // Rejected input: the expected outcome for most of it.
  }
  return 0;
}
