#include "cli/flags.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A FlagSet with one flag of every kind, its output captured.
class FlagsTest : public ::testing::Test {
 protected:
  FlagsTest() : flags_("rollpack test", "Exercises every kind of flag.") {
    flags_.String("name", &name_, "A string.");
    flags_.Int("count", &count_, "An int.");
    flags_.Int("samples", &samples_, "Refuses negatives.").Min(0);
    flags_.Int("streams", &streams_, "Between 1 and 64.").Range(1, 64);
    flags_.Int64("bytes", &bytes_, "An int64.");
    flags_.Uint64("seed", &seed_, "A uint64.");
    flags_.Double("seconds", &seconds_, "A double.");
    flags_.Bool("json", &json_, "A bool, false by default.");
    flags_.Bool("sequence-parallel", &sp_, "A bool, true by default.");
    flags_.Repeated("server-arg", &server_args_, "Repeatable.");
    flags_.List("phases", &phases_, "A comma-separated list.");
    flags_.SetOutput(&out_, &err_);
  }

  ParseResult Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "test");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return flags_.Parse(static_cast<int>(argv.size()), argv.data());
  }

  // Parses, expects exit 2 and returns the error text.
  std::string ParseError(std::vector<std::string> args) {
    const ParseResult r = Parse(std::move(args));
    EXPECT_TRUE(r.should_exit());
    EXPECT_EQ(r.exit_code(), 2);
    EXPECT_THAT(out_.str(), IsEmpty());
    EXPECT_THAT(err_.str(), HasSubstr("Run 'rollpack test --help'"));
    return err_.str();
  }

  std::string name_ = "default-name";
  int count_ = 7;
  int samples_ = 1024;
  int streams_ = 0;
  int64_t bytes_ = 8 << 20;
  uint64_t seed_ = 2026;
  double seconds_ = 30;
  bool json_ = false;
  bool sp_ = true;
  std::vector<std::string> server_args_;
  std::vector<std::string> phases_ = {"ingest", "fetch", "first"};
  std::ostringstream out_, err_;
  FlagSet flags_;
};

TEST_F(FlagsTest, NoArgumentsKeepsDefaults) {
  const ParseResult r = Parse({});
  EXPECT_FALSE(r.should_exit());
  EXPECT_EQ(name_, "default-name");
  EXPECT_EQ(count_, 7);
  EXPECT_EQ(bytes_, 8 << 20);
  EXPECT_TRUE(sp_);
  EXPECT_THAT(phases_, ElementsAre("ingest", "fetch", "first"));
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(FlagsTest, BothFormsForEveryKind) {
  const ParseResult r =
      Parse({"--name", "a", "--count=-3", "--samples", "12", "--streams=64", "--bytes",
             "1099511627776", "--seed=18446744073709551615", "--seconds", "0.25",
             "--server-arg", "--listen=x", "--server-arg=--fsync", "--phases=fetch,first"});
  ASSERT_FALSE(r.should_exit()) << err_.str();
  EXPECT_EQ(name_, "a");
  EXPECT_EQ(count_, -3);
  EXPECT_EQ(samples_, 12);
  EXPECT_EQ(streams_, 64);
  EXPECT_EQ(bytes_, int64_t{1} << 40);
  EXPECT_EQ(seed_, UINT64_MAX);
  EXPECT_DOUBLE_EQ(seconds_, 0.25);
  // Values are verbatim, even ones that look like flags.
  EXPECT_THAT(server_args_, ElementsAre("--listen=x", "--fsync"));
  EXPECT_THAT(phases_, ElementsAre("fetch", "first"));

  ASSERT_FALSE(Parse({"--name=b=c", "--count", "5", "--phases", "ingest"}).should_exit());
  EXPECT_EQ(name_, "b=c");  // split at the first '='
  EXPECT_EQ(count_, 5);
  EXPECT_THAT(phases_, ElementsAre("ingest"));
  ASSERT_FALSE(Parse({"--name="}).should_exit());
  EXPECT_EQ(name_, "");
}

TEST_F(FlagsTest, BoolForms) {
  ASSERT_FALSE(Parse({"--json", "--no-sequence-parallel"}).should_exit());
  EXPECT_TRUE(json_);
  EXPECT_FALSE(sp_);
  ASSERT_FALSE(Parse({"--json=false", "--sequence-parallel=true"}).should_exit());
  EXPECT_FALSE(json_);
  EXPECT_TRUE(sp_);
  ASSERT_FALSE(Parse({"--sequence-parallel=0", "--json=1"}).should_exit());
  EXPECT_FALSE(sp_);
  EXPECT_TRUE(json_);
  ASSERT_FALSE(Parse({"--no-json", "--sequence-parallel"}).should_exit());
  EXPECT_FALSE(json_);
  EXPECT_TRUE(sp_);
  // A bool never takes the next argument: it stays a flag of its own.
  ASSERT_FALSE(Parse({"--json", "--name", "x"}).should_exit());
  EXPECT_TRUE(json_);
  EXPECT_EQ(name_, "x");
}

TEST_F(FlagsTest, BadBools) {
  std::string err = ParseError({"--json=maybe"});
  EXPECT_THAT(err, HasSubstr("--json"));
  EXPECT_THAT(err, HasSubstr("'maybe'"));
  err_.str("");
  err = ParseError({"--no-json=true"});
  EXPECT_THAT(err, HasSubstr("--no-json"));
  EXPECT_THAT(err, HasSubstr("'true'"));
  err_.str("");
  // --no- only negates bools.
  EXPECT_THAT(ParseError({"--no-count"}), HasSubstr("unknown flag '--no-count'"));
}

TEST_F(FlagsTest, RepeatedAppendsAndReplacesDefaults) {
  server_args_ = {"default"};
  ASSERT_FALSE(Parse({"--server-arg", "a", "--count", "1", "--server-arg", "b"}).should_exit());
  EXPECT_THAT(server_args_, ElementsAre("a", "b"));
  // A second Parse starts over rather than appending to the first one's values.
  ASSERT_FALSE(Parse({"--server-arg=c"}).should_exit());
  EXPECT_THAT(server_args_, ElementsAre("c"));
}

TEST_F(FlagsTest, ListTakesTheLastOccurrence) {
  ASSERT_FALSE(Parse({"--phases", "a,b", "--phases=c,d,e"}).should_exit());
  EXPECT_THAT(phases_, ElementsAre("c", "d", "e"));
}

TEST_F(FlagsTest, HelpPrintsEveryFlagAndExitsZero) {
  for (const char* help : {"--help", "-h"}) {
    out_.str("");
    // --help wins over the errors that would come after it.
    const ParseResult r = Parse({"--count", "3", help, "--bogus"});
    EXPECT_TRUE(r.should_exit());
    EXPECT_EQ(r.exit_code(), 0);
    EXPECT_THAT(err_.str(), IsEmpty());
    const std::string text = out_.str();
    EXPECT_THAT(text, HasSubstr("usage: rollpack test [flags]"));
    EXPECT_THAT(text, HasSubstr("Exercises every kind of flag."));
    for (const char* flag :
         {"--name STRING", "--count INT", "--samples INT", "--bytes INT", "--seed INT",
          "--seconds NUMBER", "--[no-]json", "--[no-]sequence-parallel",
          "--server-arg STRING (repeatable)", "--phases A,B,...", "-h, --help"}) {
      EXPECT_THAT(text, HasSubstr(flag)) << flag;
    }
    // Help texts with the defaults as registered, not as parsed.
    for (const char* help_text :
         {"A string. (default \"default-name\")", "An int. (default 7)",
          "An int64. (default 8388608)", "A uint64. (default 2026)", "A double. (default 30)",
          "A bool, false by default. (default false)", "A bool, true by default. (default true)",
          "Repeatable. (default none)",
          "A comma-separated list. (default \"ingest,fetch,first\")"}) {
      EXPECT_THAT(text, HasSubstr(help_text)) << help_text;
    }
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      EXPECT_LE(line.size(), 100u) << line;
    }
  }
}

