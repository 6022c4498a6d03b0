// KV dumps as safetensors files: `k.<layer>` and `v.<layer>`, BF16, `[tokens, kv_heads, head_dim]`
// (docs/format.md). The value types are gaac/kv_dump.hpp's.
#pragma once

#include <span>
#include <string>

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

}  // namespace gaac::io
