// KV chunk objects: bit-exact round trips over every tile width, chunks with and without a BF16 tail,
// raw tiles, strided views and thread counts (the same bytes whatever the threads); objects exactly as
// large as the tiles packed plus the container; fixed-size objects; and refusal, with a gaac::Error
// that says why, of every single-byte corruption, every truncation, another calibration, another key,
// another geometry and a snapshot (container versions: docs/format.md, section 12).
#include "gaac/chunk.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

/// A chunk as LMCache holds it, `[2, layers, tokens, kv_heads · head_dim]`, from synthetic KV with some
/// tiles made incompressible (every exponent different) so they are stored raw.
struct Chunk {
  ChunkGeometry geometry;
  std::vector<uint16_t> data;

  ChunkView view() const { return dense_chunk_view(data.data(), geometry); }
  MutableChunkView mutable_view() { return dense_chunk_view(data.data(), geometry); }
};

Chunk make_chunk(const ChunkGeometry& g, uint64_t seed, int raw_every = 7) {
  const KvDump dump = make_synthetic_kv({.layers = g.layers, .kv_heads = g.kv_heads, .head_dim = g.head_dim,
                                         .tokens = std::max(g.tokens, 1), .seed = seed});
  Chunk c{g, std::vector<uint16_t>(g.elements())};
  const MutableChunkView v = c.mutable_view();
  std::mt19937_64 rng(seed);
  for (int l = 0; l < g.layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& t = dump.layers[static_cast<size_t>(l)].of(kind);
      const MutableKvView dst = v.tensor(kind, l);
      for (int tok = 0; tok < g.tokens; ++tok) {
        for (int h = 0; h < g.kv_heads; ++h) {
          for (int ch = 0; ch < g.head_dim; ++ch) {
            uint16_t x = t.at(tok, h, ch);
            // Block 1 of every raw_every-th (layer, head): exponents all over the range.
            if (raw_every > 0 && (l * g.kv_heads + h) % raw_every == 0 && tok / kTileTokens == 1) {
              x = static_cast<uint16_t>(rng());
            }
            dst.at(tok, h)[ch] = x;
          }
        }
      }
    }
  }
  return c;
}

CalibrationTable calibration_for(const Chunk& c) { return calibrate_chunk(c.view()); }

std::vector<uint8_t> encode(const ChunkCodec& codec, const Chunk& c, const std::string& key) {
  std::vector<uint8_t> out(codec.object_bytes(c.geometry.tokens), 0xCD);
  out.resize(codec.encode(c.view(), key, out));
  return out;
}

