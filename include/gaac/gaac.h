/*
 * gaac C API: calibration tables and tile encode/decode for the GAAC v1 KV-cache format.
 *
 * Conventions (as in zstd): every function that can fail returns a gaac_status; GAAC_OK is 0;
 * gaac_status_string() names a status and gaac_last_error() gives the detailed message of the last
 * failure on the calling thread. No exception ever crosses this boundary. Objects are opaque and
 * created/freed in pairs. Sizes are in bytes; BF16 values are passed as their uint16_t bit patterns.
 */
#ifndef GAAC_GAAC_H
#define GAAC_GAAC_H

#include <stddef.h>
#include <stdint.h>

#include "gaac/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version -------------------------------------------------------------------------------- */
#define GAAC_VERSION_MAJOR 0
#define GAAC_VERSION_MINOR 1
#define GAAC_VERSION_PATCH 0
#define GAAC_VERSION_NUMBER (GAAC_VERSION_MAJOR * 10000 + GAAC_VERSION_MINOR * 100 + GAAC_VERSION_PATCH)
#define GAAC_STRINGIFY_(x) #x
#define GAAC_STRINGIFY(x) GAAC_STRINGIFY_(x)
#define GAAC_VERSION_STRING \
  GAAC_STRINGIFY(GAAC_VERSION_MAJOR) "." GAAC_STRINGIFY(GAAC_VERSION_MINOR) "." GAAC_STRINGIFY(GAAC_VERSION_PATCH)
/** Version of the tile layout (docs/format.md) this library reads and writes. */
#define GAAC_TILE_FORMAT_VERSION 1
/** Version of the FP8 tile layout (docs/format.md, section 14). */
#define GAAC_FP8_TILE_FORMAT_VERSION 1

/** GAAC_VERSION_NUMBER of the library actually linked. */
GAAC_API unsigned gaac_version_number(void);
/** GAAC_VERSION_STRING of the library actually linked. */
GAAC_API const char* gaac_version_string(void);

/* ---- status --------------------------------------------------------------------------------- */
/** Result of every fallible call. */
typedef enum gaac_status {
  GAAC_OK = 0,
  GAAC_ERROR_INVALID_ARGUMENT = 1, /**< a null pointer, bad geometry, too small a buffer... */
  GAAC_ERROR_IO = 2,               /**< a file could not be read or written */
  GAAC_ERROR_MALFORMED = 3,        /**< a file is truncated, corrupted or not of the expected kind */
  GAAC_ERROR_INVALID_TAG = 4,      /**< a tile holds mode tag 3 */
  GAAC_ERROR_ESCAPE_OVERRUN = 5,   /**< a tile's tags need more escape bytes than its slot holds */
  GAAC_ERROR_NONZERO_PADDING = 6,  /**< a tile's unused escape bytes are not zero */
  GAAC_ERROR_DOES_NOT_FIT = 7,     /**< the tile's escapes exceed the slot: store it raw */
  GAAC_ERROR_OUT_OF_MEMORY = 8,
  GAAC_ERROR_INTERNAL = 9
} gaac_status;

/** A static English name of `status`. */
GAAC_API const char* gaac_status_string(gaac_status status);
/** Details of the last failure on this thread ("" if none); valid until the next call on it. */
GAAC_API const char* gaac_last_error(void);

/* ---- tiles ---------------------------------------------------------------------------------- */
/** Whether a tile holds keys or values (they use different element orders). */
typedef enum gaac_tensor_kind { GAAC_KEY = 0, GAAC_VALUE = 1 } gaac_tensor_kind;

/** Tokens per tile. */
#define GAAC_TILE_TOKENS 16

/** Bytes of a compressed slot for a tile of `channels` (64 or 128) channels and the given escape
 *  capacity (a multiple of 16); 0 if either is invalid. */
GAAC_API size_t gaac_tile_slot_bytes(int channels, size_t escape_capacity);
/** Bytes of the same tile stored raw (16 × channels × 2); 0 if `channels` is invalid. */
GAAC_API size_t gaac_tile_raw_bytes(int channels);
/** Largest useful escape capacity for a tile width (its slot stays smaller than the raw tile). */
GAAC_API size_t gaac_tile_max_escape_capacity(int channels);

