#include "model/default_calibration.hpp"

#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac::model {
namespace {

/// Hash of the file's size, its first and last MiB, and the calibration text: the cache key.
uint64_t model_key(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::io, path + ": cannot open the model to key its calibration");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  constexpr uint64_t kMiB = 1 << 20;
  std::vector<char> head(static_cast<size_t>(std::min(size, kMiB))), tail(static_cast<size_t>(std::min(size, kMiB)));
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  in.seekg(static_cast<std::streamoff>(size - tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  if (!in) throw Error(ErrorCode::io, path + ": cannot read the model to key its calibration");
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  XXH64_update(state, &size, sizeof size);
  XXH64_update(state, head.data(), head.size());
  XXH64_update(state, tail.data(), tail.size());
  const std::string text(kCalibrationText);
  XXH64_update(state, text.data(), text.size());
  const uint32_t tokens = kDefaultCalibrationTokens;
  XXH64_update(state, &tokens, sizeof tokens);
  const uint64_t key = XXH64_digest(state);
  XXH64_freeState(state);
  return key;
}

}  // namespace

std::string calibration_cache_dir() {
  std::string root;
  if (const char* dir = std::getenv("GAAC_CACHE_DIR"); dir && *dir) {
    root = dir;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    root = std::string(xdg) + "/gaac";
  } else {
    const char* home = std::getenv("HOME");
    root = std::string(home && *home ? home : ".") + "/.cache/gaac";
  }
  return root + "/calibration";
}

CalibrationTable default_calibration(const Model& model, const std::string& model_path, ThreadPool& pool,
                                     const std::function<void(const std::string&)>& note, std::string* path_used) {
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(model_key(model_path)));
  const std::filesystem::path dir = calibration_cache_dir();
  const std::filesystem::path file = dir / (std::filesystem::path(model_path).stem().string() + "-" + key + ".safetensors");
  if (path_used) *path_used = file.string();
  if (std::filesystem::exists(file)) {
    CalibrationTable table = load_calibration(file.string());
    const ModelConfig& c = model.config();
    if (table.layers() == c.layers && table.kv_heads() == c.kv_heads && table.head_dim() == c.head_dim) return table;
  }
  if (note) note("calibrating exponent windows for " + model_path + " (once; cached in " + file.string() + ")");
  const Tokenizer& tok = model.tokenizer();
  std::vector<Token> tokens;
  if (tok.add_bos()) tokens.push_back(tok.bos());
  const std::vector<Token> text = tok.encode(kCalibrationText, false);
  tokens.insert(tokens.end(), text.begin(), text.end());
  if (tokens.size() > static_cast<size_t>(kDefaultCalibrationTokens)) tokens.resize(kDefaultCalibrationTokens);
  CacheConfig config;
  config.geometry = cache_geometry(model.config(), false);
  config.format = CacheFormat::bf16;
  config.budget_bytes = worst_case_budget(config.geometry, CacheFormat::bf16, nullptr, static_cast<int>(tokens.size()));
  KvCache cache(std::move(config));
  KvDump dump;
  {
    Session session(model, pool, cache);
    constexpr size_t kChunk = 64;
    for (size_t i = 0; i < tokens.size(); i += kChunk) session.forward(std::span(tokens).subspan(i, std::min(kChunk, tokens.size() - i)));
    dump = session.kv_dump();
  }
  const KvDump* dumps[] = {&dump};
  CalibrationTable table = calibrate(dumps);
  table.metadata()["source"] = "gaac default calibration text, " + std::to_string(tokens.size()) + " tokens";
  table.metadata()["model"] = std::filesystem::path(model_path).filename().string();
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  try {
    save_calibration(table, file.string());
  } catch (const Error& e) {
    if (note) note(std::string("could not cache the calibration: ") + e.what());
  }
  return table;
}

}  // namespace gaac::model
