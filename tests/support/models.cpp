#include "support/models.hpp"

#include <cstdlib>
#include <filesystem>
#include <map>

namespace gaac::test {

namespace {
std::string cache_dir() {
  if (const char* dir = std::getenv("GAAC_MODEL_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/gaac/models";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/gaac/models";
}
}  // namespace

std::string model_path(const std::string& name) {
  static const std::map<std::string, std::string> files = {
      {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
      {"gemma3", "gemma-3-270m-q4_k_m.gguf"},
  };
  const auto it = files.find(name);
  if (it == files.end()) return "";
  const std::string path = cache_dir() + "/" + it->second;
  return std::filesystem::exists(path) ? path : "";
}

bool models_required() {
  const char* v = std::getenv("GAAC_REQUIRE_MODELS");
  return v && std::string(v) == "1";
}

}  // namespace gaac::test
