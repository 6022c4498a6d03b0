// What a command is doing, so that a failure with no words of its own (the system running out of
// memory) can still be reported as "ran out of memory while reading the KV dump kv.safetensors".
#pragma once

#include <string>

namespace gaac::cli {

/// Marks a step of a command for as long as it lives. Steps nest; when an exception leaves a step,
/// the innermost one is remembered for failed_activity().
class Activity {
 public:
  /// Starts the step `what` ("reading the KV dump kv.safetensors").
  explicit Activity(std::string what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

  /// The innermost step an exception has left, or "" when none has.
  static const std::string& failed_activity();

 private:
  int exceptions_at_start_;
};

}  // namespace gaac::cli
