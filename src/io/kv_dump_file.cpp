// KV dumps as safetensors files: `k.<layer>` and `v.<layer>`, BF16, [tokens, kv_heads, head_dim]; FP8
// dumps the same in F8_E4M3 or F8_E5M2 with optional `k_scale` / `v_scale`. Loading is strict: an
// unexpected name, dtype or shape is an error, never a silent conversion.
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

/// The safetensors dtype of an element format.
Dtype dtype_of(ElementFormat format) {
  return format == ElementFormat::e4m3 ? Dtype::f8_e4m3 : format == ElementFormat::e5m2 ? Dtype::f8_e5m2 : Dtype::bf16;
}

/// Names of the scale tensors of an FP8 dump.
constexpr const char* kScaleNames[2] = {"k_scale", "v_scale"};

/// Checks a tensor's dtype and rank and returns its shape as [tokens, kv_heads, head_dim].
template <class T>
BasicKvTensor<T> kv_shape(const TensorView& view, ElementFormat format) {
  if (view.dtype != dtype_of(format)) {
    if (format == ElementFormat::bf16) {
      throw Error("tensor '" + view.name + "' has dtype " + view.dtype_spelling +
                  "; a KV dump must be BF16 (or FP8 where a command takes FP8 dumps) and gaac never converts silently");
    }
    throw Error("tensor '" + view.name + "' has dtype " + view.dtype_spelling + " but k.0 is " + dtype_name(dtype_of(format)) +
                "; every tensor of an FP8 dump has the same dtype");
  }
  if (view.shape.size() != 3) {
    throw Error("tensor '" + view.name + "' has " + std::to_string(view.shape.size()) +
                " dimensions; a KV tensor is [tokens, kv_heads, head_dim]");
  }
  for (const int64_t d : view.shape) {
    if (d > INT_MAX) throw Error("tensor '" + view.name + "' has a dimension too large: " + std::to_string(d));
  }
  BasicKvTensor<T> t;
  t.tokens = static_cast<int>(view.shape[0]);
  t.kv_heads = static_cast<int>(view.shape[1]);
  t.head_dim = static_cast<int>(view.shape[2]);
  return t;
}

/// Reads a BF16 tensor's little-endian bytes into host-order bit patterns.
KvTensor read_tensor(const TensorView& view) {
  KvTensor t = kv_shape<uint16_t>(view, ElementFormat::bf16);
  t.data.resize(view.bytes.size() / 2);
  if (!view.bytes.empty()) std::memcpy(t.data.data(), view.bytes.data(), view.bytes.size());
  if constexpr (std::endian::native == std::endian::big) {
    for (uint16_t& x : t.data) x = static_cast<uint16_t>((x >> 8) | (x << 8));
  }
  return t;
}

/// Reads an FP8 tensor's bytes.
Fp8KvTensor read_fp8_tensor(const TensorView& view, ElementFormat format) {
  Fp8KvTensor t = kv_shape<uint8_t>(view, format);
  t.data.assign(view.bytes.begin(), view.bytes.end());
  return t;
}

