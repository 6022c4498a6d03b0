// gaac._gaac: the library on Python arrays. K and V are lists with one array per layer, each
// `[tokens, kv_heads, head_dim]` BF16 (PyTorch bfloat16, or NumPy uint16 holding BF16 bit patterns);
// results are NumPy uint16 arrays of BF16 bit patterns. FP8 caches are uint8 arrays of FP8 bytes with
// their format named ("e4m3", "e5m2"; gaac/__init__.py views torch float8 tensors so). Every gaac::Error
// becomes gaac.GaacError with the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "arrays.hpp"
#include "cache.hpp"
#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/format.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"
#include "io/files.hpp"
#include "io/kv_dump_file.hpp"
#include "paths.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gaac::python {
namespace {

/// Per-layer K and V arrays, as returned to Python.
using Layers = std::pair<std::vector<Bf16Array>, std::vector<Bf16Array>>;

Layers layers_of(KvDump&& dump) {
  Layers out;
  for (KvLayer& l : dump.layers) {
    out.first.push_back(array_from(std::move(l.k)));
    out.second.push_back(array_from(std::move(l.v)));
  }
  return out;
}

TensorKind kind_of(const std::string& kind) {
  if (kind == "k" || kind == "K" || kind == "key") return TensorKind::key;
  if (kind == "v" || kind == "V" || kind == "value") return TensorKind::value;
  throw Error("kind must be 'k' or 'v', got '" + kind + "'");
}

/// Per-layer FP8 K and V arrays.
using Fp8Layers = std::pair<std::vector<U8Array>, std::vector<U8Array>>;

Fp8Layers layers_of(Fp8KvDump&& dump) {
  Fp8Layers out;
  for (Fp8KvLayer& l : dump.layers) {
    out.first.push_back(array_from(std::move(l.k)));
    out.second.push_back(array_from(std::move(l.v)));
  }
  return out;
}

/// "e4m3" or "e5m2" as an element format.
ElementFormat fp8_format_of(const std::string& name) {
  if (name == "e4m3") return ElementFormat::e4m3;
  if (name == "e5m2") return ElementFormat::e5m2;
  throw Error("FP8 format must be 'e4m3' or 'e5m2', got '" + name + "'");
}

/// An in-memory .gaac image (docs/format.md, sections 11 and 14.8), the same bytes `gaac compress` writes.
struct SnapshotImage {
  std::vector<uint8_t> image;
  uint64_t bf16_bytes = 0;
  int layers = 0;
  ElementFormat format = ElementFormat::bf16;

  static SnapshotImage of(std::vector<uint8_t> image, const AnySnapshot& parsed) {
    return std::visit(
        [&](const auto& s) {
          size_t elements = 0;
          for (const auto& l : s.dump.layers) elements += l.k.elements() + l.v.elements();
          return SnapshotImage{std::move(image), 2 * elements, static_cast<int>(s.dump.layers.size()), s.calibration.element_format()};
        },
        parsed);
  }
  /// Bytes of the values in their own format (BF16 or FP8).
  uint64_t source_bytes() const { return bf16_bytes / 2 * static_cast<uint64_t>(element_bytes(format)); }
  double ratio() const { return static_cast<double>(source_bytes()) / static_cast<double>(image.size()); }
};

SnapshotImage snapshot_from_bytes(nb::bytes data) {
  std::vector<uint8_t> image(static_cast<const uint8_t*>(data.data()), static_cast<const uint8_t*>(data.data()) + data.size());
  const AnySnapshot parsed = parse_any_snapshot(image, "snapshot bytes");  // validates every byte
  return SnapshotImage::of(std::move(image), parsed);
}

}  // namespace
}  // namespace gaac::python

