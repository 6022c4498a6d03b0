/* The C API from C: compiled as C11 and linked only against gaac. Prints one line per failed check
 * and "N passed, N failed" at the end; exits non-zero on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gaac/gaac.h"

static int passed, failed;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (cond) {                                                       \
      ++passed;                                                       \
    } else {                                                          \
      ++failed;                                                       \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                 \
  } while (0)

static uint16_t bf16(int sign, int exponent, int mantissa) {
  return (uint16_t)((sign & 1) << 15 | (exponent & 0xFF) << 7 | (mantissa & 0x7F));
}

static void test_version_and_status(void) {
  CHECK(gaac_version_number() == GAAC_VERSION_NUMBER);
  CHECK(strcmp(gaac_version_string(), GAAC_VERSION_STRING) == 0);
  CHECK(strcmp(gaac_status_string(GAAC_OK), "ok") == 0);
  CHECK(strlen(gaac_status_string(GAAC_ERROR_INVALID_TAG)) > 0);
}

static void test_sizes(void) {
  CHECK(gaac_tile_slot_bytes(128, 0) == 2880);
  CHECK(gaac_tile_slot_bytes(64, 32) == 1472);
  CHECK(gaac_tile_slot_bytes(96, 0) == 0);
  CHECK(gaac_tile_slot_bytes(128, 8) == 0);
  CHECK(gaac_tile_raw_bytes(128) == 4096);
  CHECK(gaac_tile_slot_bytes(128, gaac_tile_max_escape_capacity(128)) < gaac_tile_raw_bytes(128));
}

static void test_tile_round_trip(gaac_tensor_kind kind, int channels) {
  enum { kMax = 16 * 128 };
  uint16_t src[kMax], dst[kMax];
  uint8_t b3[128], b4[128];
  size_t capacity = 128;
  size_t slot_size = gaac_tile_slot_bytes(channels, capacity);
  unsigned char* slot = malloc(slot_size);
  gaac_tile_info info;
  int i;
  for (i = 0; i < channels; ++i) {
    b3[i] = 118;
    b4[i] = 112;
  }
  for (i = 0; i < 16 * channels; ++i) src[i] = bf16(i & 1, 118 + i % 8, i * 7);
  src[5] = bf16(0, 112 + 15, 3);  /* one 4-bit group */
  src[16 * channels - 1] = bf16(1, 3, 9); /* one raw group (last token, last channel) */
  CHECK(gaac_encode_tile(kind, channels, src, (size_t)channels, b3, b4, capacity, slot, slot_size, &info) == GAAC_OK);
  CHECK(info.groups_4bit == 1 && info.groups_raw == 1 && info.escape_bytes == 6);
  CHECK(info.groups_3bit + info.groups_4bit + info.groups_raw == (uint32_t)(2 * channels));
  memset(dst, 0, sizeof dst);
  CHECK(gaac_decode_tile(kind, channels, slot, slot_size, b3, b4, capacity, dst, (size_t)channels) == GAAC_OK);
  CHECK(memcmp(src, dst, sizeof(uint16_t) * 16 * (size_t)channels) == 0);

  /* Tag 3 in the first tag word is rejected. */
  slot[22 * channels + channels / 2 - 1] |= 0xC0;
  CHECK(gaac_decode_tile(kind, channels, slot, slot_size, b3, b4, capacity, dst, (size_t)channels) ==
        GAAC_ERROR_INVALID_TAG);
  CHECK(strlen(gaac_last_error()) > 0);
  /* Escapes that exceed the capacity: DOES_NOT_FIT, with the needed size reported. */
  CHECK(gaac_encode_tile(kind, channels, src, (size_t)channels, b3, b4, 0, slot, slot_size, &info) ==
        GAAC_ERROR_DOES_NOT_FIT);
  CHECK(info.escape_bytes == 6);
  CHECK(gaac_encode_tile(kind, channels, NULL, (size_t)channels, b3, b4, 0, slot, slot_size, &info) ==
        GAAC_ERROR_INVALID_ARGUMENT);
  free(slot);
}

