// Compile-time check that the tile layout of gaac/format.hpp is usable from CUDA device code and
// gives the same answers there (constexpr evaluation under nvcc). Built only when CUDA is found.
#include "gaac/format.hpp"

namespace {

constexpr gaac::TileShape kKeys{gaac::TensorKind::key, 128};
constexpr gaac::TileShape kValues{gaac::TensorKind::value, 64};

static_assert(kKeys.slot_bytes(0) == 2880);
static_assert(gaac::element_slot(kKeys, 14, 13, 0).channel == 84);
static_assert(gaac::element_slot(kValues, 21, 3, 3).token == 11);
static_assert(gaac::code_word_offset(kKeys, 31, 5) == 768 - 4);
static_assert(gaac::bf16_compose(gaac::bf16_sign_mantissa(0xC0A5), gaac::bf16_exponent(0xC0A5)) == 0xC0A5);

/// Writes, per lane, the token and channel of its first key element: exercises the layout in device code.
__global__ void first_elements(gaac::ElementSlot* out) {
  const int lane = static_cast<int>(threadIdx.x) % gaac::kWarpLanes;
  out[lane] = gaac::element_slot(kKeys, lane, 0, 0);
}

}  // namespace

void gaac_format_device_check_launch(gaac::ElementSlot* out) { first_elements<<<1, gaac::kWarpLanes>>>(out); }
