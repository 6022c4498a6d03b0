// Calibration: window choice on hand-made dumps, the escape-capacity optimiser on hand-made escape
// histograms, streaming accumulation, and the calibration file format (round trip and refusals).
#include "gaac/calibration.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"
#include "io/safetensors.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

namespace fs = std::filesystem;
using test::bf16_bits;

constexpr TensorKind kKinds[] = {TensorKind::key, TensorKind::value};

/// A fresh directory for the files of one test, removed at its end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("gaac_calib_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TempDir() { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

/// Exponent of element (layer, kind, token, head, channel).
using ExponentFn = std::function<int(int layer, TensorKind kind, int token, int head, int channel)>;

/// A dump whose every exponent is chosen by `exponent`; signs and mantissas vary so that only the
/// exponent field is common between elements.
KvDump dump_with_exponents(int layers, int heads, int head_dim, int tokens, const ExponentFn& exponent) {
  KvDump dump;
  for (int l = 0; l < layers; ++l) {
    KvLayer layer;
    for (const TensorKind kind : kKinds) {
      KvTensor t{tokens, heads, head_dim, {}};
      t.data.resize(t.elements());
      for (int token = 0; token < tokens; ++token) {
        for (int h = 0; h < heads; ++h) {
          for (int c = 0; c < head_dim; ++c) {
            t.data[(static_cast<size_t>(token) * heads + h) * head_dim + c] =
                bf16_bits((token + c) & 1, exponent(l, kind, token, h, c), token * 7 + c);
          }
        }
      }
      (kind == TensorKind::key ? layer.k : layer.v) = std::move(t);
    }
    dump.layers.push_back(std::move(layer));
  }
  return dump;
}

CalibrationTable windows_of(const KvDump& dump) {
  Calibrator calibrator(static_cast<int>(dump.layers.size()), dump.kv_heads(), dump.head_dim());
  calibrator.add_exponents(dump);
  return calibrator.choose_windows();
}

// ---- window choice ------------------------------------------------------------------------------

TEST(Windows, ChannelsWithKnownExponentRangesGetTheExpectedBases) {
  // Four kinds of channel, each with a hand-computable answer; a shift per layer, kind and head
  // catches any mix-up of the histograms of different (layer, kind, head).
  //  class 0: exponents 100..107, equally often    → b3 = 100 (the one 8-window holding all),
  //                                                   b4 = 92 (lowest 16-window holding all)
  //  class 1: exponents 120..131 (12 values)      → b3 = 120 (all full 8-windows tie at 32),
  //                                                   b4 = 116 (lowest 16-window holding all)
  //  class 2: 60 for ¾ of tokens, 75 otherwise     → b3 = 53 (lowest window holding the 60s),
  //                                                   b4 = 60 (the only 16-window holding both)
  //  class 3: exponent 0 everywhere (±0 and subnormals) → b3 = 0, b4 = 0
  const int tokens = 48;
  for (const int head_dim : {64, 128, 256}) {
    const int heads = head_dim == 256 ? 1 : 2;
    auto shift = [](int l, TensorKind kind, int h) { return 3 * l + (kind == TensorKind::value ? 1 : 0) + 5 * h; };
    const KvDump dump = dump_with_exponents(2, heads, head_dim, tokens, [&](int l, TensorKind kind, int token, int h, int c) {
      const int s = shift(l, kind, h);
      switch (c % 4) {
        case 0: return 100 + s + token % 8;
        case 1: return 120 + s + token % 12;
        case 2: return 60 + s + (token % 4 == 3 ? 15 : 0);
        default: return 0;
      }
    });
    const CalibrationTable table = windows_of(dump);
    for (int l = 0; l < 2; ++l) {
      for (const TensorKind kind : kKinds) {
        for (int h = 0; h < heads; ++h) {
          const int s = shift(l, kind, h);
          const auto b3 = table.b3(kind, l, h);
          const auto b4 = table.b4(kind, l, h);
          for (int c = 0; c < head_dim; ++c) {
            const int want3[] = {100 + s, 120 + s, 53 + s, 0};
            const int want4[] = {92 + s, 116 + s, 60 + s, 0};
            ASSERT_EQ(b3[static_cast<size_t>(c)], want3[c % 4])
                << "head_dim " << head_dim << " layer " << l << " head " << h << " channel " << c;
            ASSERT_EQ(b4[static_cast<size_t>(c)], want4[c % 4])
                << "head_dim " << head_dim << " layer " << l << " head " << h << " channel " << c;
          }
        }
        EXPECT_EQ(table.escape_capacity(kind, l), tile_shape_for(kind, head_dim).max_slot_capacity());
      }
    }
    EXPECT_EQ(table.metadata().at("tokens"), std::to_string(2 * tokens));
  }
}

