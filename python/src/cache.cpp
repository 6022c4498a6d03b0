// gaac.KvCache and gaac.attend: the paged cache (fill-then-finalize, forks, sliding windows, a byte
// budget) and decode attention over it on the CPU. A cache of format "bf16" is the BF16 twin: the
// same structure and the same attention code, uncompressed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "cache.hpp"
#include "gaac/attention.hpp"
#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gaac::python {
namespace {

void check_sequence(const KvCache& c, SequenceId s) {
  if (!c.contains(s)) throw Error("sequence " + std::to_string(s) + " is not in the cache");
}

using FloatArray = nb::ndarray<const float, nb::device::cpu, nb::c_contig>;  // read only: read-only arrays too
using FloatOut = nb::ndarray<nb::numpy, float>;

}  // namespace

CacheFormat format_of(const std::string& name) {
  if (name == "gaac") return CacheFormat::gaac;
  if (name == "bf16") return CacheFormat::bf16;
  throw Error("format must be 'gaac' or 'bf16', got '" + name + "'");
}

AttentionPath path_of(const std::string& name) {
  if (name == "fused") return AttentionPath::fused;
  if (name == "reference") return AttentionPath::reference;
  throw Error("path must be 'fused' or 'reference', got '" + name + "'");
}

CacheGeometry geometry_of(int layers, int kv_heads, int head_dim, const std::optional<std::vector<int>>& windows) {
  return {layers, kv_heads, head_dim, windows.value_or(std::vector<int>{})};
}

nb::dict usage_dict(const CacheUsage& u) {
  nb::dict d;
  d["budget_bytes"] = u.budget_bytes, d["unit_bytes"] = u.unit_bytes, d["units"] = u.units;
  d["units_free"] = u.units_free, d["compressed_tiles"] = u.compressed_tiles, d["raw_tiles"] = u.raw_tiles;
  d["tail_tiles"] = u.tail_tiles, d["unused_slot_bytes"] = u.unused_slot_bytes, d["sequences"] = u.sequences;
  d["resident_bytes"] = u.resident_bytes(), d["bf16_bytes"] = u.bf16_bytes();
  d["bits_per_element"] = u.bits_per_element();
  return d;
}

