// KV dumps as safetensors files: `k.<layer>` and `v.<layer>`, BF16, [tokens, kv_heads, head_dim].
// Loading is strict: an unexpected name, dtype or shape is an error, never a silent conversion.
#include "io/kv_dump_file.hpp"

#include <bit>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "gaac/error.hpp"
#include "io/safetensors.hpp"

namespace gaac::io {
namespace {

/// Layer numbers above this are refused as names, so a hostile name cannot ask for a huge table.
constexpr int kMaxLayers = 1 << 20;

/// "k.3", "v.0".
std::string tensor_name(char kind, size_t layer) { return std::string(1, kind) + "." + std::to_string(layer); }

/// Which K or V tensor a name denotes.
struct KvName {
  char kind;  ///< 'k' or 'v'
  int layer;
};

/// Parses "k.<layer>" / "v.<layer>" with a plain decimal layer (no sign, no leading zeros).
std::optional<KvName> parse_kv_name(const std::string& name) {
  if (name.size() < 3 || (name[0] != 'k' && name[0] != 'v') || name[1] != '.') return std::nullopt;
  const std::string digits = name.substr(2);
  if (digits.size() > 7 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  int layer = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    layer = layer * 10 + (c - '0');
  }
  if (layer >= kMaxLayers) return std::nullopt;
  return KvName{name[0], layer};
}

// ---------------------------------------------------------------------------------------------
// Loading

/// The K and V views found for one layer (either may be missing until checked).
struct LayerViews {
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
};

/// Checks a tensor's dtype and rank and returns its shape as [tokens, kv_heads, head_dim].
KvTensor kv_shape(const TensorView& view) {
  if (view.dtype != Dtype::bf16) {
    throw Error("tensor '" + view.name + "' has dtype " + view.dtype_spelling +
                "; a KV dump must be BF16 and gaac never converts silently");
  }
  if (view.shape.size() != 3) {
    throw Error("tensor '" + view.name + "' has " + std::to_string(view.shape.size()) +
                " dimensions; a KV tensor is [tokens, kv_heads, head_dim]");
  }
  for (const int64_t d : view.shape) {
    if (d > INT_MAX) throw Error("tensor '" + view.name + "' has a dimension too large: " + std::to_string(d));
  }
  KvTensor t;
  t.tokens = static_cast<int>(view.shape[0]);
  t.kv_heads = static_cast<int>(view.shape[1]);
  t.head_dim = static_cast<int>(view.shape[2]);
  return t;
}

/// Reads a BF16 tensor's little-endian bytes into host-order bit patterns.
KvTensor read_tensor(const TensorView& view) {
  KvTensor t = kv_shape(view);
  t.data.resize(view.bytes.size() / 2);
  if (!view.bytes.empty()) std::memcpy(t.data.data(), view.bytes.data(), view.bytes.size());
  if constexpr (std::endian::native == std::endian::big) {
    for (uint16_t& x : t.data) x = static_cast<uint16_t>((x >> 8) | (x << 8));
  }
  return t;
}

/// Sorts the file's tensors into layers, refusing any name that is not k.<layer> or v.<layer>.
std::map<int, LayerViews> group_layers(const SafetensorsFile& file) {
  std::map<int, LayerViews> layers;
  for (const TensorView& view : file.tensors()) {
    const std::optional<KvName> kv = parse_kv_name(view.name);
    if (!kv) {
      throw Error("unexpected tensor '" + view.name + "'; a KV dump holds only k.<layer> and v.<layer> tensors");
    }
    LayerViews& layer = layers[kv->layer];
    (kv->kind == 'k' ? layer.k : layer.v) = &view;
  }
  return layers;
}

/// Checks that layers run 0..L-1 with both K and V, and returns them in order.
std::vector<LayerViews> complete_layers(const std::map<int, LayerViews>& layers) {
  std::vector<LayerViews> ordered;
  for (const auto& [index, views] : layers) {
    const auto expected = static_cast<int>(ordered.size());
    if (index != expected) {
      throw Error("no tensors for layer " + std::to_string(expected) + " (found layer " + std::to_string(index) +
                  "); layers must be numbered from 0 without gaps");
    }
    if (views.k == nullptr || views.v == nullptr) {
      const char missing = views.k == nullptr ? 'k' : 'v';
      throw Error("layer " + std::to_string(index) + " lacks " + tensor_name(missing, static_cast<size_t>(index)));
    }
    ordered.push_back(views);
  }
  return ordered;
}

/// Converts a validated safetensors file into a dump and checks it as a whole.
KvDump read_dump(const SafetensorsFile& file) {
  if (const auto format = file.metadata().find("format");
      format != file.metadata().end() && format->second == "gaac-calibration") {
    throw Error("this is a calibration table, not a KV dump (give it with --calib)");
  }
  KvDump dump;
  for (const LayerViews& views : complete_layers(group_layers(file))) {
    dump.layers.push_back({read_tensor(*views.k), read_tensor(*views.v)});
  }
  dump.metadata.assign(file.metadata().begin(), file.metadata().end());
  validate_dump(dump);
  return dump;
}

// ---------------------------------------------------------------------------------------------
// Saving

/// A tensor's bit patterns as little-endian bytes (needed only on big-endian hosts).
[[maybe_unused]] std::vector<uint8_t> little_endian_bytes(const std::vector<uint16_t>& data) {
  std::vector<uint8_t> bytes(data.size() * 2);
  for (size_t i = 0; i < data.size(); ++i) {
    bytes[2 * i] = static_cast<uint8_t>(data[i]);
    bytes[2 * i + 1] = static_cast<uint8_t>(data[i] >> 8);
  }
  return bytes;
}

/// Adds one K or V tensor to the writer as little-endian BF16.
void add_tensor(SafetensorsWriter& writer, const std::string& name, const KvTensor& t) {
  std::vector<int64_t> shape = {t.tokens, t.kv_heads, t.head_dim};
  if constexpr (std::endian::native == std::endian::little) {
    writer.add(name, Dtype::bf16, std::move(shape),
               {reinterpret_cast<const uint8_t*>(t.data.data()), t.data.size() * 2});
  } else {
    writer.add(name, Dtype::bf16, std::move(shape), little_endian_bytes(t.data));
  }
}

}  // namespace

KvDump load_kv_dump(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  try {
    return read_dump(file);
  } catch (const Error& e) {
    throw e.with_context(path);
  }
}

void save_kv_dump(const KvDump& dump, const std::string& path, std::span<const std::string> inputs) {
  SafetensorsWriter writer;
  try {
    validate_dump(dump);
    std::set<std::string> keys;
    for (const auto& [key, value] : dump.metadata) {
      if (!keys.insert(key).second) throw Error("metadata key '" + key + "' appears twice");
      writer.set_metadata(key, value);
    }
    for (size_t i = 0; i < dump.layers.size(); ++i) {
      add_tensor(writer, tensor_name('k', i), dump.layers[i].k);
      add_tensor(writer, tensor_name('v', i), dump.layers[i].v);
    }
  } catch (const Error& e) {
    throw e.with_context(path);
  }
  try {
    writer.write(path, inputs);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::io) throw;  // I/O errors already name the file
    throw e.with_context(path);
  }
}

}  // namespace gaac::io
