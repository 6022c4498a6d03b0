// The calibration the engine uses for a model when none is given: computed once, then cached.
#pragma once

#include <functional>
#include <string>

#include "gaac/calibration.hpp"
#include "model/model.hpp"

namespace gaac::model {

/// The text default calibrations are learnt on (data/calibration_text.txt, built into gaac).
extern const char* const kCalibrationText;
/// Tokens of the text a default calibration reads (at most).
inline constexpr int kDefaultCalibrationTokens = 1024;

/// Where cached calibrations live: $GAAC_CACHE_DIR, else $XDG_CACHE_HOME/gaac, else ~/.cache/gaac,
/// then /calibration.
std::string calibration_cache_dir();

/// The default calibration of the model at `model_path` (loaded as `model`): read from the cache
/// when present, else learnt by running the model over the first kDefaultCalibrationTokens tokens of
/// kCalibrationText with a BF16 cache, calibrating on that KV and saving the table. The cache file is
/// named after the model file and keyed by its size and a hash of its first and last MiB, so another
/// model never reuses it. `note` hears what is being done (for a message on stderr); `path_used`, when
/// not null, receives the cache file's path.
CalibrationTable default_calibration(const Model& model, const std::string& model_path, ThreadPool& pool,
                                     const std::function<void(const std::string&)>& note = {}, std::string* path_used = nullptr);

}  // namespace gaac::model
