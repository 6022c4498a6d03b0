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

int main(int argc, char** argv) {
  test_version_and_status();
  test_sizes();
  test_tile_round_trip(GAAC_KEY, 128);
  test_tile_round_trip(GAAC_VALUE, 64);
  test_calibration(argc > 1 ? argv[1] : ".");
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
