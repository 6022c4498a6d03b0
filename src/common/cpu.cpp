#include "common/cpu.hpp"

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace gaac {
namespace {

CpuFeatures probe() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(_M_X64)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx & bit_OSXSAVE) != 0;
  f.fma = (ecx & bit_FMA) != 0;
  f.f16c = (ecx & bit_F16C) != 0;
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = static_cast<uint64_t>(hi) << 32 | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;    // SSE and AVX state saved by the OS
  const bool zmm = (xcr0 & 0xE6) == 0xE6;  // and the AVX-512 state
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  f.avx2 = ymm && (ebx & bit_AVX2) != 0;
  f.bmi2 = (ebx & bit_BMI2) != 0;
  f.fma = f.fma && ymm;
  f.f16c = f.f16c && ymm;
  f.avx512f = zmm && (ebx & bit_AVX512F) != 0;
  f.avx512bw = zmm && (ebx & bit_AVX512BW) != 0;
  f.avx512vl = zmm && (ebx & bit_AVX512VL) != 0;
  f.avx512vbmi = zmm && (ecx & bit_AVX512VBMI) != 0;
  f.gfni = ymm && (ecx & bit_GFNI) != 0;  // only its VEX (AVX) forms are used, which need the YMM state
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

}  // namespace gaac
