// The type table (ggml_types.hpp): every entry's facts agree with one another, with the kernels it
// points to and with the activation formats; ids outside the table read as unknown. (The GGUF
// reader's use of the table is tested in gguf_test.cpp, the kernels against each other in
// quants_test.cpp and quants_q8_test.cpp.)
#include "model/ggml_types.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "model/quants_q8.hpp"

namespace gaac::model {
namespace {

TEST(GgmlTypes, EveryEntryIsConsistent) {
  std::set<std::string> names;
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    SCOPED_TRACE(info.name);
    EXPECT_TRUE(names.insert(info.name).second) << "a second entry of this name";
    EXPECT_EQ(&ggml_type_info(info.type), &info);
    EXPECT_TRUE(supported_type(info.type));
    EXPECT_NE(info.dequantize_blocks, nullptr);
    if (info.block_elements == 1) {  // plain floats: products are float matmuls on rounded activations
      EXPECT_TRUE(info.block_bytes == 2 || info.block_bytes == 4);
      EXPECT_EQ(info.dot_blocks, nullptr);
    } else {
      EXPECT_TRUE(info.block_elements == 32 || info.block_elements == 256);
      // 4 to 8 bits per element, plus scales of a few bytes.
      EXPECT_GT(info.block_bytes, static_cast<size_t>(info.block_elements) / 2);
      EXPECT_LT(info.block_bytes, static_cast<size_t>(info.block_elements) + 8);
      EXPECT_NE(info.dot_blocks, nullptr);
    }
    // A product pairs each weight block with one block of activations.
    EXPECT_EQ(activation_block_elements(info.vec_dot_type), info.block_elements);
    EXPECT_EQ(activation_type(info.type), info.vec_dot_type);
  }
}

TEST(GgmlTypes, DequantizersWriteExactlyTheirBlocks) {
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    SCOPED_TRACE(info.name);
    const auto n = 3 * static_cast<size_t>(info.block_elements);
    const std::vector<uint8_t> zeros(3 * info.block_bytes, 0);
    std::vector<float> out(n + 1, NAN);
    info.dequantize_blocks(zeros.data(), out.data(), 3);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], 0.0f) << i;  // all-zero blocks are zeros
    EXPECT_TRUE(std::isnan(out[n])) << "wrote past the blocks";
  }
}

TEST(GgmlTypes, IdsOutsideTheTableAreUnknown) {
  for (const uint32_t id : {4u, 5u, 9u, 10u, 11u, 15u, 16u, 29u, 31u, 1000u, 0xFFFFFFFFu}) {
    const GgmlTypeInfo& info = ggml_type_info(static_cast<GgmlType>(id));
    EXPECT_EQ(&info, &kUnknownGgmlType) << id;
    EXPECT_FALSE(supported_type(static_cast<GgmlType>(id))) << id;
  }
  EXPECT_STREQ(kUnknownGgmlType.name, "unknown");
  EXPECT_EQ(kUnknownGgmlType.block_elements, 0);
  EXPECT_EQ(kUnknownGgmlType.block_bytes, 0u);
  EXPECT_EQ(kUnknownGgmlType.dequantize_blocks, nullptr);
  EXPECT_EQ(kUnknownGgmlType.dot_blocks, nullptr);
}

}  // namespace
}  // namespace gaac::model
