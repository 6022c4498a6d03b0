// The device itself and plain device allocations: cudaMalloc, cudaFree and synchronous copies.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "cuda/check.hpp"
#include "gaac/cuda.hpp"

namespace gaac::cuda {

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return count > 0;
}

std::string device_description() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, compute capability " +
         std::to_string(prop.major) + "." + std::to_string(prop.minor);
}

namespace {

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t status = cudaMalloc(&data_, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw Error("device memory: " + std::to_string(bytes) + " bytes (" + gib(bytes) + ") asked for, " + gib(free) +
                " of " + gib(total) + " free on the device (memory other caches, tensors or PyTorch's caching "
                "allocator hold is not free: release them, or call torch.cuda.empty_cache(), or give a smaller budget)");
  }
  check(status, "cudaMalloc of " + std::to_string(bytes) + " bytes");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) throw Error("DeviceBuffer::upload past the end of the allocation");
  if (bytes > 0) check(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) throw Error("DeviceBuffer::download past the end of the allocation");
  if (bytes > 0)
    check(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

DeviceBuffer DeviceBuffer::copy() const {
  DeviceBuffer other(bytes_);
  if (bytes_ > 0) {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // work queued on any stream first
    check(cudaMemcpy(other.data_, data_, bytes_, cudaMemcpyDeviceToDevice), "cudaMemcpy on the device");
  }
  return other;
}

}  // namespace gaac::cuda
