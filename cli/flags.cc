#include "cli/flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace rollpack {
namespace {

constexpr int kWidth = 100;

// Greedy word wrap: help texts are written as one line in the source and
// must still fit a terminal.
std::string Wrap(absl::string_view text, int indent) {
  const std::string pad(indent, ' ');
  std::string out = pad;
  size_t column = indent;
  bool line_empty = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line_empty && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", pad);
      column = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    line_empty = false;
  }
  return out;
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

// Bounds are int64 for every integer type, so the comparisons must not let
// a negative bound wrap around for uint64 destinations.
template <typename T>
bool Below(T v, int64_t bound) {
  if constexpr (std::is_signed_v<T>) {
    return static_cast<int64_t>(v) < bound;
  } else {
    return bound > 0 && v < static_cast<uint64_t>(bound);
  }
}

template <typename T>
bool Above(T v, int64_t bound) {
  if constexpr (std::is_signed_v<T>) {
    return static_cast<int64_t>(v) > bound;
  } else {
    return bound < 0 || v > static_cast<uint64_t>(bound);
  }
}

// The accepted range as the error message states it: the destination type's
// limits narrowed by the flag's bounds.
template <typename T>
std::string RangeText(std::optional<int64_t> min, std::optional<int64_t> max) {
  using L = std::numeric_limits<T>;
  // A 64-bit upper limit is noise to the reader: nobody types past it by mistake.
  if (!max.has_value() && sizeof(T) >= sizeof(int64_t)) {
    if (min.has_value()) return absl::StrCat("want an integer >= ", *min);
    return std::is_signed_v<T> ? "want an integer" : "want an integer >= 0";
  }
  std::string lo = absl::StrCat(L::min());
  std::string hi = absl::StrCat(L::max());
  if (min.has_value() && Below(L::min(), *min)) lo = absl::StrCat(*min);
  if (max.has_value() && Above(L::max(), *max)) hi = absl::StrCat(*max);
  return absl::StrCat("want an integer in [", lo, ", ", hi, "]");
}

// Parses all of `value` (absl::SimpleAtoi refuses "12abc" and values that
// do not fit T) and checks the bounds. Returns why the value is refused, or
// "" after storing it.
template <typename T>
std::string SetInteger(absl::string_view value, std::optional<int64_t> min,
                       std::optional<int64_t> max, T* dst) {
  T v;
  if (!absl::SimpleAtoi(value, &v) || (min.has_value() && Below(v, *min)) ||
      (max.has_value() && Above(v, *max))) {
    return RangeText<T>(min, max);
  }
  *dst = v;
  return "";
}

}  // namespace

FlagSet::Flag& FlagSet::Flag::Min(int64_t min) {
  min_ = min;
  return *this;
}

FlagSet::Flag& FlagSet::Flag::Max(int64_t max) {
  max_ = max;
  return *this;
}

FlagSet::FlagSet(std::string command, std::string description)
    : command_(std::move(command)),
      description_(std::move(description)),
      out_(&std::cout),
      err_(&std::cerr) {}

FlagSet::~FlagSet() = default;

void FlagSet::SetOutput(std::ostream* out, std::ostream* err) {
  out_ = out;
  err_ = err;
}

FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  for (const std::unique_ptr<Flag>& f : flags_) {
    if (f->name_ == name) return f.get();
  }
  return nullptr;
}

FlagSet::Flag& FlagSet::Add(absl::string_view name, Flag::Kind kind, std::string default_text,
                            absl::string_view help,
                            std::function<std::string(const Flag&, absl::string_view)> set) {
  // A clash is a programming error that every run would hit: fail loudly.
  if (name.empty() || absl::StartsWith(name, "-") || name == "help" || Find(name) != nullptr ||
      (kind == Flag::Kind::kBool && absl::StartsWith(name, "no-"))) {
    std::fprintf(stderr, "%s: bad or duplicate flag name '%s'\n", command_.c_str(),
                 std::string(name).c_str());
    std::abort();
  }
  auto flag = std::make_unique<Flag>();
  flag->name_ = std::string(name);
  flag->help_ = std::string(help);
  flag->kind_ = kind;
  flag->default_text_ = std::move(default_text);
  flag->set_ = std::move(set);
  flags_.push_back(std::move(flag));
  return *flags_.back();
}

FlagSet::Flag& FlagSet::String(absl::string_view name, std::string* dst,
                               absl::string_view help) {
  return Add(name, Flag::Kind::kString, Quoted(*dst), help,
             [dst](const Flag&, absl::string_view value) {
               *dst = std::string(value);
               return std::string();
             });
}

FlagSet::Flag& FlagSet::Int(absl::string_view name, int* dst, absl::string_view help) {
  return Add(name, Flag::Kind::kInt, absl::StrCat(*dst), help,
             [dst](const Flag& f, absl::string_view value) {
               return SetInteger(value, f.min_, f.max_, dst);
             });
}

FlagSet::Flag& FlagSet::Int64(absl::string_view name, int64_t* dst, absl::string_view help) {
  return Add(name, Flag::Kind::kInt64, absl::StrCat(*dst), help,
             [dst](const Flag& f, absl::string_view value) {
               return SetInteger(value, f.min_, f.max_, dst);
             });
}

FlagSet::Flag& FlagSet::Uint64(absl::string_view name, uint64_t* dst, absl::string_view help) {
  return Add(name, Flag::Kind::kUint64, absl::StrCat(*dst), help,
             [dst](const Flag& f, absl::string_view value) {
               return SetInteger(value, f.min_, f.max_, dst);
             });
}

