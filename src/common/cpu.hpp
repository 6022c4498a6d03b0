// What this CPU can run: the one place the project asks.
#pragma once

namespace gaac {

/// Instruction-set extensions of the CPU the process runs on (all false off x86-64).
struct CpuFeatures {
  bool avx2 = false;
  bool bmi2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vbmi = false;  ///< byte permutes across a register (vpermb, vpermt2b)
  bool gfni = false;        ///< Galois-field byte instructions (vgf2p8affineqb; VEX-encoded with AVX)

  /// AVX2 with the companions every AVX2 kernel of the project may use (BMI2, FMA, F16C).
  bool avx2_set() const { return avx2 && bmi2 && fma && f16c; }
  /// The AVX-512 subset the project's AVX-512 kernels use (F, BW, VL, VBMI), on top of avx2_set().
  bool avx512_set() const { return avx2_set() && avx512f && avx512bw && avx512vl && avx512vbmi; }
};

/// The features of this CPU, probed once through CPUID (and XGETBV: the OS must save the registers).
const CpuFeatures& cpu_features();

}  // namespace gaac
