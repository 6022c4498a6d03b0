// gaac inspect: what a GGUF model file holds (architecture, hyper-parameters, tokenizer, tensor census).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "model/gguf.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

using model::GgufArray;
using model::GgufFile;
using model::GgufType;
using model::GgufValue;

/// Arrays up to this long are shown in full; longer ones as their element type and length.
constexpr size_t kMaxShownItems = 32;

/// Tensors of one type.
struct Census {
  uint64_t count = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;

  void add(uint64_t n, uint64_t e, uint64_t b) {
    count += n;
    elements += e;
    bytes += b;
  }
};

/// Everything the command reports, gathered once for both output formats.
struct Report {
  std::string path;
  uint64_t file_bytes = 0;
  std::string architecture;  ///< "" when general.architecture is missing
  std::string name;
  std::vector<std::string> hyper_keys;  ///< `<arch>.*` keys in file order
  std::string tokenizer;                ///< tokenizer.ggml.model, "" when missing
  std::string pre_tokenizer;            ///< tokenizer.ggml.pre, "" when missing
  std::optional<uint64_t> vocab;        ///< length of tokenizer.ggml.tokens
  std::optional<int64_t> bos, eos;
  std::map<uint32_t, Census> by_type;  ///< keyed by ggml type id, so ordered like ggml's enum
  Census total;
};

/// The string at `key`, or "" when it is missing or not a string.
std::string string_or_empty(const GgufFile& file, const std::string& key) {
  const GgufValue* v = file.find(key);
  const auto* s = v ? std::get_if<std::string>(v) : nullptr;
  return s ? *s : "";
}

/// The integer at `key` when there is one.
std::optional<int64_t> int_if_any(const GgufFile& file, const std::string& key) {
  if (file.find(key) == nullptr) return std::nullopt;
  return file.get_int(key);  // present but not an integer: the error names the key
}

Report gather(const GgufFile& file, const std::string& path, uint64_t file_bytes) {
  Report r;
  r.path = path;
  r.file_bytes = file_bytes;
  r.architecture = string_or_empty(file, "general.architecture");
  r.name = string_or_empty(file, "general.name");
  if (!r.architecture.empty()) {
    const std::string prefix = r.architecture + ".";
    for (const auto& [key, value] : file.metadata()) {
      if (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0) r.hyper_keys.push_back(key);
    }
  }
  r.tokenizer = string_or_empty(file, "tokenizer.ggml.model");
  r.pre_tokenizer = string_or_empty(file, "tokenizer.ggml.pre");
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
    if (const auto* a = std::get_if<std::shared_ptr<const GgufArray>>(tokens)) r.vocab = (*a)->items.size();
  }
  r.bos = int_if_any(file, "tokenizer.ggml.bos_token_id");
  r.eos = int_if_any(file, "tokenizer.ggml.eos_token_id");
  for (const model::GgufTensor& t : file.tensors()) {
    const auto elements = static_cast<uint64_t>(t.elements());
    r.by_type[static_cast<uint32_t>(t.type)].add(1, elements, t.bytes.size());
    r.total.add(1, elements, t.bytes.size());
  }
  return r;
}

/// A value as text: numbers as written (f32 at float precision), strings quoted, short arrays in
/// full and long ones as "[u32 x 1000]".
std::string value_text(const GgufValue& value, uint32_t type) {
  if (const auto* u = std::get_if<uint64_t>(&value)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) {
    return type == static_cast<uint32_t>(GgufType::f32) ? fmt::format("{}", static_cast<float>(*d))
                                                         : fmt::format("{}", *d);
  }
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&value)) return quoted_text(*s);
  const auto& array = *std::get<std::shared_ptr<const GgufArray>>(value);
  if (array.items.size() > kMaxShownItems) {
    return fmt::format("[{} x {}]", model::value_type_name(array.type), array.items.size());
  }
  std::string text = "[";
  for (size_t i = 0; i < array.items.size(); ++i) text += (i ? ", " : "") + value_text(array.items[i], array.type);
  return text + "]";
}

/// A value as JSON (f32 at float precision: 1e-06, not 9.99999997e-07), long arrays as
/// {"type": ..., "length": ...}.
nlohmann::json value_json(const GgufValue& value, uint32_t type) {
  if (const auto* u = std::get_if<uint64_t>(&value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) {
    if (type == static_cast<uint32_t>(GgufType::f32) && std::isfinite(*d)) {
      return std::stod(fmt::format("{}", static_cast<float>(*d)));
    }
    return *d;  // (nlohmann writes non-finite numbers as null)
  }
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  const auto& array = *std::get<std::shared_ptr<const GgufArray>>(value);
  if (array.items.size() > kMaxShownItems) {
    return {{"type", model::value_type_name(array.type)}, {"length", array.items.size()}};
  }
  nlohmann::json items = nlohmann::json::array();
  for (const GgufValue& item : array.items) items.push_back(value_json(item, array.type));
  return items;
}

/// "1 '<|im_start|>'" when the id names a token, else just the id; "-" when absent.
std::string token_text(const GgufFile& file, std::optional<int64_t> id) {
  if (!id) return "-";
  std::string text = std::to_string(*id);
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
    if (const auto* a = std::get_if<std::shared_ptr<const GgufArray>>(tokens)) {
      if (*id >= 0 && static_cast<uint64_t>(*id) < (*a)->items.size()) {
        if (const auto* s = std::get_if<std::string>(&(*a)->items[static_cast<size_t>(*id)])) {
          text += " " + quoted_text(*s);
        }
      }
    }
  }
  return text;
}

