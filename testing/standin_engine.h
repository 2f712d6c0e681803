// Runs testing/standin_engine.py (a stand-in vLLM or SGLang server written
// from the engines' documented formats) as a child process on 127.0.0.1
// with an ephemeral port, for the capture port's end-to-end tests. The
// destructor kills it.
#ifndef ROLLPACK_TESTING_STANDIN_ENGINE_H_
#define ROLLPACK_TESTING_STANDIN_ENGINE_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "testing/child_process.h"

namespace rollpack {

class StandinEngine {
 public:
  // `python` runs `script` with `args` (--engine ... and the model's flags)
  // plus --port 0; returns once it printed `PORT <n>`.
  static absl::StatusOr<std::unique_ptr<StandinEngine>> Start(const std::string& python,
                                                               const std::string& script,
                                                               std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) return absl::InternalError("pipe failed");
    args.insert(args.begin(), {python, script, "--port", "0"});
    ChildOutput output;
    output.stdout_fd = out[1];
    output.close_in_child = {out[0], out[1]};
    absl::StatusOr<pid_t> pid = SpawnChild(std::move(args), output);
    close(out[1]);
    if (!pid.ok()) {
      close(out[0]);
      return pid.status();
    }
    std::unique_ptr<StandinEngine> engine(new StandinEngine(*pid));
    FILE* stream = fdopen(out[0], "r");
    char line[128] = {0};
    const bool got = stream != nullptr && std::fgets(line, sizeof(line), stream) != nullptr;
    if (stream != nullptr) std::fclose(stream);  // later output goes nowhere
    absl::string_view text = absl::StripAsciiWhitespace(line);
    int port = 0;
    if (!got || !absl::ConsumePrefix(&text, "PORT ") || !absl::SimpleAtoi(text, &port)) {
      return absl::UnavailableError(
          absl::StrCat("the stand-in engine did not start (", script, "): \"", line, "\""));
    }
    engine->port_ = port;
    return engine;
  }

  ~StandinEngine() { Kill(); }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

 private:
  explicit StandinEngine(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  int port_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_STANDIN_ENGINE_H_