/** What encoding a tile produced. */
typedef struct gaac_tile_info {
  uint32_t groups_3bit;  /**< groups coded with 3-bit offsets */
  uint32_t groups_4bit;  /**< groups coded with 4-bit offsets */
  uint32_t groups_raw;   /**< groups holding raw exponents */
  uint32_t escape_bytes; /**< escape bytes the tile needs */
} gaac_tile_info;

/**
 * Encodes 16 tokens × `channels` BF16 values into `slot`.
 * Element (t, c) is src[t * row_stride + c]. `b3`, `b4`: the `channels` bases of the tile's
 * channels. `slot_size` must be at least gaac_tile_slot_bytes(channels, escape_capacity).
 * Returns GAAC_ERROR_DOES_NOT_FIT when the escapes exceed the capacity (the caller keeps the tile
 * raw); `info` (may be NULL) is filled in either case.
 */
GAAC_API gaac_status gaac_encode_tile(gaac_tensor_kind kind, int channels, const uint16_t* src, size_t row_stride,
                             const uint8_t* b3, const uint8_t* b4, size_t escape_capacity, void* slot,
                             size_t slot_size, gaac_tile_info* info);

/**
 * Decodes a slot written by gaac_encode_tile into BF16 values at `dst` (same addressing as `src`
 * above). Validates the tags and escape accounting; on failure `dst` is unspecified.
 */
GAAC_API gaac_status gaac_decode_tile(gaac_tensor_kind kind, int channels, const void* slot, size_t slot_size,
                             const uint8_t* b3, const uint8_t* b4, size_t escape_capacity, uint16_t* dst,
                             size_t row_stride);

/* ---- FP8 tiles (docs/format.md, section 14) ------------------------------------------------- */
/** The FP8 element formats: E4M3 (E4M3FN, S.1111.111 NaN, no infinities) and E5M2. */
typedef enum gaac_fp8_format { GAAC_E4M3 = 1, GAAC_E5M2 = 2 } gaac_fp8_format;

/** Bytes of an FP8 slot for `channels` (64 or 128) and the escape capacity (a multiple of 16); 0 if invalid. */
GAAC_API size_t gaac_fp8_tile_slot_bytes(gaac_fp8_format format, int channels, size_t escape_capacity);
/** Bytes of an FP8 tile stored raw (16 × channels); 0 if `channels` is invalid. */
GAAC_API size_t gaac_fp8_tile_raw_bytes(int channels);
/** Largest useful escape capacity of an FP8 tile (its slot stays smaller than the raw tile); 0 if invalid. */
GAAC_API size_t gaac_fp8_tile_max_escape_capacity(gaac_fp8_format format, int channels);

/** What encoding an FP8 tile produced. */
typedef struct gaac_fp8_tile_info {
  uint32_t groups_2bit;  /**< groups coded with 2-bit offsets */
  uint32_t groups_3bit;  /**< groups coded with 3-bit offsets */
  uint32_t groups_raw;   /**< groups holding raw exponents */
  uint32_t escape_bytes; /**< escape bytes the tile needs */
} gaac_fp8_tile_info;

/**
 * Encodes 16 tokens × `channels` FP8 bytes (element (t, c) at src[t * row_stride + c]) into `slot`, with the
 * tile's bases `b2` (each ≤ 2^X − 4) and `b3` (≤ 2^X − 8). Returns GAAC_ERROR_DOES_NOT_FIT when the escapes
 * exceed the capacity (the caller keeps the tile raw); `info` (may be NULL) is filled in either case.
 */
GAAC_API gaac_status gaac_fp8_encode_tile(gaac_fp8_format format, gaac_tensor_kind kind, int channels, const uint8_t* src,
                                          size_t row_stride, const uint8_t* b2, const uint8_t* b3, size_t escape_capacity,
                                          void* slot, size_t slot_size, gaac_fp8_tile_info* info);

/** Decodes a slot written by gaac_fp8_encode_tile into FP8 bytes at `dst`; validates tags, escapes and padding. */
GAAC_API gaac_status gaac_fp8_decode_tile(gaac_fp8_format format, gaac_tensor_kind kind, int channels, const void* slot,
                                          size_t slot_size, const uint8_t* b2, const uint8_t* b3, size_t escape_capacity,
                                          uint8_t* dst, size_t row_stride);

