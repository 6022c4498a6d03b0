// KV dumps as safetensors files: `k.<layer>` and `v.<layer>`, BF16, `[tokens, kv_heads, head_dim]`
// (docs/format.md). The value types are gaac/kv_dump.hpp's.
#pragma once

#include <span>
#include <string>
#include <variant>

#include "gaac/fp8_dump.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac::io {

/// Reads a KV dump from a safetensors file (`k.<layer>`, `v.<layer>`, BF16, `[tokens, kv_heads,
/// head_dim]`). Any other dtype, a missing or extra layer, or a malformed file throws gaac::Error
/// naming the file and tensor.
KvDump load_kv_dump(const std::string& path);

/// Writes a KV dump as safetensors: atomically when `path` is a regular file (or none yet), in
/// place when it is a character device or FIFO, and never over any of `inputs` (the files the
/// caller read, compared by device and inode, through links). Throws gaac::Error naming the file.
void save_kv_dump(const KvDump& dump, const std::string& path, std::span<const std::string> inputs = {});

/// Reads an FP8 KV dump: `k.<layer>`, `v.<layer>` of dtype F8_E4M3 or F8_E5M2 (every tensor the same),
/// and optionally `k_scale`, `v_scale` (F32 [layers], both or neither). Anything else throws gaac::Error
/// naming the file and tensor.
Fp8KvDump load_fp8_kv_dump(const std::string& path);

/// Writes an FP8 KV dump as save_kv_dump writes a BF16 one (scales as `k_scale`, `v_scale` when it has them).
void save_fp8_kv_dump(const Fp8KvDump& dump, const std::string& path, std::span<const std::string> inputs = {});

/// A KV dump of either element type.
using AnyKvDump = std::variant<KvDump, Fp8KvDump>;

/// Reads a KV dump whose element type its `k.0` tensor says (BF16, F8_E4M3 or F8_E5M2).
AnyKvDump load_any_kv_dump(const std::string& path);

}  // namespace gaac::io