NB_MODULE(_gaac, m) {
  using namespace gaac;
  using namespace gaac::python;
  m.doc() = "gaac: lossless compression of BF16 KV caches (GAAC). See the package docstring.";
  // Every gaac::Error is a GaacError; one of ErrorCode::out_of_space a CacheFullError, its subclass.
  // The message may quote a file's bytes: bytes that are not UTF-8 are shown as \xNN escapes.
  static nb::object gaac_error = nb::steal(PyErr_NewException("gaac._gaac.GaacError", PyExc_RuntimeError, nullptr));
  static nb::object cache_full = nb::steal(PyErr_NewException("gaac._gaac.CacheFullError", gaac_error.ptr(), nullptr));
  m.attr("GaacError") = gaac_error;
  m.attr("CacheFullError") = cache_full;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const std::string text = e.what();
      PyObject* message = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
      if (message == nullptr) return;  // the decoding's own error (out of memory) is set
      PyErr_SetObject((e.code() == ErrorCode::out_of_space ? cache_full : gaac_error).ptr(), message);
      Py_DECREF(message);
    }
  });
  bind_cache(m);
  bind_batch_cache(m);
  bind_cuda(m);
  bind_chunk(m);
  m.attr("TILE_FORMAT_VERSION") = kTileFormatVersion;
  m.attr("SNAPSHOT_VERSION") = kSnapshotVersion;

  nb::class_<CalibrationTable>(m, "Calibration",
                               "Calibrated exponent windows (bases) and slot capacities for every layer, K/V, KV head "
                               "and channel of one model's cache.")
      .def_prop_ro("layers", &CalibrationTable::layers, "Layers the table covers.")
      .def_prop_ro("kv_heads", &CalibrationTable::kv_heads, "KV heads per layer.")
      .def_prop_ro("head_dim", &CalibrationTable::head_dim, "Channels per head (64, 128 or 256).")
      .def_prop_ro(
          "element_format", [](const CalibrationTable& t) { return std::string(to_string(t.element_format())); },
          "The element format whose tiles the table codes: 'bf16', 'e4m3' or 'e5m2'.")
      .def(
          "escape_capacity",
          [](const CalibrationTable& t, const std::string& kind, int layer) {
            if (layer < 0 || layer >= t.layers()) throw Error("layer " + std::to_string(layer) + " out of range");
            return t.escape_capacity(kind_of(kind), layer);
          },
          "kind"_a, "layer"_a, "Escape-slot bytes of every tile of (kind 'k' or 'v', layer).")
      .def(
          "save", [](const CalibrationTable& t, const PathArg& path) { save_calibration(t, path.bytes); }, "path"_a,
          "Writes the table as a safetensors file (what `gaac calibrate` writes).")
      .def_static(
          "load", [](const PathArg& path) { return load_calibration(path.bytes); }, "path"_a,
          "Reads a calibration table written by save() or `gaac calibrate`.")
      .def("__repr__", [](const CalibrationTable& t) {
        return "gaac.Calibration(layers=" + std::to_string(t.layers()) + ", kv_heads=" + std::to_string(t.kv_heads()) +
               ", head_dim=" + std::to_string(t.head_dim()) + ", element_format='" + to_string(t.element_format()) + "')";
      });

  m.def(
      "calibrate",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v) {
        const KvDump dump = dump_from(k, v, "calibrate");
        const KvDump* d = &dump;
        return calibrate(std::span<const KvDump* const>(&d, 1));
      },
      "k"_a, "v"_a,
      "Learns exponent windows and slot capacities from a cache: `k` and `v` hold one array per layer, "
      "[tokens, kv_heads, head_dim] bfloat16.");

  nb::class_<SnapshotImage>(m, "Snapshot", "A compressed, lossless copy of a KV cache: a .gaac image in memory.")
      .def_prop_ro("nbytes", [](const SnapshotImage& s) { return s.image.size(); }, "Bytes of the .gaac image.")
      .def_prop_ro("bf16_bytes", [](const SnapshotImage& s) { return s.bf16_bytes; }, "Bytes of the values as BF16.")
      .def_prop_ro("layers", [](const SnapshotImage& s) { return s.layers; }, "Layers it holds.")
      .def_prop_ro(
          "element_format", [](const SnapshotImage& s) { return std::string(to_string(s.format)); },
          "The element format of the values: 'bf16', 'e4m3' or 'e5m2'.")
      .def_prop_ro(
          "ratio", &SnapshotImage::ratio,
          "Bytes of the values in their own format (BF16 or FP8) / image bytes (everything counted: tiles, raw fallbacks, "
          "calibration, container).")
      .def(
          "to_bytes", [](const SnapshotImage& s) { return nb::bytes(reinterpret_cast<const char*>(s.image.data()), s.image.size()); },
          "The .gaac image.")
      .def(
          "save",
          [](const SnapshotImage& s, const PathArg& path) {
            const std::span<const uint8_t> parts[] = {s.image};
            io::write_file_atomic(path.bytes, parts);
          },
          "path"_a, "Writes the image as a .gaac file (to a temporary name, then renamed into place).")
      .def(
          "decompress",
          [](const SnapshotImage& s) -> nb::object {
            AnySnapshot parsed = parse_any_snapshot(s.image, "snapshot");
            if (auto* fp8 = std::get_if<Fp8Snapshot>(&parsed)) return nb::cast(layers_of(std::move(fp8->dump)));
            return nb::cast(layers_of(std::move(std::get<Snapshot>(parsed).dump)));
          },
          "Restores the values bit for bit: (k, v), one array per layer: uint16 BF16 bit patterns, or for an FP8 "
          "snapshot uint8 FP8 bytes (gaac.to_torch(a, element_format) views them as torch float8).")
      .def(
          "scales",
          [](const SnapshotImage& s) -> std::optional<std::pair<std::vector<float>, std::vector<float>>> {
            const AnySnapshot parsed = parse_any_snapshot(s.image, "snapshot");
            const auto* fp8 = std::get_if<Fp8Snapshot>(&parsed);
            if (fp8 == nullptr || fp8->dump.k_scales.empty()) return std::nullopt;
            return std::pair{fp8->dump.k_scales, fp8->dump.v_scales};
          },
          "An FP8 snapshot's per-layer scales (k_scales, v_scales), or None (BF16, or FP8 stored without scales).")
      .def(
          "calibration",
          [](const SnapshotImage& s) {
            return std::visit([](auto&& x) { return std::move(x.calibration); }, parse_any_snapshot(s.image, "snapshot"));
          },
          "The calibration the snapshot was compressed with.")
      .def_static("from_bytes", &snapshot_from_bytes, "data"_a, "Parses and fully validates a .gaac image.")
      .def_static(
          "load",
          [](const PathArg& path) {
            std::vector<uint8_t> image = read_snapshot_image(path.bytes);
            const AnySnapshot parsed = parse_any_snapshot(image, path.bytes);
            return SnapshotImage::of(std::move(image), parsed);
          },
          "path"_a, "Reads and fully validates a .gaac file.")
      .def("__repr__", [](const SnapshotImage& s) {
        return "gaac.Snapshot(layers=" + std::to_string(s.layers) + ", element_format='" + to_string(s.format) +
               "', nbytes=" + std::to_string(s.image.size()) + ", ratio=" + std::to_string(s.ratio()) + ")";
      });

  m.def(
      "compress",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const CalibrationTable* calibration) {
        const KvDump dump = dump_from(k, v, "compress");
        CalibrationTable own;
        if (!calibration) {
          const KvDump* d = &dump;
          own = calibrate(std::span<const KvDump* const>(&d, 1));
          calibration = &own;
        }
        std::vector<uint8_t> image = snapshot_image(dump, *calibration);
        return SnapshotImage{std::move(image), dump.bf16_bytes(), static_cast<int>(dump.layers.size()), ElementFormat::bf16};
      },
      "k"_a, "v"_a, "calibration"_a = nb::none(),
      "Compresses a KV cache losslessly: `k` and `v` hold one array per layer, [tokens, kv_heads, head_dim] "
      "bfloat16; without `calibration` the windows are learnt on the values themselves. The image is byte for "
      "byte what `gaac compress` writes for the same values and calibration.");

  m.def(
      "calibrate_fp8",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& format) {
        const Fp8KvDump dump = fp8_dump_from(k, v, fp8_format_of(format), {}, {}, "calibrate");
        const Fp8KvDump* d = &dump;
        return calibrate(std::span<const Fp8KvDump* const>(&d, 1));
      },
      "k"_a, "v"_a, "format"_a,
      "Learns an FP8 calibration table (docs/format.md, section 14.8) from FP8 bytes: `k` and `v` hold one uint8 "
      "array per layer, [tokens, kv_heads, head_dim]; `format` is 'e4m3' or 'e5m2'. gaac.calibrate takes torch "
      "float8 tensors directly.");
  m.def(
      "compress_fp8",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& format, const CalibrationTable* calibration,
         std::optional<std::vector<float>> k_scales, std::optional<std::vector<float>> v_scales) {
        const Fp8KvDump dump = fp8_dump_from(k, v, fp8_format_of(format), k_scales.value_or(std::vector<float>{}),
                                             v_scales.value_or(std::vector<float>{}), "compress");
        CalibrationTable own;
        if (!calibration) {
          const Fp8KvDump* d = &dump;
          own = calibrate(std::span<const Fp8KvDump* const>(&d, 1));
          calibration = &own;
        }
        std::vector<uint8_t> image = snapshot_image(dump, *calibration);
        return SnapshotImage{std::move(image), 2 * dump.fp8_bytes(), static_cast<int>(dump.layers.size()), dump.format};
      },
      "k"_a, "v"_a, "format"_a, "calibration"_a = nb::none(), "k_scales"_a = nb::none(), "v_scales"_a = nb::none(),
      "Compresses an FP8 KV cache losslessly (GAAC-FP8): uint8 arrays of FP8 bytes per layer, `format` 'e4m3' or "
      "'e5m2', optional per-layer scales stored with it; without `calibration` the windows are learnt on the values. "
      "gaac.compress takes torch float8 tensors directly.");
  m.def(
      "convert_to_fp8",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& format, const std::string& scale) {
        if (scale != "per-tensor" && scale != "none") throw Error("scale must be 'per-tensor' or 'none', got '" + scale + "'");
        Fp8KvDump fp8 = convert_to_fp8(dump_from(k, v, "convert_to_fp8"), fp8_format_of(format),
                                       scale == "none" ? Fp8Scaling::none : Fp8Scaling::per_tensor);
        std::vector<float> k_scales = fp8.k_scales, v_scales = fp8.v_scales;
        auto [k8, v8] = layers_of(std::move(fp8));
        return std::tuple{std::move(k8), std::move(v8), std::move(k_scales), std::move(v_scales)};
      },
      "k"_a, "v"_a, "format"_a, "scale"_a = "per-tensor",
      "Converts a BF16 cache to FP8 as vLLM's FP8 cache write does (`gaac convert`): every value the nearest FP8 value "
      "to float(x) / scale, ties to even, saturated; scale 'per-tensor' (amax / largest FP8 value, per K and per V of a "
      "layer) or 'none'. Returns (k, v, k_scales, v_scales): uint8 FP8 bytes per layer and the scales.");

  m.def(
      "synthetic_kv",
      [](int layers, int kv_heads, int head_dim, int tokens, uint64_t seed) {
        SyntheticKvSpec spec;
        spec.layers = layers, spec.kv_heads = kv_heads, spec.head_dim = head_dim, spec.tokens = tokens, spec.seed = seed;
        return layers_of(make_synthetic_kv(spec));
      },
      "layers"_a = 4, "kv_heads"_a = 2, "head_dim"_a = 128, "tokens"_a = 1000, "seed"_a = 1,
      "A seeded synthetic KV cache (what `gaac synth` writes): (k, v), one array per layer.");

  m.def(
      "load_kv_dump", [](const PathArg& path) { return layers_of(io::load_kv_dump(path.bytes)); }, "path"_a,
      "Reads a KV dump (safetensors, k.<layer> / v.<layer>): (k, v), one array per layer.");
  m.def(
      "save_kv_dump",
      [](const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const PathArg& path) {
        io::save_kv_dump(dump_from(k, v, "save_kv_dump"), path.bytes);
      },
      "k"_a, "v"_a, "path"_a, "Writes a KV dump (safetensors) that `gaac` commands read.");
}