FlagSet::Flag& FlagSet::Double(absl::string_view name, double* dst, absl::string_view help) {
  return Add(name, Flag::Kind::kDouble, absl::StrCat(*dst), help,
             [dst](const Flag& f, absl::string_view value) {
               double v = 0;
               // SimpleAtod takes "inf" and "nan", which no command means.
               const bool ok = absl::SimpleAtod(value, &v) && std::isfinite(v) &&
                               !(f.min_.has_value() && v < static_cast<double>(*f.min_)) &&
                               !(f.max_.has_value() && v > static_cast<double>(*f.max_));
               if (ok) {
                 *dst = v;
                 return std::string();
               }
               if (f.min_.has_value() && f.max_.has_value()) {
                 return absl::StrCat("want a number in [", *f.min_, ", ", *f.max_, "]");
               }
               if (f.min_.has_value()) return absl::StrCat("want a number >= ", *f.min_);
               if (f.max_.has_value()) return absl::StrCat("want a number <= ", *f.max_);
               return std::string("want a number");
             });
}

FlagSet::Flag& FlagSet::Bool(absl::string_view name, bool* dst, absl::string_view help) {
  return Add(name, Flag::Kind::kBool, *dst ? "true" : "false", help,
             [dst](const Flag&, absl::string_view value) {
               // SimpleAtob also takes 1/0, yes/no, t/f: what scripts write.
               bool v = false;
               if (!absl::SimpleAtob(value, &v)) return std::string("want true or false");
               *dst = v;
               return std::string();
             });
}

FlagSet::Flag& FlagSet::Repeated(absl::string_view name, std::vector<std::string>* dst,
                                 absl::string_view help) {
  return Add(name, Flag::Kind::kRepeated,
             dst->empty() ? "none" : Quoted(absl::StrJoin(*dst, "\" \"")), help,
             [dst](const Flag& f, absl::string_view value) {
               if (!f.seen_) dst->clear();
               dst->push_back(std::string(value));
               return std::string();
             });
}

FlagSet::Flag& FlagSet::List(absl::string_view name, std::vector<std::string>* dst,
                             absl::string_view help) {
  return Add(name, Flag::Kind::kList, Quoted(absl::StrJoin(*dst, ",")), help,
             [dst](const Flag&, absl::string_view value) {
               *dst = absl::StrSplit(value, ',');
               return std::string();
             });
}

ParseResult FlagSet::Parse(int argc, char** argv) {
  for (const std::unique_ptr<Flag>& f : flags_) f->seen_ = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      *out_ << Usage();
      return ParseResult::Exit(0);
    }
    if (!absl::StartsWith(arg, "--") || arg == "--") {
      return ParseResult::Exit(UsageError(absl::StrCat("unexpected argument '", arg, "'")));
    }
    absl::string_view name = arg.substr(2);
    absl::string_view value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no-")) {
      flag = Find(name.substr(3));
      negated = flag != nullptr && flag->kind_ == Flag::Kind::kBool;
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return ParseResult::Exit(UsageError(absl::StrCat("unknown flag '", arg, "'")));
    }
    if (negated) {
      if (has_value) {
        return ParseResult::Exit(
            UsageError(absl::StrCat("--", name, " takes no value, got '", value, "'")));
      }
      value = "false";
    } else if (flag->kind_ == Flag::Kind::kBool) {
      if (!has_value) value = "true";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return ParseResult::Exit(UsageError(absl::StrCat("--", name, " needs a value")));
      }
      value = argv[++i];
    }
    if (const std::string why = flag->set_(*flag, value); !why.empty()) {
      return ParseResult::Exit(UsageError(
          absl::StrCat("invalid value '", value, "' for --", flag->name_, ": ", why)));
    }
    flag->seen_ = true;
  }
  return ParseResult::Continue();
}

int FlagSet::UsageError(absl::string_view message) const {
  *err_ << command_ << ": " << message << "\nRun '" << command_ << " --help' for its flags.\n";
  return 2;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n\n", Wrap(description_, 0),
                                 "\n\nflags:\n");
  for (const std::unique_ptr<Flag>& f : flags_) {
    std::string syntax;
    std::string default_text = absl::StrCat("(default ", f->default_text_, ")");
    switch (f->kind_) {
      case Flag::Kind::kString:
        syntax = absl::StrCat("--", f->name_, " STRING");
        break;
      case Flag::Kind::kInt:
      case Flag::Kind::kInt64:
      case Flag::Kind::kUint64:
        syntax = absl::StrCat("--", f->name_, " INT");
        break;
      case Flag::Kind::kDouble:
        syntax = absl::StrCat("--", f->name_, " NUMBER");
        break;
      case Flag::Kind::kBool:
        syntax = absl::StrCat("--[no-]", f->name_);
        break;
      case Flag::Kind::kRepeated:
        syntax = absl::StrCat("--", f->name_, " STRING (repeatable)");
        break;
      case Flag::Kind::kList:
        syntax = absl::StrCat("--", f->name_, " A,B,...");
        break;
    }
    absl::StrAppend(&out, "  ", syntax, "\n", Wrap(absl::StrCat(f->help_, " ", default_text), 6),
                    "\n");
  }
  absl::StrAppend(&out, "  -h, --help\n", Wrap("Print this text and exit.", 6), "\n");
  return out;
}

}  // namespace rollpack