void print_text(const GgufFile& file, const Report& r) {
  // Every string from the file goes through printable() or quoted_text(): a model file is untrusted
  // text, and none of it may reach a terminal as an escape sequence.
  const auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : printable(s); };
  fmt::print("file          {} ({})\n", printable(r.path), human_bytes(static_cast<double>(r.file_bytes)));
  fmt::print("format        GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at offset {}\n",
             file.version(), file.metadata().size(), file.tensors().size(), file.alignment(), file.data_offset());
  fmt::print("architecture  {}\n", or_dash(r.architecture));
  fmt::print("name          {}\n", or_dash(r.name));
  if (!r.hyper_keys.empty()) {
    fmt::print("\nhyper-parameters ({}.*)\n", printable(r.architecture));
    size_t width = 0;
    const auto shown = [&](const std::string& key) { return printable(key.substr(r.architecture.size() + 1)); };
    for (const std::string& key : r.hyper_keys) width = std::max(width, shown(key).size());
    for (const std::string& key : r.hyper_keys) {
      fmt::print("  {:<{}}  {}\n", shown(key), width,
                 value_text(*file.find(key), static_cast<uint32_t>(file.value_type(key))));
    }
  }
  fmt::print("\ntokenizer     {}{}\n", or_dash(r.tokenizer),
             r.pre_tokenizer.empty() ? "" : " (pre: " + printable(r.pre_tokenizer) + ")");
  fmt::print("vocab size    {}\n", r.vocab ? std::to_string(*r.vocab) : "-");
  fmt::print("BOS           {}\n", token_text(file, r.bos));
  fmt::print("EOS           {}\n", token_text(file, r.eos));
  fmt::print("\n{:<8} {:>6} {:>14} {:>14}\n", "type", "count", "elements", "bytes");
  const auto line = [](const std::string& name, const Census& c) {
    fmt::print("{:<8} {:>6} {:>14} {:>14} {:>11}\n", name, c.count, c.elements, c.bytes,
               human_bytes(static_cast<double>(c.bytes)));
  };
  for (const auto& [id, census] : r.by_type) line(model::ggml_type_info(static_cast<model::GgmlType>(id)).name, census);
  line("total", r.total);
}

nlohmann::json census_json(const Census& c) {
  return {{"count", c.count}, {"elements", c.elements}, {"bytes", c.bytes}};
}

nlohmann::json to_json(const GgufFile& file, const Report& r) {
  const auto string_or_null = [](const std::string& s) { return s.empty() ? nlohmann::json() : nlohmann::json(s); };
  const auto int_or_null = [](std::optional<int64_t> v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  nlohmann::json hyper = nlohmann::json::object();
  for (const std::string& key : r.hyper_keys) hyper[key.substr(r.architecture.size() + 1)] =
        value_json(*file.find(key), static_cast<uint32_t>(file.value_type(key)));
  nlohmann::json by_type = nlohmann::json::object();
  for (const auto& [id, census] : r.by_type) {
    by_type[model::ggml_type_info(static_cast<model::GgmlType>(id)).name] = census_json(census);
  }
  nlohmann::json tensors = census_json(r.total);
  tensors["by_type"] = by_type;
  return {
      {"file", r.path},
      {"file_bytes", r.file_bytes},
      {"gguf_version", file.version()},
      {"metadata_keys", file.metadata().size()},
      {"alignment", file.alignment()},
      {"data_offset", file.data_offset()},
      {"architecture", string_or_null(r.architecture)},
      {"name", string_or_null(r.name)},
      {"hyper_parameters", hyper},
      {"tokenizer",
       {{"model", string_or_null(r.tokenizer)},
        {"pre", string_or_null(r.pre_tokenizer)},
        {"vocab_size", r.vocab ? nlohmann::json(*r.vocab) : nlohmann::json()},
        {"bos_token_id", int_or_null(r.bos)},
        {"eos_token_id", int_or_null(r.eos)}}},
      {"tensors", tensors},
  };
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Architecture, hyper-parameters, tokenizer and tensor census of a GGUF model");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("model", *path, "Model file (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", *json, "Print JSON instead of text");
  cmd->callback([path, json] {
    const GgufFile file = GgufFile::open(*path);
    std::error_code ec;
    const uint64_t file_bytes = std::filesystem::file_size(*path, ec);  // only shown: 0 on failure
    const Report report = gather(file, *path, ec ? 0 : file_bytes);
    if (*json) {
      // ASCII-only JSON: non-ASCII text (control characters included) appears as \u escapes, and
      // bytes that are not UTF-8 as U+FFFD, so no raw byte of the file reaches the terminal.
      fmt::print("{}\n", to_json(file, report).dump(2, ' ', true, nlohmann::json::error_handler_t::replace));
    } else {
      print_text(file, report);
    }
  });
}

}  // namespace gaac::cli