/** Converts `n` BF16 values to FP8 as vLLM's cache write does: the nearest FP8 value to float(x) / scale,
 *  ties to even, saturated to the largest finite value (`scale` finite and positive). */
GAAC_API gaac_status gaac_fp8_from_bf16(gaac_fp8_format format, const uint16_t* src, size_t n, float scale, uint8_t* dst);

/* ---- calibration tables --------------------------------------------------------------------- */
/** Exponent bases and escape capacities of one model's cache. */
typedef struct gaac_calibration gaac_calibration;

/** Creates a table for `layers` × `kv_heads` × `head_dim` (64, 128 or 256), all bases 0 and all
 *  capacities 0. */
GAAC_API gaac_status gaac_calibration_create(int layers, int kv_heads, int head_dim, gaac_calibration** out);
/** Creates a table for FP8 tiles of `format` (bases b2, b3), all bases 0 and all capacities 0. */
GAAC_API gaac_status gaac_calibration_create_fp8(int layers, int kv_heads, int head_dim, gaac_fp8_format format,
                                                 gaac_calibration** out);
/** Loads a table saved by gaac_calibration_save or `gaac calibrate` (safetensors). */
GAAC_API gaac_status gaac_calibration_load(const char* path, gaac_calibration** out);
/** Saves a table as safetensors. */
GAAC_API gaac_status gaac_calibration_save(const gaac_calibration* table, const char* path);
/** Frees a table (NULL is allowed). */
GAAC_API void gaac_calibration_free(gaac_calibration* table);

/** Geometry of a table (0 for NULL). */
GAAC_API int gaac_calibration_layers(const gaac_calibration* table);
GAAC_API int gaac_calibration_kv_heads(const gaac_calibration* table);
GAAC_API int gaac_calibration_head_dim(const gaac_calibration* table);
/** The element format of a table: 0 for BF16, else its gaac_fp8_format (-1 for NULL). */
GAAC_API int gaac_calibration_element_format(const gaac_calibration* table);

/** FP8 tables: points `*b2` and `*b3` at the bases of tile `half` of a head (as gaac_calibration_tile_bases). */
GAAC_API gaac_status gaac_calibration_fp8_tile_bases(const gaac_calibration* table, gaac_tensor_kind kind, int layer, int head,
                                                     int half, const uint8_t** b2, const uint8_t** b3);
/** FP8 tables: copies `head_dim` bases of each window into a head (b2 ≤ 2^X − 4, b3 ≤ 2^X − 8). */
GAAC_API gaac_status gaac_calibration_set_fp8_bases(gaac_calibration* table, gaac_tensor_kind kind, int layer, int head,
                                                    const uint8_t* b2, const uint8_t* b3);
/** BF16 tables: points `*b3` and `*b4` at the bases of tile `half` (0, or 0..1 for head_dim 256) of a head:
 *  as many entries as the tile has channels, valid while the table lives and is not modified. */
GAAC_API gaac_status gaac_calibration_tile_bases(const gaac_calibration* table, gaac_tensor_kind kind, int layer, int head,
                                        int half, const uint8_t** b3, const uint8_t** b4);
/** BF16 tables: copies `head_dim` bases of each window into a head of the table (b3 ≤ 248, b4 ≤ 240). */
GAAC_API gaac_status gaac_calibration_set_bases(gaac_calibration* table, gaac_tensor_kind kind, int layer, int head,
                                       const uint8_t* b3, const uint8_t* b4);
/** Escape-slot capacity of (kind, layer) in `*bytes`. */
GAAC_API gaac_status gaac_calibration_escape_capacity(const gaac_calibration* table, gaac_tensor_kind kind, int layer,
                                             size_t* bytes);
/** Sets the escape-slot capacity of (kind, layer). */
GAAC_API gaac_status gaac_calibration_set_escape_capacity(gaac_calibration* table, gaac_tensor_kind kind, int layer,
                                                 size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* GAAC_GAAC_H */