/// Sorts the file's tensors into layers, refusing any name that is not k.<layer> or v.<layer> (or, in
/// an FP8 dump, k_scale and v_scale).
std::map<int, LayerViews> group_layers(const SafetensorsFile& file, bool fp8) {
  std::map<int, LayerViews> layers;
  for (const TensorView& view : file.tensors()) {
    if (fp8 && (view.name == kScaleNames[0] || view.name == kScaleNames[1])) continue;
    const std::optional<KvName> kv = parse_kv_name(view.name);
    if (!kv) {
      throw Error("unexpected tensor '" + view.name + "'; a KV dump holds only k.<layer> and v.<layer> tensors" +
                  (fp8 ? " and the scales k_scale and v_scale" : ""));
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

/// Refuses a calibration table given as a dump.
void refuse_calibration(const SafetensorsFile& file) {
  if (const auto format = file.metadata().find("format");
      format != file.metadata().end() && format->second == "gaac-calibration") {
    throw Error("this is a calibration table, not a KV dump (give it with --calib)");
  }
}

/// The element format of a dump file, from its k.0 tensor (BF16 when it has none).
ElementFormat file_format(const SafetensorsFile& file) {
  const TensorView* first = file.find("k.0");
  if (first == nullptr) return ElementFormat::bf16;
  return first->dtype == Dtype::f8_e4m3 ? ElementFormat::e4m3 : first->dtype == Dtype::f8_e5m2 ? ElementFormat::e5m2 : ElementFormat::bf16;
}

/// Converts a validated safetensors file into a dump and checks it as a whole.
KvDump read_dump(const SafetensorsFile& file) {
  refuse_calibration(file);
  if (const ElementFormat format = file_format(file); is_fp8(format)) {
    throw Error(std::string("this is an FP8 KV dump (k.0 is ") + dtype_name(dtype_of(format)) +
                "), and a BF16 one is needed here; gaac never converts silently");
  }
  KvDump dump;
  for (const LayerViews& views : complete_layers(group_layers(file, false))) {
    dump.layers.push_back({read_tensor(*views.k), read_tensor(*views.v)});
  }
  dump.metadata.assign(file.metadata().begin(), file.metadata().end());
  validate_dump(dump);
  return dump;
}

/// Reads one F32 [layers] scale tensor.
std::vector<float> read_scales(const TensorView& view, size_t layers) {
  if (view.dtype != Dtype::f32 || view.shape != std::vector<int64_t>{static_cast<int64_t>(layers)}) {
    throw Error("tensor '" + view.name + "' must be F32 [" + std::to_string(layers) + "], one scale per layer");
  }
  std::vector<float> scales(layers);
  for (size_t i = 0; i < layers; ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(view.bytes[4 * i + static_cast<size_t>(b)]) << (8 * b);
    scales[i] = std::bit_cast<float>(bits);
  }
  return scales;
}

/// The FP8 counterpart of read_dump.
Fp8KvDump read_fp8_dump(const SafetensorsFile& file) {
  refuse_calibration(file);
  Fp8KvDump dump;
  dump.format = file_format(file);
  if (!is_fp8(dump.format)) {
    const TensorView* first = file.find("k.0");
    throw Error(std::string("tensor 'k.0' has dtype ") + (first ? first->dtype_spelling : "(none: no k.0)") +
                "; an FP8 KV dump is F8_E4M3 or F8_E5M2");
  }
  for (const LayerViews& views : complete_layers(group_layers(file, true))) {
    dump.layers.push_back({read_fp8_tensor(*views.k, dump.format), read_fp8_tensor(*views.v, dump.format)});
  }
  const TensorView* k_scale = file.find(kScaleNames[0]);
  const TensorView* v_scale = file.find(kScaleNames[1]);
  if ((k_scale == nullptr) != (v_scale == nullptr)) throw Error("an FP8 dump has both k_scale and v_scale or neither");
  if (k_scale != nullptr) {
    dump.k_scales = read_scales(*k_scale, dump.layers.size());
    dump.v_scales = read_scales(*v_scale, dump.layers.size());
  }
  dump.metadata.assign(file.metadata().begin(), file.metadata().end());
  validate_dump(dump);
  return dump;
}

/// Little-endian bytes of floats.
std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    const auto bits = std::bit_cast<uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = static_cast<uint8_t>(bits >> (8 * b));
  }
  return bytes;
}

/// Adds the metadata of a dump, refusing a key that appears twice.
void add_metadata(SafetensorsWriter& writer, const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::set<std::string> keys;
  for (const auto& [key, value] : metadata) {
    if (!keys.insert(key).second) throw Error("metadata key '" + key + "' appears twice");
    writer.set_metadata(key, value);
  }
}

/// Writes the writer's image to `path`, errors naming the file.
void write_to(const SafetensorsWriter& writer, const std::string& path, std::span<const std::string> inputs) {
  try {
    writer.write(path, inputs);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::io) throw;  // I/O errors already name the file
    throw e.with_context(path);
  }
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

Fp8KvDump load_fp8_kv_dump(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  try {
    return read_fp8_dump(file);
  } catch (const Error& e) {
    throw e.with_context(path);
  }
}

AnyKvDump load_any_kv_dump(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  try {
    if (is_fp8(file_format(file))) return read_fp8_dump(file);
    return read_dump(file);
  } catch (const Error& e) {
    throw e.with_context(path);
  }
}

void save_kv_dump(const KvDump& dump, const std::string& path, std::span<const std::string> inputs) {
  SafetensorsWriter writer;
  try {
    validate_dump(dump);
    add_metadata(writer, dump.metadata);
    for (size_t i = 0; i < dump.layers.size(); ++i) {
      add_tensor(writer, tensor_name('k', i), dump.layers[i].k);
      add_tensor(writer, tensor_name('v', i), dump.layers[i].v);
    }
  } catch (const Error& e) {
    throw e.with_context(path);
  }
  write_to(writer, path, inputs);
}

void save_fp8_kv_dump(const Fp8KvDump& dump, const std::string& path, std::span<const std::string> inputs) {
  SafetensorsWriter writer;
  try {
    validate_dump(dump);
    add_metadata(writer, dump.metadata);
    for (size_t i = 0; i < dump.layers.size(); ++i) {
      for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
        const Fp8KvTensor& t = dump.layers[i].of(kind);
        writer.add(tensor_name(kind == TensorKind::key ? 'k' : 'v', i), dtype_of(dump.format), {t.tokens, t.kv_heads, t.head_dim}, t.data);
      }
    }
    if (!dump.k_scales.empty()) {
      const std::vector<int64_t> shape{static_cast<int64_t>(dump.layers.size())};
      writer.add(kScaleNames[0], Dtype::f32, shape, float_bytes(dump.k_scales));
      writer.add(kScaleNames[1], Dtype::f32, shape, float_bytes(dump.v_scales));
    }
  } catch (const Error& e) {
    throw e.with_context(path);
  }
  write_to(writer, path, inputs);
}

}  // namespace gaac::io