static void test_calibration(const char* dir) {
  gaac_calibration* table = NULL;
  gaac_calibration* loaded = NULL;
  uint8_t b3[256], b4[256];
  const uint8_t *p3, *p4;
  size_t capacity = 0;
  char path[4096];
  int i;
  CHECK(gaac_calibration_create(2, 1, 256, &table) == GAAC_OK);
  CHECK(gaac_calibration_head_dim(table) == 256);
  for (i = 0; i < 256; ++i) {
    b3[i] = (uint8_t)(100 + i % 16);
    b4[i] = (uint8_t)(96 + i % 16);
  }
  CHECK(gaac_calibration_set_bases(table, GAAC_VALUE, 1, 0, b3, b4) == GAAC_OK);
  CHECK(gaac_calibration_set_escape_capacity(table, GAAC_VALUE, 1, 64) == GAAC_OK);
  CHECK(gaac_calibration_set_escape_capacity(table, GAAC_VALUE, 1, 65) == GAAC_ERROR_INVALID_ARGUMENT);
  b3[0] = 249;
  CHECK(gaac_calibration_set_bases(table, GAAC_KEY, 0, 0, b3, b4) == GAAC_ERROR_INVALID_ARGUMENT);
  snprintf(path, sizeof path, "%s/c_api_calibration.safetensors", dir);
  CHECK(gaac_calibration_save(table, path) == GAAC_OK);
  CHECK(gaac_calibration_load(path, &loaded) == GAAC_OK);
  CHECK(gaac_calibration_layers(loaded) == 2 && gaac_calibration_kv_heads(loaded) == 1);
  CHECK(gaac_calibration_tile_bases(loaded, GAAC_VALUE, 1, 0, 1, &p3, &p4) == GAAC_OK);
  CHECK(p3[0] == 100 && p4[5] == 96 + (128 + 5) % 16);
  CHECK(gaac_calibration_tile_bases(loaded, GAAC_VALUE, 1, 0, 2, &p3, &p4) == GAAC_ERROR_INVALID_ARGUMENT);
  CHECK(gaac_calibration_escape_capacity(loaded, GAAC_VALUE, 1, &capacity) == GAAC_OK && capacity == 64);
  gaac_calibration_free(loaded);
  CHECK(gaac_calibration_load("/nonexistent/calibration.safetensors", &loaded) == GAAC_ERROR_IO);
  CHECK(loaded == NULL);
  CHECK(gaac_calibration_load(__FILE__, &loaded) == GAAC_ERROR_MALFORMED);
  gaac_calibration_free(table);
  gaac_calibration_free(NULL);
}

/* An FP8 tile through the C API: every byte pattern (in every other group), modes counted, round trip,
 * the calibration table of a format, and the conversion's saturation. */
