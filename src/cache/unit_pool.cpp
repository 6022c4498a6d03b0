#include "cache/unit_pool.hpp"

#include <cstring>
#include <new>

namespace gaac::cache {

UnitPool::UnitPool(uint32_t count, size_t unit_bytes, size_t alignment) : count_(count), unit_bytes_(unit_bytes) {
  const size_t bytes = (static_cast<size_t>(count) * unit_bytes + alignment - 1) / alignment * alignment;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(alignment, bytes == 0 ? alignment : bytes)));
  if (!data_) throw std::bad_alloc();
  std::memset(data_.get(), 0, bytes);
  free_.resize(count);
  for (uint32_t i = 0; i < count; ++i) free_[i] = count - 1 - i;  // unit 0 is taken first
}

}  // namespace gaac::cache