TEST(Windows, TiesPickTheLowestBase) {
  // Two clusters of equal mass: every window holding one cluster ties with every window holding the
  // other; the lowest base wins, i.e. the lowest window that still holds the lower cluster.
  const KvDump dump = dump_with_exponents(1, 1, 64, 32, [](int, TensorKind, int token, int, int c) {
    if (c == 0) return token % 2 ? 200 : 30;  // 16 × 30, 16 × 200
    if (c == 1) return token % 2 ? 30 : 200;  // same counts, other order
    if (c == 2) return 3;                     // bases 0..3 all hold it
    return 140 + token % 2;                   // 140 and 141: b3 134, b4 126
  });
  const CalibrationTable table = windows_of(dump);
  for (const TensorKind kind : kKinds) {
    const auto b3 = table.b3(kind, 0, 0);
    const auto b4 = table.b4(kind, 0, 0);
    EXPECT_EQ(b3[0], 23);
    EXPECT_EQ(b4[0], 15);
    EXPECT_EQ(b3[1], 23);
    EXPECT_EQ(b4[1], 15);
    EXPECT_EQ(b3[2], 0);
    EXPECT_EQ(b4[2], 0);
    EXPECT_EQ(b3[3], 134);
    EXPECT_EQ(b4[3], 126);
  }
}

TEST(Windows, BasesNeverExceedTheirMaximumEvenAtExponent255) {
  // Exponent 255 (±Inf, NaNs) and the top of the range: the windows must stop at 255.
  const KvDump dump = dump_with_exponents(1, 2, 128, 16, [](int, TensorKind, int token, int h, int c) {
    switch ((c + h) % 3) {
      case 0: return 255;
      case 1: return 250 + token % 6;  // 250..255: only base 248 / 240 holds all
      default: return 254;             // held by 247..248 / 239..240, lowest wins
    }
  });
  const CalibrationTable table = windows_of(dump);
  EXPECT_NO_THROW(table.validate());
  for (const TensorKind kind : kKinds) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 128; ++c) {
        const int cls = (c + h) % 3;
        const uint8_t b3 = table.b3(kind, 0, h)[static_cast<size_t>(c)];
        const uint8_t b4 = table.b4(kind, 0, h)[static_cast<size_t>(c)];
        ASSERT_LE(b3, kMaxBase3);
        ASSERT_LE(b4, kMaxBase4);
        ASSERT_EQ(b3, cls == 2 ? 247 : kMaxBase3) << "channel " << c;
        ASSERT_EQ(b4, cls == 2 ? 239 : kMaxBase4) << "channel " << c;
      }
    }
  }
  // And these bases really code every element in the 3-bit window: no escape byte anywhere.
  Calibrator calibrator(1, 2, 128);
  calibrator.add_escape_sizes(dump, table);
  CalibrationTable with_caps = table;
  calibrator.choose_capacities(with_caps);
  EXPECT_EQ(with_caps.escape_capacity(TensorKind::key, 0), 0u);
  EXPECT_EQ(with_caps.escape_capacity(TensorKind::value, 0), 0u);
}

