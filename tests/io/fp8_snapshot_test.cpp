// Snapshots of FP8 dumps: bit-exact round trips (tails, NaN and infinity encodings, scales or none), the
// BF16 reader's refusal of them, and every single-bit corruption detected.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

Fp8KvDump fp8_dump(ElementFormat format, int head_dim, int tokens, bool scales) {
  KvDump bf16 = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = head_dim, .tokens = tokens, .seed = 17});
  Fp8KvDump dump = convert_to_fp8(bf16, format, Fp8Scaling::per_tensor);
  for (auto& layer : dump.layers) {
    for (Fp8KvTensor* t : {&layer.k, &layer.v}) {
      for (size_t i = 0; i < t->data.size(); i += 89) t->data[i] = static_cast<uint8_t>(i % 2 ? 0x7F : 0xFC);  // NaN, -Inf/NaN
    }
  }
  if (!scales) {
    dump.k_scales.clear();
    dump.v_scales.clear();
  }
  return dump;
}

CalibrationTable calibrated(const Fp8KvDump& dump) {
  const Fp8KvDump* dumps[] = {&dump};
  return calibrate(std::span<const Fp8KvDump* const>(dumps));
}

TEST(Fp8Snapshot, RoundTripsBitExact) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    for (const int head_dim : {64, 256}) {
      for (const bool scales : {true, false}) {
        const Fp8KvDump dump = fp8_dump(f, head_dim, 45, scales);
        const CalibrationTable table = calibrated(dump);
        const std::vector<uint8_t> image = snapshot_image(dump, table);
        const AnySnapshot any = parse_any_snapshot(image, "fp8.gaac");
        ASSERT_TRUE(std::holds_alternative<Fp8Snapshot>(any));
        const Fp8Snapshot& back = std::get<Fp8Snapshot>(any);
        EXPECT_EQ(back.dump.format, f);
        ASSERT_EQ(back.dump.layers.size(), dump.layers.size());
        for (size_t l = 0; l < dump.layers.size(); ++l) {
          EXPECT_EQ(back.dump.layers[l].k.data, dump.layers[l].k.data);
          EXPECT_EQ(back.dump.layers[l].v.data, dump.layers[l].v.data);
        }
        EXPECT_EQ(back.dump.k_scales, dump.k_scales);
        EXPECT_EQ(back.dump.v_scales, dump.v_scales);
        EXPECT_EQ(back.dump.metadata, dump.metadata);
        EXPECT_EQ(back.calibration.element_format(), f);
        try {
          parse_snapshot(image, "fp8.gaac");
          FAIL() << "the BF16 reader took an FP8 snapshot";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(std::string("snapshot of ") + to_string(f) + " KV"), std::string::npos) << e.what();
        }
      }
    }
  }
}

TEST(Fp8Snapshot, RefusesATableOfAnotherFormat) {
  const Fp8KvDump dump = fp8_dump(ElementFormat::e4m3, 64, 32, true);
  const Fp8KvDump other = fp8_dump(ElementFormat::e5m2, 64, 32, true);
  EXPECT_THROW(snapshot_image(dump, calibrated(other)), Error);
}

TEST(Fp8Snapshot, EverySingleBitFlipIsDetected) {
  Fp8KvDump dump = fp8_dump(ElementFormat::e5m2, 64, 37, true);
  dump.layers.resize(1);
  dump.k_scales.resize(1);
  dump.v_scales.resize(1);
  const std::vector<uint8_t> image = snapshot_image(dump, calibrated(dump));
  std::mt19937 rng(5);
  for (size_t i = 0; i < image.size(); ++i) {
    std::vector<uint8_t> flipped = image;
    flipped[i] ^= static_cast<uint8_t>(1u << (rng() % 8));
    EXPECT_THROW(parse_any_snapshot(flipped, "flipped"), Error) << "byte " << i;
  }
}

}  // namespace
}  // namespace gaac
