// gaac._gaac: the library on Python arrays. K and V are lists with one array per layer, each
// `[tokens, kv_heads, head_dim]` BF16 (PyTorch bfloat16, or NumPy uint16 holding BF16 bit patterns);
// results are NumPy uint16 arrays of BF16 bit patterns. Every gaac::Error becomes gaac.GaacError with
// the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "cache.hpp"
#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/format.hpp"
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

/// An in-memory .gaac image (docs/format.md, section 11), the same bytes `gaac compress` writes.
struct SnapshotImage {
  std::vector<uint8_t> image;
  uint64_t bf16_bytes = 0;
  int layers = 0;

  static SnapshotImage of(std::vector<uint8_t> image, const gaac::Snapshot& parsed) {
    return {std::move(image), parsed.dump.bf16_bytes(), static_cast<int>(parsed.dump.layers.size())};
  }
};

SnapshotImage snapshot_from_bytes(nb::bytes data) {
  std::vector<uint8_t> image(static_cast<const uint8_t*>(data.data()), static_cast<const uint8_t*>(data.data()) + data.size());
  const gaac::Snapshot parsed = parse_snapshot(image, "snapshot bytes");  // validates every byte
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
               ", head_dim=" + std::to_string(t.head_dim()) + ")";
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
          "ratio", [](const SnapshotImage& s) { return static_cast<double>(s.bf16_bytes) / static_cast<double>(s.image.size()); },
          "BF16 bytes / image bytes (everything counted: tiles, raw fallbacks, calibration, container).")
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
          [](const SnapshotImage& s) { return layers_of(parse_snapshot(s.image, "snapshot").dump); },
          "Restores the values bit for bit: (k, v), one uint16 array of BF16 bit patterns per layer.")
      .def(
          "calibration", [](const SnapshotImage& s) { return parse_snapshot(s.image, "snapshot").calibration; },
          "The calibration the snapshot was compressed with.")
      .def_static("from_bytes", &snapshot_from_bytes, "data"_a, "Parses and fully validates a .gaac image.")
      .def_static(
          "load",
          [](const PathArg& path) {
            std::vector<uint8_t> image = read_snapshot_image(path.bytes);
            const gaac::Snapshot parsed = parse_snapshot(image, path.bytes);
            return SnapshotImage::of(std::move(image), parsed);
          },
          "path"_a, "Reads and fully validates a .gaac file.")
      .def("__repr__", [](const SnapshotImage& s) {
        return "gaac.Snapshot(layers=" + std::to_string(s.layers) + ", nbytes=" + std::to_string(s.image.size()) +
               ", ratio=" + std::to_string(static_cast<double>(s.bf16_bytes) / static_cast<double>(s.image.size())) + ")";
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
        return SnapshotImage{std::move(image), dump.bf16_bytes(), static_cast<int>(dump.layers.size())};
      },
      "k"_a, "v"_a, "calibration"_a = nb::none(),
      "Compresses a KV cache losslessly: `k` and `v` hold one array per layer, [tokens, kv_heads, head_dim] "
      "bfloat16; without `calibration` the windows are learnt on the values themselves. The image is byte for "
      "byte what `gaac compress` writes for the same values and calibration.");

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