/// Concatenates the tokens of two dumps of the same geometry, layer by layer.
KvDump concatenate(const KvDump& a, const KvDump& b) {
  KvDump out = a;
  for (size_t l = 0; l < out.layers.size(); ++l) {
    for (const auto member : {&KvLayer::k, &KvLayer::v}) {
      KvTensor& t = out.layers[l].*member;
      const KvTensor& u = b.layers[l].*member;
      t.tokens += u.tokens;
      t.data.insert(t.data.end(), u.data.begin(), u.data.end());
    }
  }
  return out;
}

void expect_same_bases(const CalibrationTable& x, const CalibrationTable& y) {
  ASSERT_EQ(x.layers(), y.layers());
  ASSERT_EQ(x.kv_heads(), y.kv_heads());
  ASSERT_EQ(x.head_dim(), y.head_dim());
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < x.layers(); ++l) {
      for (int h = 0; h < x.kv_heads(); ++h) {
        const auto x3 = x.b3(kind, l, h), y3 = y.b3(kind, l, h), x4 = x.b4(kind, l, h), y4 = y.b4(kind, l, h);
        EXPECT_TRUE(std::equal(x3.begin(), x3.end(), y3.begin())) << "b3 of layer " << l << " head " << h;
        EXPECT_TRUE(std::equal(x4.begin(), x4.end(), y4.begin())) << "b4 of layer " << l << " head " << h;
      }
    }
  }
}

bool any_base_differs(const CalibrationTable& x, const CalibrationTable& y) {
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < x.layers(); ++l) {
      for (int h = 0; h < x.kv_heads(); ++h) {
        const auto x3 = x.b3(kind, l, h), y3 = y.b3(kind, l, h), x4 = x.b4(kind, l, h), y4 = y.b4(kind, l, h);
        if (!std::equal(x3.begin(), x3.end(), y3.begin()) || !std::equal(x4.begin(), x4.end(), y4.begin())) return true;
      }
    }
  }
  return false;
}

TEST(Streaming, ExponentsOfTwoDumpsEqualOneDumpHoldingBoth) {
  for (const int head_dim : {64, 256}) {
    const KvDump a = make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = head_dim, .tokens = 40, .seed = 11});
    const KvDump b = make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = head_dim, .tokens = 57, .seed = 12});
    const KvDump both = concatenate(a, b);

    Calibrator streamed(3, 2, head_dim);
    int calls = 0;
    streamed.add_exponents(a, [&](size_t, size_t) { ++calls; });
    streamed.add_exponents(b);
    Calibrator at_once(3, 2, head_dim);
    at_once.add_exponents(both);
    EXPECT_EQ(calls, 3);  // one progress report per layer
    EXPECT_EQ(streamed.tokens_seen(), at_once.tokens_seen());
    EXPECT_EQ(streamed.tokens_seen(), 3u * 97u);

    const CalibrationTable s = streamed.choose_windows();
    const CalibrationTable o = at_once.choose_windows();
    expect_same_bases(s, o);
    EXPECT_EQ(s.metadata(), o.metadata());
    // The comparison means something only if the second dump moved some window.
    Calibrator only_a(3, 2, head_dim);
    only_a.add_exponents(a);
    EXPECT_TRUE(any_base_differs(only_a.choose_windows(), o));
  }
}

TEST(Streaming, EscapeSizesOfTwoDumpsEqualOneDumpHoldingBoth) {
  // Whole blocks only, so that both ways see the very same tiles.
  const KvDump a = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 128, .tokens = 48, .seed = 21});
  const KvDump b = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 128, .tokens = 80, .seed = 22});
  const KvDump both = concatenate(a, b);
  const KvDump* pair[] = {&a, &b};
  const KvDump* one[] = {&both};
  const CalibrationTable streamed = calibrate(pair);
  const CalibrationTable at_once = calibrate(one);
  expect_same_bases(streamed, at_once);
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(streamed.escape_capacity(kind, l), at_once.escape_capacity(kind, l));
      // Synthetic KV needs some escapes: a capacity of 0 here would make the check vacuous.
      EXPECT_GT(streamed.escape_capacity(kind, l), 0u);
    }
  }
}

