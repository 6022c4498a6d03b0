// The unit pool of a paged cache: one aligned allocation of fixed-size units and a stack of the free
// ones. Allocation is a pop, release a push: O(1), no fragmentation, and a count of free units is
// exactly what an operation can still take. The allocation is an anonymous mapping: reserved at
// once, committed page by page as units are first written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gaac::cache {

/// A pool of `count` units of `unit_bytes` bytes, zeroed, its first byte aligned to a page (at least
/// kPoolAlignment). Copies are deep (a cache's clone).
class UnitPool {
 public:
  UnitPool() = default;
  /// Reserves the pool. Throws gaac::Error saying how much was asked when the system refuses to
  /// reserve it.
  UnitPool(uint32_t count, size_t unit_bytes);
  /// A deep copy: the same units, bytes and free stack, in a mapping of its own.
  UnitPool(const UnitPool& other);
  UnitPool& operator=(const UnitPool& other);
  UnitPool(UnitPool&&) noexcept = default;
  UnitPool& operator=(UnitPool&&) noexcept = default;

  uint32_t count() const { return count_; }
  size_t unit_bytes() const { return unit_bytes_; }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }

  /// Takes a free unit (the caller has checked free_count()).
  uint32_t take() {
    const uint32_t unit = free_.back();
    free_.pop_back();
    return unit;
  }
  /// Returns a unit to the pool.
  void give(uint32_t unit) { free_.push_back(unit); }

  uint8_t* unit(uint32_t index) { return data_.get() + static_cast<size_t>(index) * unit_bytes_; }
  const uint8_t* unit(uint32_t index) const { return data_.get() + static_cast<size_t>(index) * unit_bytes_; }
  const uint8_t* data() const { return data_.get(); }
  /// The free units, in the order they will be taken last to first (for invariant checks).
  const std::vector<uint32_t>& free_units() const { return free_; }

 private:
  /// Unmaps the pool's mapping.
  struct Unmap {
    size_t bytes;  ///< value-initialised (0) by unique_ptr
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], Unmap> data_;
  uint32_t count_ = 0;
  size_t unit_bytes_ = 0;
  std::vector<uint32_t> free_;
};

}  // namespace gaac::cache
