#include "cache/unit_pool.hpp"

#include <cstring>
#include <new>

namespace gaac::cache {

size_t UnitPool::allocated_bytes() const {
  const size_t bytes = (static_cast<size_t>(count_) * unit_bytes_ + alignment_ - 1) / alignment_ * alignment_;
  return bytes == 0 ? alignment_ : bytes;
}

UnitPool::UnitPool(uint32_t count, size_t unit_bytes, size_t alignment)
    : count_(count), unit_bytes_(unit_bytes), alignment_(alignment) {
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(alignment_, allocated_bytes())));
  if (!data_) throw std::bad_alloc();
  std::memset(data_.get(), 0, allocated_bytes());
  free_.resize(count);
  for (uint32_t i = 0; i < count; ++i) free_[i] = count - 1 - i;  // unit 0 is taken first
}

UnitPool::UnitPool(const UnitPool& other)
    : count_(other.count_), unit_bytes_(other.unit_bytes_), alignment_(other.alignment_), free_(other.free_) {
  if (!other.data_) return;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(alignment_, allocated_bytes())));
  if (!data_) throw std::bad_alloc();
  std::memcpy(data_.get(), other.data_.get(), allocated_bytes());
}

UnitPool& UnitPool::operator=(const UnitPool& other) {
  if (this != &other) *this = UnitPool(other);
  return *this;
}

}  // namespace gaac::cache
