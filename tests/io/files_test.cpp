// Whole-file reads: inputs are copied into memory, so what happens to a file afterwards cannot
// reach the reader as a signal; what is not a regular file is refused without blocking.
#include "io/files.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gaac/error.hpp"
#include "support/temp_dir.hpp"

namespace gaac::io {
namespace {

using test::TempDir;
using test::write_text;

std::string text_of(std::span<const uint8_t> bytes) { return {bytes.begin(), bytes.end()}; }

TEST(FileBytes, HoldsTheContentsEvenIfTheFileIsTruncatedAfterwards) {
  TempDir dir;
  const std::string path = dir.file("dump");
  const std::string contents(1 << 20, 'k');  // several pages: a mapping would fault on every one
  write_text(path, contents);
  const FileBytes file = FileBytes::open(path);
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);  // a mapped file would now raise SIGBUS when read
  EXPECT_EQ(text_of(file.bytes()), contents);
  write_text(path, "rewritten");
  EXPECT_EQ(text_of(file.bytes()), contents);
}

TEST(FileBytes, RefusesAFifoWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    FileBytes::open(fifo);
    FAIL() << "opened a FIFO";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fifo + ": is a FIFO, not a regular file"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ErrorCode::io);
  }
}

TEST(FileBytes, RefusesADirectoryAndNamesAMissingFile) {
  TempDir dir;
  EXPECT_THROW(FileBytes::open(dir.file("")), Error);
  try {
    FileBytes::open(dir.file("missing"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing") + ": cannot open: No such file"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_file(dir.file("")), Error);
}

TEST(FileBytes, ReadFileReadsRegularFilesAndStreams) {
  TempDir dir;
  write_text(dir.file("text"), "some text");
  const std::vector<uint8_t> bytes = read_file(dir.file("text"));
  EXPECT_EQ(text_of(bytes), "some text");
  EXPECT_TRUE(read_file("/dev/null").empty());  // a character device: read until its end
}

}  // namespace
}  // namespace gaac::io
