// libFuzzer target: arbitrary bytes as a GGUF image. Parsing must either succeed, with every tensor's
// bytes inside the image and consistent with its type and shape, or throw gaac::Error; anything else
// (a crash, a sanitizer report, another exception, an allocation beyond libFuzzer's -rss_limit_mb)
// is a bug. Seeds: small valid GGUF files (see tests/model/gguf_test.cpp for the layout).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <variant>

#include "gaac/error.hpp"
#include "model/gguf.hpp"

namespace {

using gaac::model::GgufArray;
using gaac::model::GgufFile;
using gaac::model::GgufTensor;
using gaac::model::GgufValue;

/// Sums a value's contents (recursing into arrays), so that every item is touched.
unsigned touch(const GgufValue& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return static_cast<unsigned>(s->size());
  if (const auto* a = std::get_if<std::shared_ptr<const GgufArray>>(&value)) {
    if (*a == nullptr) std::abort();
    unsigned sum = (*a)->type;
    for (const GgufValue& item : (*a)->items) sum += touch(item);
    return sum;
  }
  return static_cast<unsigned>(value.index());
}

/// Calls every typed getter on `key`; each must return or throw gaac::Error.
unsigned try_getters(const GgufFile& file, const std::string& key) {
  unsigned sum = 0;
  const auto attempt = [&](auto&& get) {
    try {
      get();
      ++sum;
    } catch (const gaac::Error&) {
      // Wrong type for this getter: expected for most of them.
    }
  };
  attempt([&] { sum += static_cast<unsigned>(file.get_string(key).size()); });
  attempt([&] { sum += static_cast<unsigned>(file.get_uint(key)); });
  attempt([&] { sum += static_cast<unsigned>(file.get_int(key)); });
  attempt([&] { sum += file.get_float(key) > 0 ? 1u : 0u; });
  attempt([&] { sum += file.get_bool(key) ? 1u : 0u; });
  attempt([&] { sum += static_cast<unsigned>(file.get_strings(key).size()); });
  attempt([&] { sum += static_cast<unsigned>(file.get_floats(key).size()); });
  attempt([&] { sum += static_cast<unsigned>(file.get_ints(key).size()); });
  return sum;
}

/// Touches everything a parsed file exposes and checks the invariants a successful parse promises.
void walk(const GgufFile& file) {
  if (file.version() != 2 && file.version() != 3) std::abort();
  const uint64_t alignment = file.alignment();
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || file.data_offset() % alignment != 0) std::abort();
  unsigned sum = 0;
  for (const auto& [key, value] : file.metadata()) {
    if (file.find(key) != &value) std::abort();
    if (file.value_type(key) < 0 || file.value_type(key) > 12) std::abort();
    sum += touch(value) + try_getters(file, key);
  }
  for (const GgufTensor& t : file.tensors()) {
    for (const uint8_t b : t.bytes) sum += b;  // a view outside the image trips AddressSanitizer
    if (file.tensor(t.name) != &t) std::abort();
    if (!gaac::model::supported_type(t.type) || t.ne.size() > 4) std::abort();
    if (t.offset % alignment != 0) std::abort();
    if (static_cast<uint64_t>(t.rows()) * t.row_bytes() != t.bytes.size()) std::abort();
  }
  volatile unsigned sink = sum;  // keeps the loops from being optimised away
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    walk(GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz"));
  } catch (const gaac::Error&) {
    // Rejected input: the expected outcome for most of it.
  }
  return 0;
}