std::string error_of(const ChunkCodec& codec, const std::vector<uint8_t>& object, const std::string& key, Chunk& into) {
  try {
    codec.decode(object, key, into.mutable_view());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Chunk, RoundTripsBitExactly) {
  for (const int head_dim : {64, 128, 256}) {
    for (const int tokens : {256, 100, 15, 0}) {
      const ChunkGeometry g{3, 2, head_dim, tokens};
      const Chunk c = make_chunk(g, 7 + static_cast<uint64_t>(head_dim + tokens));
      const Chunk calib = make_chunk({3, 2, head_dim, 64}, 99);
      for (const int threads : {1, 3}) {
        for (const double ratio : {0.0, 1.05}) {
          const ChunkCodec codec(calibration_for(calib), {.threads = threads, .object_ratio = ratio});
          const std::vector<uint8_t> object = encode(codec, c, "model@0x1@0@abcd");
          if (ratio != 0) {
            EXPECT_EQ(object.size(), codec.object_bytes(tokens));
          }
          Chunk back{g, std::vector<uint16_t>(g.elements(), 0xBEEF)};
          codec.decode(object, "model@0x1@0@abcd", back.mutable_view());
          ASSERT_EQ(back.data, c.data) << "head_dim " << head_dim << ", tokens " << tokens << ", threads " << threads;
        }
      }
    }
  }
}

TEST(Chunk, SameBytesWhateverTheThreadsAndAsSmallAsThePackedTiles) {
  const ChunkGeometry g{4, 3, 128, 200};
  const Chunk c = make_chunk(g, 3, 5);
  const CalibrationTable table = calibration_for(make_chunk({4, 3, 128, 64}, 4));
  const ChunkCodec one(table, {.threads = 1});
  const std::vector<uint8_t> object = encode(one, c, "k");
  for (const int threads : {2, 5, 64}) EXPECT_EQ(encode(ChunkCodec(table, {.threads = threads}), c, "k"), object);

  // Tiles packed exactly: fixed part and escapes of each, or the raw tile; plus the container.
  const ChunkLayout layout = chunk_layout(g);
  const CalibratedCodecs codecs(table, layout.shape.max_slot_capacity());
  uint64_t escapes = 0;
  size_t raw = 0;
  for (int l = 0; l < g.layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvView t = c.view().tensor(kind, l);
      std::vector<uint8_t> slot(layout.shape.slot_bytes(layout.shape.max_slot_capacity()));
      encode_each_tile(t, codecs.tensor_codecs(kind, l), [&](size_t, TilePosition, const TileEncoding& e, std::span<const uint8_t>) {
        escapes += e.fits ? e.escape_bytes : layout.raw_stream_bytes();
        raw += e.fits ? 0 : 1;
      });
    }
  }
  EXPECT_GT(raw, 0u);
  EXPECT_EQ(object.size(), layout.escape_offset + (escapes + 63) / 64 * 64);
  EXPECT_LE(object.size(), layout.max_object_bytes());
  EXPECT_EQ(one.object_bytes(g.tokens), layout.max_object_bytes());
}

TEST(Chunk, ReadsAndWritesStridedViews) {
  const ChunkGeometry g{2, 2, 64, 48};
  const Chunk c = make_chunk(g, 11);
  const ChunkCodec codec(calibration_for(c), {.threads = 2});
  // The same chunk as [layers, 2, tokens + 3, row + 8] with junk in between.
  const size_t row = 2 * 64, token_stride = row + 8, kind_stride = (48 + 3) * token_stride, layer_stride = 2 * kind_stride;
  std::vector<uint16_t> strided(2 * layer_stride, 0x1234);
  const ChunkView dense = c.view();
  for (int l = 0; l < 2; ++l) {
    for (int k = 0; k < 2; ++k) {
      for (int t = 0; t < 48; ++t) {
        std::copy_n(dense.tensor(k == 0 ? TensorKind::key : TensorKind::value, l).at(t, 0), row,
                    strided.begin() + static_cast<std::ptrdiff_t>(l * layer_stride + k * kind_stride + t * token_stride));
      }
    }
  }
  const ChunkView view{strided.data(), g, kind_stride, layer_stride, token_stride};
  std::vector<uint8_t> object(codec.object_bytes(48));
  object.resize(codec.encode(view, "k", object));
  EXPECT_EQ(object, encode(codec, c, "k"));
  std::vector<uint16_t> back(strided.size(), 0x1234);
  codec.decode(object, "k", MutableChunkView{back.data(), g, kind_stride, layer_stride, token_stride});
  EXPECT_EQ(back, strided);
}

