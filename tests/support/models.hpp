// Locating the real models (fetched by scripts/fetch_models.py) from tests.
#pragma once

#include <string>

namespace gaac::test {

/// Path of a fetched model's GGUF ("smollm2" or "gemma3"), or "" when it is not in the cache.
/// When the environment sets GAAC_REQUIRE_MODELS=1 (as scripts/test.sh does), a missing model is a
/// test failure rather than a skip.
std::string model_path(const std::string& name);

/// Use at the top of a test: skips (or fails, under GAAC_REQUIRE_MODELS=1) when the model is absent.
#define GAAC_REQUIRE_MODEL(var, name)                                                                   \
  const std::string var = ::gaac::test::model_path(name);                                               \
  if (var.empty()) {                                                                                    \
    if (::gaac::test::models_required()) FAIL() << "model " << name << " not found; run scripts/fetch_models.py"; \
    GTEST_SKIP() << "model " << name << " not fetched (scripts/fetch_models.py)";                       \
  }

/// True when GAAC_REQUIRE_MODELS=1.
bool models_required();

}  // namespace gaac::test
