// Checking that a command's results reached standard output: a result that a script cannot see
// is a failure, not a success.
#pragma once

namespace gaac::cli {

/// Flushes standard output; throws gaac::Error (ErrorCode::io) saying so when anything written to
/// it so far was lost ("cannot write to standard output: No space left on device"). Commands that
/// print as they go (generate) call it after each piece; main calls finish_stdout() at the end.
void flush_stdout();

/// flush_stdout(), then closes standard output, which reports the errors only a close can see.
void finish_stdout();

}  // namespace gaac::cli