TEST(Streaming, MismatchedDumpIsRejected) {
  Calibrator calibrator(2, 2, 64);
  const KvDump wrong = make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = 64, .tokens = 16, .seed = 1});
  EXPECT_THROW(calibrator.add_exponents(wrong), Error);
  const KvDump wider = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 128, .tokens = 16, .seed = 1});
  EXPECT_THROW(calibrator.add_exponents(wider), Error);
  EXPECT_THROW(Calibrator(1, 1, 96), Error);
}

// ---- escape capacity ----------------------------------------------------------------------------

/// Expected resident bytes (times the tile count) at capacity c, written out independently.
double resident_cost(TileShape shape, const std::vector<uint64_t>& counts, size_t c) {
  double cost = 0;
  for (size_t n = 0; n < counts.size(); ++n) {
    cost += static_cast<double>(counts[n]) * static_cast<double>(n <= c ? shape.fixed_bytes() + c : shape.raw_bytes());
  }
  return cost;
}

TEST(EscapeCapacity, ShapeConstantsUsedByTheHandComputations) {
  const TileShape wide{TensorKind::key, 128}, narrow{TensorKind::value, 64};
  EXPECT_EQ(wide.fixed_bytes(), 2880u);
  EXPECT_EQ(wide.raw_bytes(), 4096u);
  EXPECT_EQ(wide.max_slot_capacity(), 1200u);
  EXPECT_EQ(narrow.fixed_bytes(), 1440u);
  EXPECT_EQ(narrow.raw_bytes(), 2048u);
  EXPECT_EQ(narrow.max_slot_capacity(), 592u);
}

TEST(EscapeCapacity, HandMadeHistograms) {
  for (const TileShape shape : test::all_shapes()) {
    // Empty: nothing to optimise.
    EXPECT_EQ(best_escape_capacity(shape, {}), 0u);
    EXPECT_EQ(best_escape_capacity(shape, std::vector<uint64_t>(100, 0)), 0u);
    // Every tile needs nothing.
    EXPECT_EQ(best_escape_capacity(shape, std::vector<uint64_t>{5}), 0u);
    // Every tile needs 40 bytes: the smallest multiple of 16 holding 40 is 48.
    std::vector<uint64_t> forty(41, 0);
    forty[40] = 7;
    EXPECT_EQ(best_escape_capacity(shape, forty), 48u);
    // Exactly 48: no rounding up.
    std::vector<uint64_t> forty_eight(49, 0);
    forty_eight[48] = 3;
    EXPECT_EQ(best_escape_capacity(shape, forty_eight), 48u);
    // Every tile needs more than any slot can hold: all are raw whatever c is; the lowest c wins.
    std::vector<uint64_t> hopeless(shape.max_escape_bytes() + 1, 0);
    hopeless.back() = 9;
    EXPECT_EQ(best_escape_capacity(shape, hopeless), 0u);
  }
}