void bind_cache(nb::module_& m) {
  nb::class_<KvCache>(m, "KvCache",
                      "A paged KV cache for one model geometry, carved once from a byte budget: tokens append to "
                      "each sequence's BF16 tail, every complete 16-token block is encoded once into a fixed-size "
                      "slot (format 'gaac') or kept BF16 (format 'bf16', the twin). Not thread-safe.")
      .def(
          "__init__",
          [](KvCache* self, int layers, int kv_heads, int head_dim, uint64_t budget_bytes,
             const CalibrationTable* calibration, const std::string& format,
             const std::optional<std::vector<int>>& sliding_window) {
            CacheConfig c;
            c.geometry = geometry_of(layers, kv_heads, head_dim, sliding_window);
            c.format = format_of(format);
            c.budget_bytes = budget_bytes;
            c.calibration = calibration;
            new (self) KvCache(std::move(c));
          },
          "layers"_a, "kv_heads"_a, "head_dim"_a, "budget_bytes"_a, "calibration"_a = nb::none(), "format"_a = "gaac",
          "sliding_window"_a = nb::none(),
          "`calibration` is required for format 'gaac'; `sliding_window` gives each layer's window in tokens (0: "
          "full attention).")
      .def_static(
          "worst_case_budget",
          [](int layers, int kv_heads, int head_dim, int tokens, int sequences, const CalibrationTable* calibration,
             const std::string& format, const std::optional<std::vector<int>>& sliding_window) {
            return worst_case_budget(geometry_of(layers, kv_heads, head_dim, sliding_window), format_of(format),
                                     calibration, tokens, sequences);
          },
          "layers"_a, "kv_heads"_a, "head_dim"_a, "tokens"_a, "sequences"_a = 1, "calibration"_a = nb::none(),
          "format"_a = "gaac", "sliding_window"_a = nb::none(),
          "The smallest budget that surely holds `sequences` sequences of `tokens` tokens, whatever their values.")
      .def_prop_ro("format", [](const KvCache& c) { return std::string(to_string(c.format())); }, "'gaac' or 'bf16'.")
      .def("add_sequence", &KvCache::add_sequence, "A new, empty sequence; returns its id.")
      .def(
          "fork",
          [](KvCache& c, SequenceId parent) {
            check_sequence(c, parent);
            SequenceId child = 0;
            if (c.fork(parent, child) != CacheStatus::ok)
              throw Error(ErrorCode::out_of_space, "fork: the copy of the open block does not fit");
            return child;
          },
          "parent"_a, "A new sequence sharing the parent's complete blocks (its open block copied); returns its id.")
      .def(
          "free",
          [](KvCache& c, SequenceId s) {
            check_sequence(c, s);
            c.free_sequence(s);
          },
          "sequence"_a, "Frees a sequence and every block no other sequence shares.")
      .def(
          "length",
          [](const KvCache& c, SequenceId s) {
            check_sequence(c, s);
            return c.length(s);
          },
          "sequence"_a, "Tokens held for the sequence.")
      .def(
          "can_append",
          [](const KvCache& c, SequenceId s, int tokens) {
            check_sequence(c, s);
            return c.can_append(s, tokens);
          },
          "sequence"_a, "tokens"_a, "True when appending that many tokens cannot fail whatever their values.")
      .def(
          "append",
          [](KvCache& c, SequenceId s, const std::vector<AnyArray>& k, const std::vector<AnyArray>& v) {
            check_sequence(c, s);
            if (k.size() != v.size()) throw Error("append: " + std::to_string(k.size()) + " K layers but " + std::to_string(v.size()) + " V layers");
            std::vector<KvView> kv, vv;
            for (size_t l = 0; l < k.size(); ++l) {
              kv.push_back(view_from(k[l], "append: layer " + std::to_string(l) + " K"));
              vv.push_back(view_from(v[l], "append: layer " + std::to_string(l) + " V"));
            }
            const AppendOutcome r = c.append(s, kv, vv);
            if (r.status != CacheStatus::ok) {
              throw Error(ErrorCode::out_of_space, "append: needs a budget of " + std::string(r.measured ? "" : "at least ") +
                                                       std::to_string(r.budget_needed) + " bytes; the budget is " +
                                                       std::to_string(c.usage().budget_bytes) + " bytes; the cache is unchanged");
            }
          },
          "sequence"_a, "k"_a, "v"_a,
          "Appends the same tokens to every layer (one [tokens, kv_heads, head_dim] array per layer, read in place): a "
          "prefill or decoding tokens. Raises CacheFullError, leaving the cache unchanged, when they do not fit.")
      .def(
          "read",
          [](const KvCache& c, SequenceId s, int layer, const std::string& kind, int first, std::optional<int> count) {
            check_sequence(c, s);
            const TensorKind tk = kind == "k" ? TensorKind::key : kind == "v" ? TensorKind::value
                                                                                 : throw Error("kind must be 'k' or 'v'");
            const int n = count.value_or(c.length(s) - first);
            if (first < 0 || n < 0 || first + n > c.length(s)) throw Error("read: positions out of range");
            KvTensor t{n, c.geometry().kv_heads, c.geometry().head_dim, {}};
            t.data.resize(t.elements());
            c.read(s, layer, tk, first, mutable_view_of(t));
            return array_from(std::move(t));
          },
          "sequence"_a, "layer"_a, "kind"_a, "first"_a = 0, "count"_a = nb::none(),
          "Positions first .. first+count-1 of (sequence, layer, 'k' or 'v'), decoded: [count, kv_heads, head_dim].")
      .def(
          "usage", [](const KvCache& c) { return usage_dict(c.usage()); },
          "Memory and contents: resident bytes, the BF16 bytes of the same values, tiles by class, bits per element.")
      .def("check_invariants", &KvCache::check_invariants, "Checks every internal invariant (for tests).");

  m.def(
      "attend",
      [](const KvCache& cache, int layer, const std::vector<SequenceId>& sequences, const FloatArray& q,
         std::optional<std::vector<int>> positions, std::optional<float> scale, const std::string& path, int splits,
         std::optional<std::vector<AnyArray>> extra_k, std::optional<std::vector<AnyArray>> extra_v) {
        const size_t n = sequences.size();
        if (q.ndim() != 3 || q.shape(0) != n || q.shape(2) != static_cast<size_t>(cache.geometry().head_dim))
          throw Error("attend: q must be float32 [sequences, q_heads, head_dim]");
        if (positions && positions->size() != n) throw Error("attend: one position per sequence");
        if (extra_k.has_value() != extra_v.has_value() || (extra_k && (extra_k->size() != n || extra_v->size() != n)))
          throw Error("attend: extra_k and extra_v go together, one array per sequence");
        const int q_heads = static_cast<int>(q.shape(1)), d = cache.geometry().head_dim;
        auto* out = new std::vector<float>(n * static_cast<size_t>(q_heads) * d);
        nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
        std::vector<AttentionQuery> queries;
        for (size_t i = 0; i < n; ++i) {
          check_sequence(cache, sequences[i]);
          AttentionQuery query{sequences[i], 0, q.data() + i * q_heads * d, out->data() + i * q_heads * d, {}, {}};
          if (extra_k) {
            query.extra_k = view_from((*extra_k)[i], "attend: extra_k[" + std::to_string(i) + "]");
            query.extra_v = view_from((*extra_v)[i], "attend: extra_v[" + std::to_string(i) + "]");
          }
          query.position = positions ? (*positions)[i] : cache.length(sequences[i]) + query.extra_k.tokens - 1;
          queries.push_back(query);
        }
        AttentionOptions o;
        o.q_heads = q_heads;
        o.scale = scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
        o.path = path_of(path);
        o.splits = splits;
        {
          nb::gil_scoped_release release;
          attend(cache, layer, queries, o);
        }
        const size_t shape[3] = {n, static_cast<size_t>(q_heads), static_cast<size_t>(d)};
        return FloatOut(out->data(), 3, shape, owner);
      },
      "cache"_a, "layer"_a, "sequences"_a, "q"_a, "positions"_a = nb::none(), "scale"_a = nb::none(), "path"_a = "fused",
      "splits"_a = 1, "extra_k"_a = nb::none(), "extra_v"_a = nb::none(),
      "Decode attention of one query token per sequence over `layer` of the cache, read in place (compressed "
      "tiles rebuilt in registers by the 'fused' path, decoded first by 'reference'): q is float32 [sequences, "
      "q_heads, head_dim]; each query attends to its sequence's positions up to `positions[i]` (default: its "
      "last), within the layer's sliding window; `extra_k[i]` / `extra_v[i]` ([tokens, kv_heads, head_dim], read in "
      "place) are rows that follow the cached ones, not appended yet (a forward pass's own tokens); `scale` defaults to 1/sqrt(head_dim). Returns float32 [sequences, "
      "q_heads, head_dim]. A GAAC cache and a BF16 cache holding the same values give the same bits.");
}

}  // namespace gaac::python
