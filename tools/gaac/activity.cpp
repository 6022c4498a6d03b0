#include "activity.hpp"

#include <exception>
#include <vector>

namespace gaac::cli {
namespace {

std::vector<std::string>& steps() {
  static std::vector<std::string> open;
  return open;
}

std::string& failed() {
  static std::string step;
  return step;
}

}  // namespace

Activity::Activity(std::string what) : exceptions_at_start_(std::uncaught_exceptions()) {
  steps().push_back(std::move(what));
}

Activity::~Activity() {
  if (std::uncaught_exceptions() > exceptions_at_start_ && failed().empty()) failed() = steps().back();
  steps().pop_back();
}

const std::string& Activity::failed_activity() { return failed(); }

}  // namespace gaac::cli
