#include "cache/unit_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "gaac/error.hpp"
#include "gaac/paged_layout.hpp"

namespace gaac::cache {

static_assert(kPoolAlignment <= 4096, "a page-aligned mapping must satisfy the pool's alignment");

void UnitPool::Unmap::operator()(uint8_t* p) const { ::munmap(p, bytes); }

UnitPool::UnitPool(uint32_t count, size_t unit_bytes) : count_(count), unit_bytes_(unit_bytes) {
  const size_t bytes = std::max<size_t>(static_cast<size_t>(count) * unit_bytes, 1);
  // Anonymous pages read as zero and are committed when first written: a large budget costs memory
  // only as the cache fills.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw Error("cannot reserve " + std::to_string(bytes) + " bytes for a KV cache's units (" + std::strerror(errno) +
                "); give a smaller budget");
  }
  data_ = std::unique_ptr<uint8_t[], Unmap>(static_cast<uint8_t*>(p), Unmap{bytes});
  free_.resize(count);
  for (uint32_t i = 0; i < count; ++i) free_[i] = count - 1 - i;  // unit 0 is taken first
}

}  // namespace gaac::cache
