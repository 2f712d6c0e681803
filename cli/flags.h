// The `rollpack` sub-commands' flags: each command declares its flags once,
// with a destination and a help text, and gets the same syntax, --help text
// and error messages as every other command.
//
//   int n = 1024;
//   FlagSet flags("rollpack bench layout", "Bytes each trainer rank receives ...");
//   flags.Int("samples", &n, "Synthetic rollouts per case.").Min(1);
//   if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
//
// Syntax: `--name value` and `--name=value`; booleans take no separate value
// (`--x`, `--no-x`, `--x=true|false`) so that `--json --svg FILE` parses as
// two flags. `-h` and `--help` print the usage text. There are no positional
// arguments. A value is taken verbatim, even one that starts with "--", since
// bench transport's --server-arg passes rollpackd's own flags through.
#ifndef ROLLPACK_CLI_FLAGS_H_
#define ROLLPACK_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace rollpack {

// What Parse tells its caller: go on with the parsed values, or return
// exit_code() from the command (0 after --help, 2 after a usage error).
class ParseResult {
 public:
  static ParseResult Continue() { return ParseResult(false, 0); }
  static ParseResult Exit(int code) { return ParseResult(true, code); }

  bool should_exit() const { return should_exit_; }
  int exit_code() const { return exit_code_; }

 private:
  ParseResult(bool should_exit, int exit_code)
      : should_exit_(should_exit), exit_code_(exit_code) {}

  bool should_exit_;
  int exit_code_;
};

class FlagSet {
 public:
  // One registered flag; the registration functions return it so that
  // bounds can be chained on.
  class Flag {
   public:
    // Bounds on a numeric flag's value (ignored for other kinds); a value
    // outside them is a usage error that states the accepted range.
    Flag& Min(int64_t min);
    Flag& Max(int64_t max);
    Flag& Range(int64_t min, int64_t max) { return Min(min).Max(max); }

   private:
    friend class FlagSet;
    enum class Kind { kString, kInt, kInt64, kUint64, kDouble, kBool, kRepeated, kList };

    std::string name_;
    std::string help_;
    Kind kind_ = Kind::kString;
    std::string default_text_;  // as the usage text shows it; empty: no default shown
    std::optional<int64_t> min_, max_;
    bool seen_ = false;  // during Parse: whether an earlier argument set it
    // Stores `value` in the destination, or returns why it cannot ("want an
    // integer in [1, 64]"), which Parse turns into the error line.
    std::function<std::string(const Flag& self, absl::string_view value)> set_;
  };

  // `command` is what the user typed to get here ("rollpack bench load");
  // `description` is one paragraph, wrapped by Usage().
  FlagSet(std::string command, std::string description);
  FlagSet(const FlagSet&) = delete;
  FlagSet& operator=(const FlagSet&) = delete;
  ~FlagSet();

  // Each registers `--name` (no dashes in `name`). The destination's value
  // at registration time is the default that Usage() shows, and stays if the
  // flag is not given. Names must be unique; a duplicate aborts.
  Flag& String(absl::string_view name, std::string* dst, absl::string_view help);
  Flag& Int(absl::string_view name, int* dst, absl::string_view help);
  Flag& Int64(absl::string_view name, int64_t* dst, absl::string_view help);
  Flag& Uint64(absl::string_view name, uint64_t* dst, absl::string_view help);
  Flag& Double(absl::string_view name, double* dst, absl::string_view help);
  // Also registers `--no-name`.
  Flag& Bool(absl::string_view name, bool* dst, absl::string_view help);
  // Every occurrence appends its value; the defaults are dropped by the
  // first occurrence.
  Flag& Repeated(absl::string_view name, std::vector<std::string>* dst, absl::string_view help);
  // `--name a,b,c`: the last occurrence replaces the list.
  Flag& List(absl::string_view name, std::vector<std::string>* dst, absl::string_view help);

  // argv[0] is the command's own name and is skipped. On --help, prints
  // Usage() to the output stream; on an error, one line naming the flag and
  // the value, then a hint to run --help, to the error stream.
  [[nodiscard]] ParseResult Parse(int argc, char** argv);

  // For validation after Parse: prints "<command>: <message>" and the --help
  // hint to the error stream; returns 2, the usage-error exit code.
  int UsageError(absl::string_view message) const;

  std::string Usage() const;

  // Where Parse and UsageError write (std::cout and std::cerr by default);
  // tests point them at string streams.
  void SetOutput(std::ostream* out, std::ostream* err);

 private:
  Flag& Add(absl::string_view name, Flag::Kind kind, std::string default_text,
            absl::string_view help,
            std::function<std::string(const Flag& self, absl::string_view value)> set);
  Flag* Find(absl::string_view name) const;

  std::string command_;
  std::string description_;
  std::vector<std::unique_ptr<Flag>> flags_;  // pointers stay valid for the Flag& handles
  std::ostream* out_;
  std::ostream* err_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLI_FLAGS_H_