TEST(EscapeCapacity, BestCapacityComputedByHand) {
  // C = 128: slot(c) = 2880 + c bytes, raw tile 4096 bytes. Costs below are per 100 tiles.
  const TileShape shape{TensorKind::key, 128};
  {
    // 90 tiles need 10 bytes, 10 need 300.
    //   c = 16:  90·2896 + 10·4096 = 260640 + 40960 = 301600
    //   c = 304: 100·3184          = 318400
    // Any other c costs more than one of these (the same tiles fit, the slot is larger), so 16.
    std::vector<uint64_t> counts(301, 0);
    counts[10] = 90;
    counts[300] = 10;
    EXPECT_EQ(resident_cost(shape, counts, 16), 301600.0);
    EXPECT_EQ(resident_cost(shape, counts, 304), 318400.0);
    EXPECT_EQ(best_escape_capacity(shape, counts), 16u);
  }
  {
    // 50 / 50: c = 16: 50·2896 + 50·4096 = 349600; c = 304: 318400 → 304.
    std::vector<uint64_t> counts(301, 0);
    counts[10] = 50;
    counts[300] = 50;
    EXPECT_EQ(resident_cost(shape, counts, 16), 349600.0);
    EXPECT_EQ(best_escape_capacity(shape, counts), 304u);
  }
  {
    // 60 need 0, 30 need 100, 10 need 1000:
    //   c = 0:    60·2880 + 40·4096 = 172800 + 163840 = 336640
    //   c = 112:  90·2992 + 10·4096 = 269280 +  40960 = 310240
    //   c = 1008: 100·3888                            = 388800
    std::vector<uint64_t> counts(1001, 0);
    counts[0] = 60;
    counts[100] = 30;
    counts[1000] = 10;
    EXPECT_EQ(resident_cost(shape, counts, 0), 336640.0);
    EXPECT_EQ(resident_cost(shape, counts, 112), 310240.0);
    EXPECT_EQ(resident_cost(shape, counts, 1008), 388800.0);
    EXPECT_EQ(best_escape_capacity(shape, counts), 112u);
  }
  {
    // C = 64 (slot 1440 + c, raw 2048): 1 tile needs 600 (> 592, never fits), 3 need 592.
    //   c = 0:   4·2048             = 8192
    //   c = 592: 3·2032 + 1·2048    = 8144 → 592, the largest capacity there is.
    const TileShape narrow{TensorKind::value, 64};
    std::vector<uint64_t> counts(601, 0);
    counts[592] = 3;
    counts[600] = 1;
    EXPECT_EQ(resident_cost(narrow, counts, 592), 8144.0);
    EXPECT_EQ(best_escape_capacity(narrow, counts), 592u);
  }
}

TEST(EscapeCapacity, SeededHistogramsMatchBruteForce) {
  std::mt19937_64 rng(2024);
  for (const TileShape shape : test::all_shapes()) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint64_t> counts(shape.max_escape_bytes() + 1, 0);
      const int spikes = 1 + static_cast<int>(rng() % 6);
      for (int s = 0; s < spikes; ++s) {
        // Mostly small sizes, now and then anything up to every group raw.
        const size_t at = rng() % 4 ? rng() % (shape.max_slot_capacity() + 32) : rng() % counts.size();
        counts[at] += 1 + rng() % 1000;
      }
      const size_t got = best_escape_capacity(shape, counts);
      ASSERT_EQ(got % kSlotAlignment, 0u);
      ASSERT_LE(got, shape.max_slot_capacity());
      size_t want = 0;
      double want_cost = std::numeric_limits<double>::infinity();
      for (size_t c = 0; c <= shape.max_slot_capacity(); c += kSlotAlignment) {
        const double cost = resident_cost(shape, counts, c);
        if (cost < want_cost) {
          want_cost = cost;
          want = c;
        }
      }
      ASSERT_EQ(got, want) << "trial " << trial << ", channels " << shape.channels;
    }
  }
}

TEST(EscapeCapacity, CalibratedCapacitiesAreValid) {
  const KvDump dump = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 256, .tokens = 64, .seed = 5});
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  EXPECT_NO_THROW(table.validate());
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < 2; ++l) {
      const size_t c = table.escape_capacity(kind, l);
      EXPECT_EQ(c % kSlotAlignment, 0u);
      EXPECT_LE(c, tile_shape_for(kind, 256).max_slot_capacity());
    }
  }
}

// ---- calibration files --------------------------------------------------------------------------