TEST_F(FlagsTest, UnknownFlag) {
  const std::string err = ParseError({"--count", "1", "--bogus", "3"});
  EXPECT_THAT(err, HasSubstr("rollpack test: unknown flag '--bogus'"));
  err_.str("");
  EXPECT_THAT(ParseError({"--bogus=3"}), HasSubstr("unknown flag '--bogus=3'"));
  err_.str("");
  EXPECT_THAT(ParseError({"stray"}), HasSubstr("unexpected argument 'stray'"));
  err_.str("");
  EXPECT_THAT(ParseError({"-x"}), HasSubstr("unexpected argument '-x'"));
}

TEST_F(FlagsTest, MissingValue) {
  EXPECT_THAT(ParseError({"--count"}), HasSubstr("rollpack test: --count needs a value"));
  err_.str("");
  EXPECT_THAT(ParseError({"--server-arg"}), HasSubstr("--server-arg needs a value"));
}

TEST_F(FlagsTest, MalformedValuesNameTheFlagAndValue) {
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"--count", "x"}, "invalid value 'x' for --count: want an integer in [-2147483648, "},
      {{"--count=12abc"}, "invalid value '12abc' for --count"},
      {{"--count", ""}, "invalid value '' for --count"},
      {{"--count", "2147483648"}, "invalid value '2147483648' for --count"},
      {{"--samples", "-3"}, "invalid value '-3' for --samples: want an integer in [0, 2147483647]"},
      {{"--streams", "0"}, "invalid value '0' for --streams: want an integer in [1, 64]"},
      {{"--streams=65"}, "invalid value '65' for --streams"},
      {{"--bytes", "9223372036854775808"}, "invalid value '9223372036854775808' for --bytes"},
      {{"--seed", "-1"}, "invalid value '-1' for --seed: want an integer >= 0"},
      {{"--seconds", "fast"}, "invalid value 'fast' for --seconds: want a number"},
      {{"--seconds", "nan"}, "invalid value 'nan' for --seconds"},
      {{"--seconds", "1.5s"}, "invalid value '1.5s' for --seconds"},
  };
  for (const Case& c : cases) {
    err_.str("");
    const int count = count_, samples = samples_, streams = streams_;
    EXPECT_THAT(ParseError(c.args), HasSubstr(c.want)) << c.args[0];
    // A refused value leaves the destination alone.
    EXPECT_EQ(count, count_);
    EXPECT_EQ(samples, samples_);
    EXPECT_EQ(streams, streams_);
  }
}

TEST_F(FlagsTest, UsageErrorForLaterValidation) {
  EXPECT_EQ(flags_.UsageError("--a and --b are required"), 2);
  EXPECT_THAT(err_.str(), HasSubstr("rollpack test: --a and --b are required\n"
                                    "Run 'rollpack test --help'"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("required")));
}

TEST(FlagSetTest, DuplicateNameAborts) {
  int a = 0, b = 0;
  FlagSet flags("rollpack dup", "Duplicate names.");
  flags.Int("x", &a, "First.");
  EXPECT_DEATH(flags.Int("x", &b, "Second."), "duplicate flag name 'x'");
}

}  // namespace
}  // namespace rollpack