static void test_fp8(gaac_fp8_format format, gaac_tensor_kind kind, int channels, const char* dir) {
  uint8_t src[16 * 128], dst[16 * 128], b2[128], b3[128], slot[2048];
  const uint8_t *p2, *p3;
  const size_t capacity = gaac_fp8_tile_max_escape_capacity(format, channels);
  const size_t slot_size = gaac_fp8_tile_slot_bytes(format, channels, capacity);
  const int max2 = format == GAAC_E4M3 ? 12 : 28;
  gaac_fp8_tile_info info;
  gaac_calibration* table = NULL;
  gaac_calibration* loaded = NULL;
  uint16_t big[2] = {0x7F80 /* +Inf */, 0xC800 /* -131072 */};
  uint8_t converted[2];
  char path[4096];
  int i;
  CHECK(slot_size > 0 && slot_size < gaac_fp8_tile_raw_bytes(channels) && gaac_fp8_tile_raw_bytes(channels) == 16u * (size_t)channels);
  for (i = 0; i < channels; ++i) {
    b2[i] = (uint8_t)max2;
    b3[i] = (uint8_t)(max2 - 4);
  }
  for (i = 0; i < 16 * channels; ++i) src[i] = (uint8_t)(i * 37);
  /* Raw groups everywhere: too many escapes for any slot. */
  CHECK(gaac_fp8_encode_tile(format, kind, channels, src, (size_t)channels, b2, b3, capacity, slot, slot_size, &info) ==
        GAAC_ERROR_DOES_NOT_FIT);
  CHECK(info.groups_2bit + info.groups_3bit + info.groups_raw == (uint32_t)(2 * channels));
  /* The top exponent (NaNs, E5M2's infinities) everywhere but one byte: all 2-bit but one raw group. */
  for (i = 0; i < 16 * channels; ++i) src[i] = (uint8_t)(0x7F | (i & 1) << 7);
  src[5] = 0x01;
  CHECK(gaac_fp8_encode_tile(format, kind, channels, src, (size_t)channels, b2, b3, capacity, slot, slot_size, &info) == GAAC_OK);
  CHECK(info.groups_raw == 1 && info.groups_3bit == 0 && info.escape_bytes == (format == GAAC_E4M3 ? 2u : 3u));
  CHECK(gaac_fp8_decode_tile(format, kind, channels, slot, slot_size, b2, b3, capacity, dst, (size_t)channels) == GAAC_OK);
  CHECK(memcmp(src, dst, 16 * (size_t)channels) == 0);
  slot[gaac_fp8_tile_slot_bytes(format, channels, 0) - 1] = 0xFF; /* the last tag byte: tag 3 */
  CHECK(gaac_fp8_decode_tile(format, kind, channels, slot, slot_size, b2, b3, capacity, dst, (size_t)channels) ==
        GAAC_ERROR_INVALID_TAG);
  b2[3] = (uint8_t)(max2 + 1);
  CHECK(gaac_fp8_encode_tile(format, kind, channels, src, (size_t)channels, b2, b3, capacity, slot, slot_size, &info) ==
        GAAC_ERROR_INVALID_ARGUMENT);
  b2[3] = (uint8_t)max2;
  /* The conversion saturates infinities and huge values to the largest finite value. */
  CHECK(gaac_fp8_from_bf16(format, big, 2, 1.0f, converted) == GAAC_OK);
  CHECK(converted[0] == (format == GAAC_E4M3 ? 0x7E : 0x7B) && converted[1] == (format == GAAC_E4M3 ? 0xFE : 0xFB));
  CHECK(gaac_fp8_from_bf16(format, big, 2, 0.0f, converted) == GAAC_ERROR_INVALID_ARGUMENT);
  /* An FP8 table keeps its format and its bases through a file. */
  CHECK(gaac_calibration_create_fp8(1, 1, channels, format, &table) == GAAC_OK);
  CHECK(gaac_calibration_element_format(table) == (int)format);
  CHECK(gaac_calibration_set_fp8_bases(table, kind, 0, 0, b2, b3) == GAAC_OK);
  CHECK(gaac_calibration_set_bases(table, kind, 0, 0, b2, b3) == GAAC_ERROR_INVALID_ARGUMENT);
  snprintf(path, sizeof path, "%s/c_api_fp8_calibration.safetensors", dir);
  CHECK(gaac_calibration_save(table, path) == GAAC_OK);
  CHECK(gaac_calibration_load(path, &loaded) == GAAC_OK);
  CHECK(gaac_calibration_element_format(loaded) == (int)format);
  CHECK(gaac_calibration_fp8_tile_bases(loaded, kind, 0, 0, 0, &p2, &p3) == GAAC_OK);
  CHECK(memcmp(p2, b2, (size_t)channels) == 0 && memcmp(p3, b3, (size_t)channels) == 0);
  CHECK(gaac_calibration_tile_bases(loaded, kind, 0, 0, 0, &p2, &p3) == GAAC_ERROR_INVALID_ARGUMENT);
  gaac_calibration_free(loaded);
  gaac_calibration_free(table);
}

int main(int argc, char** argv) {
  test_version_and_status();
  test_sizes();
  test_tile_round_trip(GAAC_KEY, 128);
  test_tile_round_trip(GAAC_VALUE, 64);
  test_calibration(argc > 1 ? argv[1] : ".");
  test_fp8(GAAC_E4M3, GAAC_KEY, 128, argc > 1 ? argv[1] : ".");
  test_fp8(GAAC_E5M2, GAAC_VALUE, 64, argc > 1 ? argv[1] : ".");
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