/// A table with varied bases (including both ends of each range), capacities and metadata.
CalibrationTable varied_table(int layers, int heads, int head_dim, uint64_t seed) {
  CalibrationTable table(layers, heads, head_dim);
  std::mt19937_64 rng(seed);
  for (const TensorKind kind : kKinds) {
    const TileShape shape = tile_shape_for(kind, head_dim);
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        auto b3 = table.b3(kind, l, h);
        auto b4 = table.b4(kind, l, h);
        for (size_t c = 0; c < b3.size(); ++c) {
          b3[c] = static_cast<uint8_t>(c == 0 ? 0 : c == 1 ? kMaxBase3 : rng() % (kMaxBase3 + 1));
          b4[c] = static_cast<uint8_t>(c == 0 ? kMaxBase4 : c == 1 ? 0 : rng() % (kMaxBase4 + 1));
        }
      }
      const size_t steps = shape.max_slot_capacity() / kSlotAlignment + 1;
      const size_t c = l == 0 ? 0 : l == 1 ? shape.max_slot_capacity() : (rng() % steps) * kSlotAlignment;
      table.set_escape_capacity(kind, l, c);
    }
  }
  table.metadata()["tokens"] = "12345";
  table.metadata()["source"] = "unit test, seed " + std::to_string(seed);
  table.metadata()["empty"] = "";
  return table;
}

void expect_same_table(const CalibrationTable& x, const CalibrationTable& y) {
  expect_same_bases(x, y);
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < x.layers(); ++l) EXPECT_EQ(x.escape_capacity(kind, l), y.escape_capacity(kind, l)) << "layer " << l;
  }
  EXPECT_EQ(x.metadata(), y.metadata());
}

TEST(CalibrationFile, SaveLoadRoundTrip) {
  TempDir dir;
  for (const int head_dim : {64, 128, 256}) {
    const CalibrationTable table = varied_table(4, 3, head_dim, static_cast<uint64_t>(head_dim));
    const std::string path = dir.path("table" + std::to_string(head_dim) + ".safetensors");
    save_calibration(table, path);
    const CalibrationTable loaded = load_calibration(path);
    EXPECT_EQ(loaded.layers(), 4);
    EXPECT_EQ(loaded.kv_heads(), 3);
    EXPECT_EQ(loaded.head_dim(), head_dim);
    expect_same_table(table, loaded);
  }
}

TEST(CalibrationFile, CalibratedTableRoundTrips) {
  TempDir dir;
  const KvDump dump = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 128, .tokens = 50, .seed = 3});
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  save_calibration(table, dir.path("c.safetensors"));
  expect_same_table(table, load_calibration(dir.path("c.safetensors")));
}

