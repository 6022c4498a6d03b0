// The one output writer: it never writes over an input, never replaces what is not a regular file,
// keeps a replaced file's mode, and leaves no temporary file behind on error or on a signal.
#include "io/output_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "io/temporary_files.hpp"
#include "support/temp_dir.hpp"

namespace gaac::io {
namespace {

namespace fs = std::filesystem;
using test::read_text;
using test::TempDir;
using test::write_text;

/// write_output() of one piece of text.
void write(const std::string& path, const std::string& text, const std::vector<std::string>& inputs = {}) {
  const std::span<const uint8_t> parts[] = {{reinterpret_cast<const uint8_t*>(text.data()), text.size()}};
  write_output(path, parts, inputs);
}

/// The message of the gaac::Error that writing `text` to `path` throws ("" and a failure if none).
std::string write_error(const std::string& path, const std::vector<std::string>& inputs = {}) {
  try {
    write(path, "new", inputs);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "wrote " << path;
  return "";
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// True when no entry of `dir` is a temporary file of the writer.
bool no_temporaries(const TempDir& dir) {
  for (const std::string& name : dir.entries()) {
    if (contains(name, ".tmp.")) return false;
  }
  return true;
}

/// Runs `child` in a forked process and returns its wait status.
template <class F>
int in_child(F child) {
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

TEST(OutputFile, RefusesToWriteOverAnInput) {
  TempDir dir;
  const std::string input = dir.file("input.safetensors");
  write_text(input, "precious");
  const std::string message = write_error(input, {input});
  EXPECT_TRUE(contains(message, input) && contains(message, "is also an input")) << message;
  EXPECT_THROW(check_output(input, std::vector<std::string>{"unrelated", input}), Error);
  EXPECT_EQ(read_text(input), "precious");
  EXPECT_TRUE(no_temporaries(dir));
}

TEST(OutputFile, RefusesAnInputReachedThroughLinks) {
  TempDir dir;
  const std::string input = dir.file("input"), symbolic = dir.file("symbolic"), hard = dir.file("hard");
  write_text(input, "precious");
  fs::create_symlink(input, symbolic);
  fs::create_hard_link(input, hard);
  for (const std::string& output : {symbolic, hard}) {
    const std::string message = write_error(output, {input});
    EXPECT_TRUE(contains(message, output) && contains(message, "the same file as the input " + input)) << message;
    EXPECT_EQ(read_text(input), "precious");
  }
  // The same with the input named through the link and the output by its own name.
  EXPECT_TRUE(contains(write_error(input, {symbolic}), "the same file as the input")) << input;
  EXPECT_EQ(read_text(input), "precious");
}

TEST(OutputFile, ReplacesARegularFileAndKeepsItsMode) {
  TempDir dir;
  for (const mode_t mode : {0600, 0640, 0444}) {
    const std::string path = dir.file("out" + std::to_string(mode));
    write_text(path, "old contents");
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    write(path, "new", {dir.file("some input")});
    EXPECT_EQ(read_text(path), "new");
    EXPECT_TRUE(S_ISREG(mode_of(path)));
    EXPECT_EQ(mode_of(path) & 07777, mode);
  }
  EXPECT_TRUE(no_temporaries(dir));
}

TEST(OutputFile, NewFileTakesItsModeFromTheUmask) {
  TempDir dir;
  const mode_t previous = ::umask(027);
  write(dir.file("new"), "data");
  ::umask(previous);
  EXPECT_EQ(mode_of(dir.file("new")) & 07777, 0640u);
  EXPECT_EQ(read_text(dir.file("new")), "data");
}

TEST(OutputFile, ASymbolicLinkStaysALinkToTheReplacedFile) {
  TempDir dir;
  const std::string target = dir.file("target"), link = dir.file("link");
  write_text(target, "old");
  fs::create_symlink("target", link);
  write(link, "new");
  EXPECT_TRUE(S_ISLNK(mode_of(link)));
  EXPECT_EQ(read_text(target), "new");
}

TEST(OutputFile, AFifoIsWrittenInPlace) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Its read end is open first, so the writer's open does not wait; the data fits the pipe's buffer.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  write(fifo, "through the pipe");
  char buffer[64] = {};
  EXPECT_EQ(::read(reader, buffer, sizeof buffer), 16);
  ::close(reader);
  EXPECT_EQ(std::string(buffer), "through the pipe");
  EXPECT_TRUE(S_ISFIFO(mode_of(fifo)));
  EXPECT_TRUE(no_temporaries(dir));
}

TEST(OutputFile, ACharacterDeviceIsWrittenInPlace) {
  TempDir dir;
  const std::string device = dir.file("null");
  // A device node of our own (the null device's numbers), rather than the system's /dev/null.
  if (::mknod(device.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0) {
    GTEST_SKIP() << "cannot create a device node here: " << std::strerror(errno);
  }
  write(device, "discarded");
  EXPECT_TRUE(S_ISCHR(mode_of(device)));
  EXPECT_TRUE(no_temporaries(dir));
}

TEST(OutputFile, RefusesDirectoriesDanglingLinksAndMissingDirectories) {
  TempDir dir;
  fs::create_directory(dir.file("sub"));
  EXPECT_TRUE(contains(write_error(dir.file("sub")), "is a directory"));
  fs::create_symlink(dir.file("nothing"), dir.file("dangling"));
  EXPECT_TRUE(contains(write_error(dir.file("dangling")), "symbolic link to a file that does not exist"));
  EXPECT_TRUE(S_ISLNK(mode_of(dir.file("dangling"))));
  EXPECT_TRUE(contains(write_error(dir.file("missing/out")), "does not exist"));
  EXPECT_THROW(check_output(""), Error);
}

TEST(OutputFile, StandardOutputIsWrittenThroughItsDescriptorAfterWhatIsBuffered) {
  TempDir dir;
  const std::string captured = dir.file("stdout.txt");
  // The child's standard output is a regular file; the writer must append to it in order, not
  // replace it (which would lose what stdio writes before and after).
  const int status = in_child([&] {
    const int fd = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0) ::_exit(2);
    std::printf("before\n");
    try {
      write("/dev/stdout", "DATA");
    } catch (...) {
      ::_exit(3);
    }
    std::printf("after\n");
    std::fflush(stdout);
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(read_text(captured), "before\nDATAafter\n");
}

TEST(OutputFile, AFailedWriteLeavesNeitherATemporaryFileNorAChange) {
  TempDir dir;
  const std::string existing = dir.file("existing");
  write_text(existing, "old");
  // With a 4 KiB file-size limit (and SIGXFSZ ignored), writing 1 MiB fails with EFBIG.
  const int status = in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    const std::string big(1 << 20, 'x');
    for (const std::string& path : {dir.file("new"), existing}) {
      try {
        write(path, big);
        ::_exit(3);
      } catch (const Error& e) {
        if (!contains(e.what(), path)) ::_exit(4);
      }
    }
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(dir.file("new")));
  EXPECT_EQ(read_text(existing), "old");
  EXPECT_TRUE(no_temporaries(dir));
}

TEST(TemporaryFiles, AreRemovedWhenAbandoned) {
  TempDir dir;
  std::string path;
  {
    TemporaryFile temporary(dir.file("out"), 0600);
    path = temporary.path();
    EXPECT_TRUE(fs::exists(path));
    EXPECT_TRUE(contains(path, dir.file("out") + ".tmp." + std::to_string(::getpid()) + "."));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(TemporaryFiles, AreRemovedWhenASignalEndsTheProcessWhichStillDiesOfIt) {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    TempDir dir;
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const int status = in_child([&] {
      remove_temporaries_on_signals();
      TemporaryFile temporary(dir.file("out"), 0600);
      const std::string& path = temporary.path();
      if (::write(pipe_fds[1], path.c_str(), path.size()) != static_cast<ssize_t>(path.size())) ::_exit(2);
      ::raise(sig);
      ::_exit(3);  // not reached: the signal ends the process
    });
    ::close(pipe_fds[1]);
    char buffer[4096] = {};
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer - 1);
    ::close(pipe_fds[0]);
    ASSERT_GT(n, 0) << "the child created no temporary file";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "signal " << sig << ", status " << status;
    EXPECT_FALSE(fs::exists(buffer)) << buffer;
    EXPECT_TRUE(dir.entries().empty());
  }
}

TEST(TemporaryFiles, SignalsThatAreIgnoredOrHandledStaySo) {
  const int status = in_child([] {
    ::signal(SIGHUP, SIG_IGN);
    remove_temporaries_on_signals();
    struct sigaction current {};
    ::sigaction(SIGHUP, nullptr, &current);
    if (current.sa_handler != SIG_IGN) ::_exit(2);
    ::sigaction(SIGINT, nullptr, &current);
    if (current.sa_handler == SIG_DFL) ::_exit(3);  // the default one was replaced
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(WriteOutput, CheckOutputTriesToCreateAFileWhereTheOutputGoes) {
  // /proc is a directory that allows writing to its owner yet creates no file: only trying tells.
  if (::access("/proc", F_OK) != 0) GTEST_SKIP() << "no /proc";
  EXPECT_THROW(check_output("/proc/gaac-test-output.gaac"), Error);
  TempDir dir;
  EXPECT_NO_THROW(check_output(dir.file("out.gaac")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("")));  // the trial file is gone
}

}  // namespace
}  // namespace gaac::io
