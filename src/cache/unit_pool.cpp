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

namespace {

/// A zeroed anonymous mapping of `bytes` bytes (at least one). Its pages are committed when first written:
/// a large budget costs memory only as the cache fills.
uint8_t* map_pool(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw Error("cannot reserve " + std::to_string(bytes) + " bytes for a KV cache's units (" + std::strerror(errno) +
                "); give a smaller budget");
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

UnitPool::UnitPool(uint32_t count, size_t unit_bytes) : count_(count), unit_bytes_(unit_bytes) {
  const size_t bytes = std::max<size_t>(static_cast<size_t>(count) * unit_bytes, 1);
  data_ = std::unique_ptr<uint8_t[], Unmap>(map_pool(bytes), Unmap{bytes});
  free_.resize(count);
  for (uint32_t i = 0; i < count; ++i) free_[i] = count - 1 - i;  // unit 0 is taken first
}

UnitPool::UnitPool(const UnitPool& other) : count_(other.count_), unit_bytes_(other.unit_bytes_), free_(other.free_) {
  if (!other.data_) return;
  const size_t bytes = other.data_.get_deleter().bytes;
  data_ = std::unique_ptr<uint8_t[], Unmap>(map_pool(bytes), Unmap{bytes});
  // Units are taken lowest first and a freed one is taken again before any never taken, so the units ever
  // written are a prefix: the bottom of the free stack is the untouched rest, count-1 down to the first.
  // Copying that prefix gives the same bytes and commits no more pages than the original has.
  uint32_t untouched = 0;
  while (untouched < free_.size() && free_[untouched] == count_ - 1 - untouched) ++untouched;
  std::memcpy(data_.get(), other.data_.get(), static_cast<size_t>(count_ - untouched) * unit_bytes_);
}

UnitPool& UnitPool::operator=(const UnitPool& other) {
  if (this != &other) *this = UnitPool(other);
  return *this;
}

}  // namespace gaac::cache