/// The tensors and metadata of a calibration file, editable before writing.
struct CalibrationParts {
  struct Tensor {
    io::Dtype dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  void write(const std::string& path) const {
    io::SafetensorsWriter writer;
    for (const auto& [name, t] : tensors) writer.add(name, t.dtype, t.shape, t.bytes);
    for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
    writer.write(path);
  }
};

/// A valid table (2 layers, 2 heads, head_dim 64) written out by hand, as docs/format.md says.
CalibrationParts valid_parts() {
  CalibrationParts p;
  const std::vector<int64_t> shape{2, 2, 64};
  for (const std::string prefix : {"k", "v"}) {
    p.tensors[prefix + ".b3"] = {io::Dtype::u8, shape, std::vector<uint8_t>(256, 100)};
    p.tensors[prefix + ".b4"] = {io::Dtype::u8, shape, std::vector<uint8_t>(256, 96)};
  }
  p.tensors["k.b3"].bytes[5] = kMaxBase3;
  p.tensors["v.b4"].bytes[255] = kMaxBase4;
  p.metadata = {{"format", "gaac-calibration"}, {"format_version", "1"}, {"tile_format_version", "1"},
                {"layers", "2"},                {"kv_heads", "2"},       {"head_dim", "64"},
                {"k.escape_capacity", "[16, 32]"}, {"v.escape_capacity", "[592, 0]"}, {"info.tokens", "99"}};
  return p;
}

class MalformedCalibration : public ::testing::Test {
 protected:
  /// The message of the gaac::Error that loading `parts` throws (a test failure if none).
  std::string load_error(const CalibrationParts& parts) {
    const std::string path = dir_.path("bad" + std::to_string(files_++) + ".safetensors");
    parts.write(path);
    return load_error_at(path);
  }
  std::string load_error_at(const std::string& path) {
    try {
      load_calibration(path);
    } catch (const Error& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw something other than gaac::Error: " << e.what();
      return "";
    }
    ADD_FAILURE() << "loaded without error";
    return "";
  }
  void expect_error(const CalibrationParts& parts, const std::string& substring) {
    const std::string message = load_error(parts);
    EXPECT_NE(message.find(substring), std::string::npos) << "message: " << message << "\nwanted: " << substring;
  }
  TempDir dir_;
  int files_ = 0;
};

TEST_F(MalformedCalibration, TheValidFileLoads) {
  // Control: every refusal below comes from the one change each test makes.
  const std::string path = dir_.path("good.safetensors");
  valid_parts().write(path);
  const CalibrationTable table = load_calibration(path);
  EXPECT_EQ(table.b3(TensorKind::key, 0, 0)[5], kMaxBase3);
  EXPECT_EQ(table.b4(TensorKind::value, 1, 1)[63], kMaxBase4);
  EXPECT_EQ(table.b3(TensorKind::value, 1, 1)[63], 100);
  EXPECT_EQ(table.escape_capacity(TensorKind::key, 1), 32u);
  EXPECT_EQ(table.escape_capacity(TensorKind::value, 0), 592u);
  EXPECT_EQ(table.metadata().at("tokens"), "99");
}

TEST_F(MalformedCalibration, WrongMetadataFormat) {
  auto p = valid_parts();
  p.metadata["format"] = "gaac-snapshot";
  expect_error(p, "not a gaac calibration table");
  p.metadata.erase("format");
  expect_error(p, "not a gaac calibration table");
  p = valid_parts();
  p.metadata["tile_format_version"] = "2";
  expect_error(p, "another tile format version");
  p = valid_parts();
  p.metadata.erase("layers");
  expect_error(p, "calibration metadata lacks 'layers'");
  p = valid_parts();
  p.metadata["kv_heads"] = "two";
  expect_error(p, "'kv_heads' is not an integer");
  p.metadata["kv_heads"] = "2x";
  expect_error(p, "'kv_heads' is not an integer");
  p.metadata["kv_heads"] = "99999999999999999999";
  expect_error(p, "'kv_heads' is not an integer");
  p = valid_parts();
  p.metadata["head_dim"] = "96";
  expect_error(p, "head_dim must be 64, 128 or 256");
  p = valid_parts();
  p.metadata["layers"] = "0";
  expect_error(p, "calibration geometry out of range");
  p.metadata["layers"] = "-2";
  expect_error(p, "calibration geometry out of range");
}

TEST_F(MalformedCalibration, MissingTensor) {
  for (const std::string name : {"k.b3", "k.b4", "v.b3", "v.b4"}) {
    auto p = valid_parts();
    p.tensors.erase(name);
    expect_error(p, "tensor '" + name + "' missing, or not U8 [layers, kv_heads, head_dim]");
  }
}

TEST_F(MalformedCalibration, WrongDtypeOrShape) {
  auto p = valid_parts();
  p.tensors["k.b4"].dtype = io::Dtype::i8;
  expect_error(p, "tensor 'k.b4' missing, or not U8");
  p = valid_parts();
  p.tensors["v.b3"].dtype = io::Dtype::u16;
  p.tensors["v.b3"].shape = {2, 2, 32};  // same byte count as U8 [2, 2, 64]
  expect_error(p, "tensor 'v.b3' missing, or not U8");
  p = valid_parts();
  p.tensors["v.b4"].shape = {4, 64};
  expect_error(p, "tensor 'v.b4' missing, or not U8");
  p = valid_parts();
  p.tensors["k.b3"].shape = {2, 2, 64, 1};
  expect_error(p, "tensor 'k.b3' missing, or not U8");
  p = valid_parts();
  p.tensors["k.b3"].shape = {2, 2, 32};
  p.tensors["k.b3"].bytes.resize(128);
  expect_error(p, "tensor 'k.b3' missing, or not U8");
  p = valid_parts();
  p.metadata["layers"] = "1";  // tensors still hold 2 layers
  p.metadata["k.escape_capacity"] = "[16]";
  p.metadata["v.escape_capacity"] = "[16]";
  expect_error(p, "tensor 'k.b3' missing, or not U8");
}

TEST_F(MalformedCalibration, BadCapacityList) {
  const std::pair<const char*, const char*> cases[] = {
      {"[16, 32", "is not a list of one capacity per layer"},
      {"[16]", "is not a list of one capacity per layer"},
      {"[16, 32, 48]", "is not a list of one capacity per layer"},
      {"{\"0\": 16, \"1\": 32}", "is not a list of one capacity per layer"},
      {"16", "is not a list of one capacity per layer"},
      {"", "is not a list of one capacity per layer"},
      {"[16, -16]", "escape capacity of layer 1 is not a count"},
      {"[\"16\", 32]", "escape capacity of layer 0 is not a count"},
      {"[16, 32.0]", "escape capacity of layer 1 is not a count"},
      {"[16, null]", "escape capacity of layer 1 is not a count"},
      {"[16, 8]", "escape capacity 8 is not a multiple of 16"},
      {"[608, 16]", "escape capacity 608 is not a multiple of 16 in [0, 592]"},
      {"[16, 18446744073709551615]", "is not a multiple of 16"},
  };
  for (const auto& [list, message] : cases) {
    auto p = valid_parts();
    p.metadata["v.escape_capacity"] = list;
    SCOPED_TRACE(list);
    expect_error(p, message);
  }
  auto p = valid_parts();
  p.metadata.erase("k.escape_capacity");
  expect_error(p, "metadata lacks 'k.escape_capacity'");
}

TEST_F(MalformedCalibration, BaseOutOfRange) {
  auto p = valid_parts();
  p.tensors["k.b3"].bytes[17] = kMaxBase3 + 1;
  expect_error(p, "calibration base out of range in k at index 17");
  p = valid_parts();
  p.tensors["v.b4"].bytes[200] = kMaxBase4 + 1;
  expect_error(p, "calibration base out of range in v at index 200");
  p = valid_parts();
  p.tensors["v.b3"].bytes[0] = 255;
  expect_error(p, "calibration base out of range in v at index 0");
}

TEST_F(MalformedCalibration, NotACalibrationFileAtAll) {
  const std::string garbage = dir_.path("garbage.safetensors");
  {
    std::FILE* f = std::fopen(garbage.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("definitely not safetensors", f);
    std::fclose(f);
  }
  EXPECT_FALSE(load_error_at(garbage).empty());
  EXPECT_FALSE(load_error_at(dir_.path("missing.safetensors")).empty());
}

TEST(CalibrationTableApi, RejectsInvalidSettings) {
  CalibrationTable table(2, 1, 128);
  EXPECT_THROW(table.set_escape_capacity(TensorKind::key, 0, 8), Error);
  EXPECT_THROW(table.set_escape_capacity(TensorKind::key, 0, 1216), Error);
  EXPECT_THROW(table.set_escape_capacity(TensorKind::key, 2, 16), Error);
  EXPECT_THROW(table.set_escape_capacity(TensorKind::key, -1, 16), Error);
  EXPECT_NO_THROW(table.set_escape_capacity(TensorKind::key, 1, 1200));
  EXPECT_THROW(table.b3(TensorKind::key, 2, 0), Error);
  EXPECT_THROW(table.b4(TensorKind::value, 0, 1), Error);
  EXPECT_THROW(save_calibration(table, "/nonexistent-dir/x.safetensors"), Error);  // I/O failure
  EXPECT_NO_THROW(table.validate());
  table.b3(TensorKind::value, 1, 0)[127] = kMaxBase3 + 1;
  EXPECT_THROW(table.validate(), Error);
  TempDir dir;
  EXPECT_THROW(save_calibration(table, dir.path("never.safetensors")), Error);
  EXPECT_FALSE(fs::exists(dir.path("never.safetensors")));
}

}  // namespace
}  // namespace gaac