TEST(Chunk, FixedSizeObjectsRefuseWhatDoesNotFit) {
  const ChunkGeometry g{2, 2, 128, 64};
  const Chunk calm = make_chunk(g, 5, 0);
  const Chunk wild = make_chunk(g, 5, 1);  // a raw block in every (layer, head)
  const ChunkCodec codec(calibration_for(calm), {.object_ratio = 1.35});
  const std::vector<uint8_t> object = encode(codec, calm, "k");
  EXPECT_EQ(object.size() % 4096, 0u);
  EXPECT_EQ(object.size(), codec.object_bytes(64));
  std::vector<uint8_t> out(codec.object_bytes(64));
  try {
    codec.encode(wild.view(), "k", out);
    FAIL() << "a chunk larger than the fixed size was encoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_space);
    EXPECT_NE(std::string(e.what()).find("more than the fixed object size"), std::string::npos) << e.what();
  }
  // A ratio the fixed parts alone exceed: objects of the fixed parts' size (in whole pages), too small
  // for the raw tiles.
  const ChunkCodec greedy(calibration_for(calm), {.object_ratio = 1.5});
  EXPECT_EQ(greedy.object_bytes(64), (chunk_layout(g).escape_offset + 4095) / 4096 * 4096);
  std::vector<uint8_t> tight(greedy.object_bytes(64));
  EXPECT_THROW(greedy.encode(wild.view(), "k", tight), Error);
  EXPECT_THROW(ChunkCodec(calibration_for(calm), {.object_ratio = 0.5}), Error);
  EXPECT_THROW(ChunkCodec(calibration_for(calm), {.threads = 0}), Error);
  // An output smaller than object_bytes is refused before anything is written.
  std::vector<uint8_t> small(codec.object_bytes(64) - 64);
  EXPECT_THROW(codec.encode(calm.view(), "k", small), Error);
}

