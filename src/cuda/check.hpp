// CUDA runtime errors as gaac::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gaac/error.hpp"

namespace gaac::cuda {

/// Throws gaac::Error naming `what` and CUDA's message unless `status` is cudaSuccess.
inline void check(cudaError_t status, const std::string& what, SourceLocation loc = SourceLocation()) {
  if (status != cudaSuccess) throw Error(what + ": " + cudaGetErrorString(status), loc);
}

}  // namespace gaac::cuda
