// Minimal stand-in for <glog/logging.h>, enough for DietGPU's CHECK macros (CHECK, CHECK_EQ/NE/LE/LT/GE/GT)
// so its float codec builds without glog. A failed check throws std::runtime_error carrying the message;
// the C wrapper (dietgpu_capi.cu) catches it and reports it through dietgpu_error().
#pragma once
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace glog_stub {
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  ~CheckFailure() noexcept(false) { throw std::runtime_error(stream_.str()); }
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};
struct Voidify {
  void operator&(CheckFailure&) {}
  void operator&(CheckFailure&&) {}
};
}  // namespace glog_stub

#define CHECK(condition) \
  (condition) ? (void)0 : glog_stub::Voidify() & glog_stub::CheckFailure(__FILE__, __LINE__, #condition)
#define GLOG_STUB_CHECK_OP(a, b, op) CHECK((a)op(b))
#define CHECK_EQ(a, b) GLOG_STUB_CHECK_OP(a, b, ==)
#define CHECK_NE(a, b) GLOG_STUB_CHECK_OP(a, b, !=)
#define CHECK_LE(a, b) GLOG_STUB_CHECK_OP(a, b, <=)
#define CHECK_LT(a, b) GLOG_STUB_CHECK_OP(a, b, <)
#define CHECK_GE(a, b) GLOG_STUB_CHECK_OP(a, b, >=)
#define CHECK_GT(a, b) GLOG_STUB_CHECK_OP(a, b, >)
#define DCHECK(condition) CHECK(condition)