TEST(Chunk, EverySingleByteCorruptionAndEveryTruncationIsRefused) {
  const ChunkGeometry g{1, 1, 64, 40};  // two tiles per tensor, a tail of 8 tokens
  const Chunk c = make_chunk(g, 21, 1);
  const ChunkCodec codec(calibration_for(make_chunk(g, 22, 0)));
  const std::vector<uint8_t> object = encode(codec, c, "k");
  Chunk back{g, std::vector<uint16_t>(g.elements())};
  ASSERT_EQ(error_of(codec, object, "k", back), "");
  ASSERT_EQ(error_of(ChunkCodec(codec.calibration(), {.threads = 3}), object, "k", back), "");
  for (size_t i = 0; i < object.size(); ++i) {
    for (const int flip : {0x01, 0x80}) {
      std::vector<uint8_t> bad = object;
      bad[i] = static_cast<uint8_t>(bad[i] ^ flip);
      ASSERT_NE(error_of(codec, bad, "k", back), "") << "byte " << i << " flipped by " << flip << " went unnoticed";
    }
  }
  for (size_t n = 0; n < object.size(); n += 7) {
    const std::vector<uint8_t> cut(object.begin(), object.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_NE(error_of(codec, cut, "k", back), "") << "truncated to " << n;
  }
  // Bytes after an object are not its own: a longer buffer reads the same.
  std::vector<uint8_t> longer = object;
  longer.resize(object.size() + 100, 0xEE);
  EXPECT_EQ(error_of(codec, longer, "k", back), "");
  EXPECT_EQ(back.data, c.data);
}

TEST(Chunk, AnotherCalibrationKeyOrGeometryIsAClearError) {
  const ChunkGeometry g{2, 2, 64, 32};
  const Chunk c = make_chunk(g, 31);
  const ChunkCodec codec(calibration_for(c));
  const std::vector<uint8_t> object = encode(codec, c, "model@0@0@01");
  Chunk back{g, std::vector<uint16_t>(g.elements())};
  const ChunkCodec other(calibration_for(make_chunk(g, 32)));
  EXPECT_NE(error_of(other, object, "model@0@0@01", back).find("was made with calibration"), std::string::npos);
  EXPECT_NE(error_of(codec, object, "model@0@0@02", back).find("stored under another key"), std::string::npos);
  Chunk longer{{2, 2, 64, 48}, std::vector<uint16_t>(ChunkGeometry{2, 2, 64, 48}.elements())};
  EXPECT_NE(error_of(codec, object, "model@0@0@01", longer).find("holds a chunk of 2 layers × 32 tokens"), std::string::npos);
  const ChunkCodec wider(calibration_for(make_chunk({2, 4, 64, 32}, 33)));
  Chunk wide{{2, 4, 64, 32}, std::vector<uint16_t>(ChunkGeometry{2, 4, 64, 32}.elements())};
  EXPECT_NE(error_of(wider, object, "model@0@0@01", wide).find("another model"), std::string::npos);
  EXPECT_THROW(codec.decode(object, "model@0@0@01", wide.mutable_view()), Error);  // not this codec's geometry
  std::vector<uint8_t> not_chunk(256, 0);
  EXPECT_NE(error_of(codec, not_chunk, "k", back).find("bad magic"), std::string::npos);
}

TEST(Chunk, MetadataIsTheCanonicalJsonOfItsFields) {
  // Objects written when the metadata was a JSON object's dump() must read the same: the text is that
  // dump, keys sorted and no spaces, for any field values.
  for (const ChunkGeometry g : {ChunkGeometry{32, 8, 128, 256}, ChunkGeometry{1, 4096, 64, 0}, ChunkGeometry{100000, 1, 256, 40}}) {
    for (const uint64_t id : {uint64_t{0}, uint64_t{0x0123456789abcdefull}, ~uint64_t{0}}) {
      nlohmann::json expected;
      expected["format"] = "gaac-chunk";
      expected["layers"] = g.layers;
      expected["kv_heads"] = g.kv_heads;
      expected["head_dim"] = g.head_dim;
      expected["tokens"] = g.tokens;
      char hex[2][17];
      std::snprintf(hex[0], sizeof hex[0], "%016llx", static_cast<unsigned long long>(id));
      std::snprintf(hex[1], sizeof hex[1], "%016llx", static_cast<unsigned long long>(~id));
      expected["calibration"] = hex[0];
      expected["key"] = hex[1];
      EXPECT_EQ(chunk_metadata(g, id, ~id), expected.dump()) << g.describe();
    }
  }
}

TEST(Chunk, SnapshotsAndChunkObjectsAreToldApartByTheirContainerVersion) {
  const ChunkGeometry g{2, 2, 64, 32};
  const Chunk c = make_chunk(g, 51);
  const CalibrationTable table = calibration_for(c);
  const ChunkCodec codec(table);
  const std::vector<uint8_t> object = encode(codec, c, "model@0@0@01");
  ASSERT_EQ(object[8] | object[9] << 8, kChunkVersion);
  try {
    (void)parse_snapshot(object, "x.gaac");
    ADD_FAILURE() << "a chunk object parsed as a snapshot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("container version 3 is not supported here (a KV chunk object; expected 1 or 2)"),
              std::string::npos)
        << e.what();
  }
  const KvDump dump = make_synthetic_kv({.layers = g.layers, .kv_heads = g.kv_heads, .head_dim = g.head_dim, .tokens = g.tokens, .seed = 52});
  const KvDump* dumps[] = {&dump};
  const std::vector<uint8_t> snapshot = snapshot_image(dump, calibrate(dumps));
  ASSERT_EQ(snapshot[8] | snapshot[9] << 8, kSnapshotVersion);
  Chunk back{g, std::vector<uint16_t>(g.elements())};
  EXPECT_NE(error_of(codec, snapshot, "model@0@0@01", back).find("container version 2 is not supported here (a .gaac snapshot; expected 3)"),
            std::string::npos)
      << error_of(codec, snapshot, "model@0@0@01", back);
}

TEST(Chunk, CalibratingAChunkIsCalibratingItsValues) {
  const ChunkGeometry g{2, 2, 128, 80};
  const Chunk c = make_chunk(g, 41);
  KvDump dump;
  for (int l = 0; l < 2; ++l) {
    KvLayer layer;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvView v = c.view().tensor(kind, l);
      KvTensor& t = layer.of(kind);
      t = {80, 2, 128, {}};
      for (int tok = 0; tok < 80; ++tok) t.data.insert(t.data.end(), v.at(tok, 0), v.at(tok, 0) + 256);
    }
    dump.layers.push_back(layer);
  }
  const KvDump* dumps[] = {&dump};
  EXPECT_EQ(calibration_id(calibrate_chunk(c.view())), calibration_id(calibrate(dumps)));
}

}  // namespace
}  // namespace gaac
