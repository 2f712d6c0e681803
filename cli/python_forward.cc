#include "cli/python_forward.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifndef ROLLPACK_PYTHON_DIR
#define ROLLPACK_PYTHON_DIR "client/python"  // relative to the repository root
#endif

namespace rollpack {
namespace {

constexpr char kDebianPython[] = "/usr/bin/python3";

// Prints "<grpc> <rollpack>" (1 = importable) without importing either.
constexpr char kProbe[] =
    "import importlib.util as u\n"
    "print(int(u.find_spec('grpc') is not None), int(u.find_spec('rollpack') is not None))\n";

bool Executable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

bool HoldsPackage(const std::string& dir) {
  struct stat st;
  return stat((dir + "/rollpack/__main__.py").c_str(), &st) == 0;
}

std::string Env(const char* name) {
  const char* value = getenv(name);
  return value != nullptr ? value : "";
}

struct Probe {
  bool grpc = false;
  bool rollpack = false;
};

// Runs the interpreter on kProbe; nothing found when it cannot run.
Probe ProbeInterpreter(const std::string& python) {
  Probe found;
  int out[2];
  if (pipe(out) != 0) return found;
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return found;
  }
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    execl(python.c_str(), python.c_str(), "-c", kProbe, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  char buffer[64] = {0};
  size_t used = 0;
  ssize_t n;
  while (used + 1 < sizeof(buffer) &&
         (n = read(out[0], buffer + used, sizeof(buffer) - 1 - used)) > 0) {
    used += static_cast<size_t>(n);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return found;
  int grpc = 0, rollpack = 0;
  if (std::sscanf(buffer, "%d %d", &grpc, &rollpack) == 2) {
    found.grpc = grpc == 1;
    found.rollpack = rollpack == 1;
  }
  return found;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

std::string SelfPath() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  return std::string(buffer, static_cast<size_t>(n));
}

}  // namespace

PythonChoice ChoosePython(const std::string& self, const std::string& built_from) {
  PythonChoice choice;
  bool has_package = false;
  if (const std::string forced = Env("ROLLPACK_PYTHON"); !forced.empty()) {
    if (!Executable(forced)) {
      choice.error = absl::StrCat("ROLLPACK_PYTHON=", forced, " is not an executable file");
      return choice;
    }
    choice.interpreter = forced;
    has_package = ProbeInterpreter(forced).rollpack;
  } else {
    std::vector<std::string> candidates;
    if (const std::string venv = Env("VIRTUAL_ENV"); !venv.empty()) {
      candidates.push_back(venv + "/bin/python3");
    }
    for (absl::string_view dir : absl::StrSplit(Env("PATH"), ':', absl::SkipEmpty())) {
      candidates.push_back(absl::StrCat(dir, "/python3"));
    }
    candidates.push_back(kDebianPython);
    std::set<std::string> tried;
    for (const std::string& python : candidates) {
      if (!tried.insert(python).second || !Executable(python)) continue;
      const Probe probe = ProbeInterpreter(python);
      if (!probe.grpc) continue;
      choice.interpreter = python;
      has_package = probe.rollpack;
      break;
    }
    if (choice.interpreter.empty()) choice.interpreter = kDebianPython;
  }
  if (has_package) return choice;
  std::vector<std::string> looked;
  for (const std::string& dir :
       {DirName(self) + "/../lib/rollpack/python", std::string(built_from)}) {
    if (dir.empty()) continue;
    if (HoldsPackage(dir)) {
      choice.package_dir = dir;
      return choice;
    }
    looked.push_back(dir);
  }
  choice.error = absl::StrCat("no rollpack Python package for ", choice.interpreter,
                              ": it has none installed (pip "
                              "install ./client/python), and none is in ",
                              absl::StrJoin(looked, " or "),
                              " (set ROLLPACK_PYTHON to an interpreter that has it)");
  return choice;
}

int ForwardToPython(int argc, char** argv) {
  const PythonChoice choice = ChoosePython(SelfPath(), ROLLPACK_PYTHON_DIR);
  if (!choice.error.empty()) {
    std::fprintf(stderr, "rollpack %s: %s\n", argv[0], choice.error.c_str());
    return 127;
  }
  if (!choice.package_dir.empty()) {
    const std::string existing = Env("PYTHONPATH");
    const std::string path =
        existing.empty() ? choice.package_dir : choice.package_dir + ":" + existing;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> args = {const_cast<char*>(choice.interpreter.c_str()), const_cast<char*>("-m"),
                             const_cast<char*>("rollpack")};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(args[0], args.data());
  const int error = errno;
  std::fprintf(stderr, "rollpack %s: cannot run %s: %s\n", argv[0], choice.interpreter.c_str(),
               std::strerror(error));
  return 127;
}

}  // namespace rollpack
