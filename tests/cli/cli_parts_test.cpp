// The command-line tool's own parts: the one number parser every numeric option goes through, the
// escaping of untrusted text, the logit comparison behind `gaac validate`, and the checks on
// standard output and on what a command was doing when it failed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "activity.hpp"
#include "gaac/error.hpp"
#include "logit_comparison.hpp"
#include "numbers.hpp"
#include "standard_output.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

template <class T>
T value_of(const std::string& text) {
  const auto parsed = parse_number<T>(text);
  if (const auto* problem = std::get_if<std::string>(&parsed)) ADD_FAILURE() << text << ": " << *problem;
  return std::holds_alternative<T>(parsed) ? std::get<T>(parsed) : T{};
}

template <class T>
std::string problem_of(const std::string& text) {
  const auto parsed = parse_number<T>(text);
  if (std::holds_alternative<T>(parsed)) ADD_FAILURE() << text << " was accepted";
  return std::holds_alternative<std::string>(parsed) ? std::get<std::string>(parsed) : "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Numbers, AcceptsDecimalNumbers) {
  EXPECT_EQ(value_of<int>("42"), 42);
  EXPECT_EQ(value_of<int>("-7"), -7);
  EXPECT_EQ(value_of<int>("+7"), 7);
  EXPECT_EQ(value_of<int>("010"), 10);  // decimal, not octal
  EXPECT_EQ(value_of<uint64_t>("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(value_of<float>("0.7"), 0.7f);
  EXPECT_EQ(value_of<double>("1e-3"), 1e-3);
  EXPECT_EQ(value_of<double>(".5"), 0.5);
}

TEST(Numbers, RefusesNonFiniteValues) {
  for (const std::string text : {"nan", "NaN", "-nan", "inf", "-inf", "infinity", "+inf"}) {
    EXPECT_TRUE(contains(problem_of<float>(text), "not a finite number") || contains(problem_of<float>(text), "not a number"))
        << text;
    EXPECT_TRUE(contains(problem_of<double>(text), "finite") || contains(problem_of<double>(text), "not a number"))
        << text;
    EXPECT_TRUE(contains(problem_of<int>(text), "not a whole number") || contains(problem_of<int>(text), "not a number"))
        << text;
  }
  EXPECT_EQ(problem_of<double>("nan"), "'nan' is not a finite number");
}

TEST(Numbers, RefusesValuesTheTypeCannotHoldInsteadOfClamping) {
  EXPECT_TRUE(contains(problem_of<uint64_t>("18446744073709551616"), "out of range"));
  EXPECT_TRUE(contains(problem_of<int>("2147483648"), "out of range"));
  EXPECT_TRUE(contains(problem_of<float>("1e39"), "out of range"));
  EXPECT_TRUE(contains(problem_of<double>("1e999"), "out of range"));
  EXPECT_EQ(problem_of<uint64_t>("-1"), "'-1' is negative; the value must be 0 or more");
}

TEST(Numbers, RefusesTextThatIsNotExactlyANumber) {
  for (const std::string text : {"", " 5", "5 ", "5x", "abc", "0x10", "1.5", "1e3", "--5", "+-5", "++5", "5,0"}) {
    (void)problem_of<int>(text);
  }
  for (const std::string text : {"", " 0.5", "0.5 ", "1e", "0x1p3", "1,5", "+-1"}) (void)problem_of<double>(text);
}

/// Runs one CLI11 parse of `--x VALUE` through `validator` into an int; returns the error text.
template <class T>
std::string option_error(const CLI::Validator& validator, const std::string& value, T* out = nullptr) {
  CLI::App app;
  T target{};
  app.add_option("--x,-x", target)->transform(validator);
  const std::vector<std::string> args{value, "--x"};  // CLI11 reads the vector back to front
  try {
    std::vector<std::string> copy = args;
    app.parse(copy);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (out != nullptr) *out = target;
  return "";
}

TEST(Numbers, ValidatorNamesTheOptionAndItsRange) {
  EXPECT_EQ(option_error<int>(number_in(0, 8, "4 per available CPU"), "40000"),
            "--x: 40000 is out of range: the value must be from 0 to 8 (4 per available CPU)");
  EXPECT_EQ(option_error<int>(number_in(0, 8), "-5"), "--x: -5 is out of range: the value must be from 0 to 8");
  EXPECT_EQ(option_error<float>(number_in(0.0f, 100.0f), "nan"), "--x: 'nan' is not a finite number");
  EXPECT_EQ(option_error<float>(number_in(0.0f, 1.0f), "1e999"),
            "--x: '1e999' is out of range: the value must be from 0 to 1");
  EXPECT_EQ(option_error<int>(number_of<int>({64, 128, 256}), "96"),
            "--x: 96 is not allowed: the value must be one of 64, 128, 256");
}

TEST(Numbers, ValidatorHandsCliElevenTheCheckedValue) {
  int i = 0;
  EXPECT_EQ(option_error<int>(number_in(0, 100), "010", &i), "");
  EXPECT_EQ(i, 10);  // CLI11 alone would have read octal 8
  uint64_t seed = 0;
  EXPECT_EQ(option_error<uint64_t>(number_in<uint64_t>(0, UINT64_MAX), "18446744073709551615", &seed), "");
  EXPECT_EQ(seed, UINT64_MAX);
  float f = 0;
  EXPECT_EQ(option_error<float>(number_in(0.0f, 1.0f), "0.95", &f), "");
  EXPECT_EQ(f, 0.95f);
}

TEST(Numbers, SizesTakeBinarySuffixesAndRefuseTheRest) {
  const auto bytes = [](const char* text) { return std::get<uint64_t>(parse_bytes(text, 0, UINT64_MAX)); };
  EXPECT_EQ(bytes("4096"), 4096u);
  EXPECT_EQ(bytes("64K"), 64u << 10);
  EXPECT_EQ(bytes("3m"), 3u << 20);
  EXPECT_EQ(bytes("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(bytes("1TB"), uint64_t{1} << 40);
  for (const char* bad : {"", "K", "1.5G", "-1", "12Q", "1 G", "0x10", "99999999999T", "nan"}) {
    EXPECT_TRUE(std::holds_alternative<std::string>(parse_bytes(bad, 0, UINT64_MAX))) << bad;
  }
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_bytes("1K", 2048, 4096)));
  // Every value out of range, however it overflows, states the range the option accepts.
  const std::string range = "the size must be from 1 to 1125899906842624 bytes";
  for (const char* big : {"99999999999999999999", "99999999999T", "1048577G", "0"}) {
    const auto parsed = parse_bytes(big, 1, uint64_t{1} << 50);
    ASSERT_TRUE(std::holds_alternative<std::string>(parsed)) << big;
    EXPECT_NE(std::get<std::string>(parsed).find(range), std::string::npos) << std::get<std::string>(parsed);
  }
}

TEST(TerminalText, EscapesEverythingATerminalWouldActOn) {
  EXPECT_EQ(printable("plain text, café, 日本"), "plain text, café, 日本");
  EXPECT_EQ(printable("\x1b[31mred\x1b]0;title\x07"), "\\x1b[31mred\\x1b]0;title\\x07");
  EXPECT_EQ(printable("a\nb\tc\rd\x7f"), "a\\nb\\tc\\rd\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u{9b}2J");           // C1 CSI, UTF-8 encoded
  EXPECT_EQ(printable("x\xe2\x80\xaey"), "x\\u{202e}y");        // right-to-left override
  EXPECT_EQ(printable("\xff\xc3"), "\\xff\\xc3");               // not UTF-8
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");      // an encoded surrogate
  EXPECT_EQ(printable("back\\slash"), "back\\\\slash");
  EXPECT_EQ(quoted_text("say \"hi\"\x1b"), "\"say \\\"hi\\\"\\x1b\"");
  for (int c = 0; c < 256; ++c) {
    const std::string shown = printable(std::string(1, static_cast<char>(c)));
    for (const char ch : shown) {
      const auto u = static_cast<unsigned char>(ch);
      EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "byte " << c << " shown as " << shown;
    }
  }
}

TEST(TerminalText, GeneratedTextKeepsSplitCharactersAndEscapesControls) {
  EXPECT_EQ(without_controls("line\n\ttab"), "line\n\ttab");
  EXPECT_EQ(without_controls("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(without_controls("\xe6\x97"), "\xe6\x97");  // half of a character, completed by the next piece
}

TEST(LogitComparison, IdenticalLogitsAgreeEverywhere) {
  LogitComparison c;
  const std::vector<float> a{0.5f, 2.0f, -1.0f, -INFINITY}, b{3.0f, 1.0f, 1.0f, 0.0f};
  c.add(a, a);
  c.add(b, b);
  EXPECT_EQ(c.positions, 2u);
  EXPECT_EQ(c.agreeing, 2u);
  EXPECT_EQ(c.agreement_percent(), 100.0);  // the default --min-agreement passes
  EXPECT_EQ(c.max_delta, 0.0);
  EXPECT_EQ(c.mean_delta(), 0.0);
}

TEST(LogitComparison, CountsDisagreementsAndDistances) {
  LogitComparison c;
  c.add(std::vector<float>{1, 0, 0}, std::vector<float>{0, 1, 0});
  c.add(std::vector<float>{0, 2, 0}, std::vector<float>{0, 1, 0});
  EXPECT_EQ(c.agreeing, 1u);
  EXPECT_EQ(c.agreement_percent(), 50.0);
  EXPECT_EQ(c.max_delta, 1.0);
  EXPECT_DOUBLE_EQ(c.mean_delta(), 3.0 / 6.0);
  EXPECT_EQ(LogitComparison{}.agreement_percent(), 0.0);  // nothing compared agrees with nothing
}

TEST(LogitComparison, ANanIsAnErrorNamingThePositionAndToken) {
  LogitComparison c;
  c.add(std::vector<float>{1, 0}, std::vector<float>{1, 0});
  try {
    c.add(std::vector<float>{1, 0}, std::vector<float>{1, NAN});
    FAIL() << "a NaN reference was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the reference's logit of token 1 at position 1 is NaN");
  }
  EXPECT_THROW(c.add(std::vector<float>{NAN, 0}, std::vector<float>{1, 0}), Error);
  EXPECT_THROW(c.add(std::vector<float>{1}, std::vector<float>{1, 0}), Error);
}

TEST(Activity, RemembersTheInnermostStepAnExceptionLeft) {
  EXPECT_EQ(Activity::failed_activity(), "");
  try {
    const Activity outer("reading the KV dump kv.safetensors");
    { const Activity done("a step that finished"); }
    const Activity inner("counting its exponents");
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
  }
  EXPECT_EQ(Activity::failed_activity(), "counting its exponents");
}

TEST(StandardOutput, ALostWriteIsAnError) {
  // In a child whose standard output is /dev/full: every write to it fails with ENOSPC.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int full = ::open("/dev/full", O_WRONLY);
    if (full < 0 || ::dup2(full, STDOUT_FILENO) < 0) ::_exit(2);
    std::printf("a result no one will see\n");
    try {
      finish_stdout();
    } catch (const Error& e) {
      ::_exit(std::string(e.what()) == "cannot write the results to standard output: No space left on device" ? 0 : 3);
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace gaac::cli
