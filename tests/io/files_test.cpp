// Whole-file reads: inputs are copied into memory, so what happens to a file afterwards cannot
// reach the reader as a signal; streams are read to their end; directories are refused.
#include "io/files.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>

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

TEST(FileBytes, ReadsAFifoToItsEnd) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string contents(200000, 'v');  // more than a pipe holds at once
  std::thread writer([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    for (size_t done = 0; fd >= 0 && done < contents.size();) {
      const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  const FileBytes file = FileBytes::open(fifo);
  writer.join();
  EXPECT_EQ(text_of(file.bytes()), contents);
}

TEST(FileBytes, RefusesADirectoryAndNamesAMissingFile) {
  TempDir dir;
  try {
    FileBytes::open(dir.file(""));
    FAIL() << "read a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), ErrorCode::io);
  }
  try {
    FileBytes::open(dir.file("missing"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing") + ": cannot open: No such file"), std::string::npos)
        << e.what();
  }
}

TEST(FileBytes, APathWithANulByteIsRefusedNotTruncated) {
  TempDir dir;
  const std::string path = dir.file("kv");
  write_text(path, "held");
  const std::string with_nul = path + std::string("\0junk", 5);
  EXPECT_THROW(read_file(with_nul), Error);  // would read `path`
  const uint8_t byte = 1;
  const std::span<const uint8_t> parts[] = {std::span(&byte, 1)};
  EXPECT_THROW(write_output(path + std::string("\0.gaac", 6), parts), Error);  // would replace `path`
  EXPECT_THROW(check_output(path + std::string("\0", 1)), Error);
  EXPECT_EQ(text_of(read_file(path)), "held");
}

TEST(FileBytes, AStreamOfAnotherFormatIsRefusedAtItsFirstBytes) {
  const uint8_t magic[] = {0x89, 'G', 'A', 'A', 'C'};
  try {
    read_file("/dev/zero", {magic, "a test format"});  // endless: only refusing at the start ends this
    FAIL() << "read /dev/zero as a test format";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero: not a test format"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_file("/dev/null", {magic, "a test format"}), Error);  // shorter than the magic
  EXPECT_TRUE(read_file("/dev/null").empty());
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
