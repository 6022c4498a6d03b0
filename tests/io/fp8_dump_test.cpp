// FP8 KV dumps on disk: bit-exact round trips with and without scales, the element type read from the
// file, and clear refusals of mixed dtypes, bad scales and FP8 files where BF16 is needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/synthetic.hpp"
#include "io/kv_dump_file.hpp"
#include "io/safetensors.hpp"
#include "support/temp_dir.hpp"

namespace gaac {
namespace {

Fp8KvDump small_fp8_dump(ElementFormat format, Fp8Scaling scaling) {
  const KvDump bf16 = make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = 64, .tokens = 21, .seed = 5});
  return convert_to_fp8(bf16, format, scaling);
}

void expect_same(const Fp8KvDump& a, const Fp8KvDump& b) {
  EXPECT_EQ(a.format, b.format);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].k.data, b.layers[l].k.data);
    EXPECT_EQ(a.layers[l].v.data, b.layers[l].v.data);
    EXPECT_EQ(a.layers[l].k.tokens, b.layers[l].k.tokens);
  }
  EXPECT_EQ(a.k_scales, b.k_scales);
  EXPECT_EQ(a.v_scales, b.v_scales);
  // Metadata come back in key order (a safetensors header is a map).
  auto sorted = [](std::vector<std::pair<std::string, std::string>> m) {
    std::sort(m.begin(), m.end());
    return m;
  };
  EXPECT_EQ(sorted(a.metadata), sorted(b.metadata));
}

TEST(Fp8DumpFile, RoundTripsBitExactWithAndWithoutScales) {
  test::TempDir dir;
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    Fp8KvDump dump = small_fp8_dump(f, Fp8Scaling::per_tensor);
    io::save_fp8_kv_dump(dump, dir.file("a.safetensors"));
    expect_same(io::load_fp8_kv_dump(dir.file("a.safetensors")), dump);
    const io::AnyKvDump any = io::load_any_kv_dump(dir.file("a.safetensors"));
    ASSERT_TRUE(std::holds_alternative<Fp8KvDump>(any));
    expect_same(std::get<Fp8KvDump>(any), dump);
    dump.k_scales.clear();
    dump.v_scales.clear();
    io::save_fp8_kv_dump(dump, dir.file("b.safetensors"));
    expect_same(io::load_fp8_kv_dump(dir.file("b.safetensors")), dump);
    // The BF16 loader refuses it, naming the dtype.
    try {
      io::load_kv_dump(dir.file("b.safetensors"));
      FAIL() << "an FP8 dump loaded as BF16";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(f == ElementFormat::e4m3 ? "F8_E4M3" : "F8_E5M2"), std::string::npos) << e.what();
    }
  }
  const KvDump bf16 = make_synthetic_kv({.layers = 1, .kv_heads = 1, .head_dim = 64, .tokens = 3, .seed = 1});
  io::save_kv_dump(bf16, dir.file("c.safetensors"));
  EXPECT_TRUE(std::holds_alternative<KvDump>(io::load_any_kv_dump(dir.file("c.safetensors"))));
  EXPECT_THROW(io::load_fp8_kv_dump(dir.file("c.safetensors")), Error);
}

/// Writes tensors (name, dtype, shape, bytes) as a safetensors file.
void write_raw(const std::string& path, const std::vector<std::tuple<std::string, io::Dtype, std::vector<int64_t>>>& tensors) {
  io::SafetensorsWriter writer;
  for (const auto& [name, dtype, shape] : tensors) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    writer.add(name, dtype, shape, std::vector<uint8_t>(static_cast<size_t>(n) * io::dtype_size(dtype), 0x3C));
  }
  writer.write(path);
}

TEST(Fp8DumpFile, RefusesMixedDtypesAndBadScales) {
  test::TempDir dir;
  const std::string path = dir.file("x.safetensors");
  using io::Dtype;
  write_raw(path, {{"k.0", Dtype::f8_e4m3, {2, 1, 64}}, {"v.0", Dtype::f8_e5m2, {2, 1, 64}}});
  EXPECT_THROW(io::load_any_kv_dump(path), Error);
  write_raw(path, {{"k.0", Dtype::f8_e4m3, {2, 1, 64}}, {"v.0", Dtype::f8_e4m3, {2, 1, 64}}, {"k_scale", Dtype::f32, {1}}});
  EXPECT_THROW(io::load_any_kv_dump(path), Error);  // k_scale without v_scale
  write_raw(path, {{"k.0", Dtype::f8_e4m3, {2, 1, 64}}, {"v.0", Dtype::f8_e4m3, {2, 1, 64}}, {"k_scale", Dtype::f32, {2}},
                   {"v_scale", Dtype::f32, {2}}});
  EXPECT_THROW(io::load_any_kv_dump(path), Error);  // two scales for one layer
  write_raw(path, {{"k.0", Dtype::f8_e4m3, {2, 1, 64}}, {"v.0", Dtype::f8_e4m3, {2, 1, 64}}, {"k_scale", Dtype::f16, {1}},
                   {"v_scale", Dtype::f16, {1}}});
  EXPECT_THROW(io::load_any_kv_dump(path), Error);  // not F32
  write_raw(path, {{"k.0", Dtype::f8_e4m3, {2, 1, 64}}, {"v.0", Dtype::f8_e4m3, {2, 1, 64}}, {"k_scale", Dtype::f32, {1}},
                   {"v_scale", Dtype::f32, {1}}});
  const Fp8KvDump ok = io::load_fp8_kv_dump(path);  // 0x3C3C3C3C is a positive finite float
  EXPECT_EQ(ok.k_scales.size(), 1u);
  write_raw(path, {{"k.0", Dtype::bf16, {2, 1, 64}}, {"v.0", Dtype::bf16, {2, 1, 64}}, {"k_scale", Dtype::f32, {1}},
                   {"v_scale", Dtype::f32, {1}}});
  EXPECT_THROW(io::load_any_kv_dump(path), Error);  // scales belong to FP8 dumps only
}

}  // namespace
}  // namespace gaac
