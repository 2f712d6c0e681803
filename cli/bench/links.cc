#include "cli/bench/links.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "cli/bench/cleanup.h"

namespace rollpack {
namespace {

constexpr char kIpForward[] = "/proc/sys/net/ipv4/ip_forward";

// iproute2's binaries by absolute path where they are: root's PATH may lack
// /usr/sbin under sudo or cron.
std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = dir + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return name;
}

struct CommandResult {
  int exit_code = -1;  // -1: could not run
  std::string output;  // stdout and stderr
};

CommandResult Run(std::vector<std::string> args) {
  CommandResult result;
  int out[2];
  // Close-on-exec: a child another thread starts meanwhile must not keep
  // the write end (this read would wait for it to exit).
  if (pipe2(out, O_CLOEXEC) != 0) {
    result.output = "pipe failed";
    return result;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    result.output = "fork failed";
    return result;
  }
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    close(out[1]);
    execv(argv[0], argv.data());
    execvp(argv[0], argv.data());
    // Only async-signal-safe calls after fork() in a threaded process.
    (void)!write(2, "cannot run ", 11);
    (void)!write(2, argv[0], std::strlen(argv[0]));
    _exit(127);
  }
  close(out[1]);
  char buf[4096];
  while (true) {
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n > 0) {
      result.output.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// INTERNAL naming the command and what it printed, unless it exited 0;
// FAILED_PRECONDITION naming the capability when the kernel refused it.
absl::Status Must(std::vector<std::string> args) {
  const std::string line = absl::StrJoin(args, " ");
  CommandResult r = Run(std::move(args));
  if (r.exit_code == 0) return absl::OkStatus();
  if (absl::StrContains(r.output, "Operation not permitted")) {
    return absl::FailedPreconditionError(
        absl::StrCat("--link-gbps needs CAP_NET_ADMIN (veth pairs, addresses, routes, tc): `",
                     line, "`: ", absl::StripAsciiWhitespace(r.output)));
  }
  return absl::InternalError(absl::StrCat("`", line, "` exited ", r.exit_code, ": ",
                                          absl::StripAsciiWhitespace(r.output)));
}

// An IPv4 prefix; a bare address is a /32.
struct Prefix {
  uint32_t net = 0;
  int length = 32;
};

bool ParsePrefix(absl::string_view text, Prefix* out) {
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, '/');
  in_addr addr{};
  if (inet_pton(AF_INET, std::string(parts.first).c_str(), &addr) != 1) return false;
  out->net = ntohl(addr.s_addr);
  out->length = 32;
  if (!parts.second.empty() &&
      (!absl::SimpleAtoi(parts.second, &out->length) || out->length < 0 || out->length > 32)) {
    return false;
  }
  return true;
}

bool Overlap(const Prefix& a, const Prefix& b) {
  const int length = std::min(a.length, b.length);
  const uint32_t mask = length == 0 ? 0 : ~uint32_t{0} << (32 - length);
  return (a.net & mask) == (b.net & mask);
}

// The A of a 10.A.0.0/16 that no route or address of the host overlaps,
// starting from one that depends on the pid (two benchmarks at once pick
// different ones); -1 if every one does.
int PickOctet() {
  std::vector<Prefix> taken;
  for (std::vector<std::string> args :
       {std::vector<std::string>{Tool("ip"), "-4", "route", "show", "table", "all"},
        std::vector<std::string>{Tool("ip"), "-4", "addr", "show"}}) {
    const CommandResult r = Run(args);
    for (absl::string_view token : absl::StrSplit(r.output, absl::ByAnyChar(" \t\n"),
                                                  absl::SkipEmpty())) {
      Prefix p;
      if (ParsePrefix(token, &p)) taken.push_back(p);
    }
  }
  const int first = 200 + static_cast<int>(getpid() % 50);
  for (int k = 0; k < 155; ++k) {
    const int octet = 100 + (first - 100 + k) % 155;
    const Prefix candidate{(10u << 24) | (static_cast<uint32_t>(octet) << 16), 16};
    if (std::none_of(taken.begin(), taken.end(),
                     [&](const Prefix& p) { return Overlap(p, candidate); })) {
      return octet;
    }
  }
  return -1;
}

std::string Name(pid_t pid, int i) { return absl::StrCat("rpb", pid, "m", i); }

}  // namespace

std::string MemberLinks::netns(int i) const { return Name(getpid(), i); }
std::string MemberLinks::member_ip(int i) const { return absl::StrCat("10.", octet_, ".", i, ".2"); }
std::string MemberLinks::host_ip(int i) const { return absl::StrCat("10.", octet_, ".", i, ".1"); }

absl::StatusOr<std::unique_ptr<MemberLinks>> MemberLinks::Create(int members,
                                                                 double gbytes_per_second) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--link-gbps needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN, for network namespaces, veth "
        "pairs and tc); running as uid ",
        geteuid()));
  }
  if (members > 250) {
    return absl::InvalidArgumentError(absl::StrCat("--link-gbps takes at most 250 members, not ",
                                                   members));
  }
  RemoveStale();
  const int octet = PickOctet();
  if (octet < 0) {
    return absl::FailedPreconditionError(
        "--link-gbps: every 10.A.0.0/16 (A in 100..254) overlaps a route of this host");
  }
  std::unique_ptr<MemberLinks> links(new MemberLinks(members, octet));
  MemberLinks* raw = links.get();
  links->cleanup_id_ = AddCleanupAction([raw] { raw->TearDown(); });
  for (int i = 0; i < members; ++i) {
    // On failure the destructor removes what was made.
    RETURN_IF_ERROR(links->SetUp(i, gbytes_per_second));
  }
  // Members reach each other, and etcd on the host, through the host.
  std::string old;
  std::ifstream(kIpForward) >> old;
  if (old != "1") {
    {
      absl::MutexLock lock(&links->mu_);
      links->old_ip_forward_ = old.empty() ? "0" : old;
    }
    std::ofstream(kIpForward) << "1\n";
    std::string now;
    std::ifstream(kIpForward) >> now;
    if (now != "1") {
      return absl::FailedPreconditionError(
          absl::StrCat("--link-gbps: cannot set ", kIpForward, " to 1 (it stays ", now,
                       "): the namespaces could not reach each other"));
    }
  }
  return links;
}

absl::Status MemberLinks::SetUp(int i, double gbytes_per_second) {
  const std::string ip = Tool("ip"), tc = Tool("tc");
  const std::string ns = netns(i), host_end = ns + "h", ns_end = ns + "n";
  if (absl::Status s = Must({ip, "netns", "add", ns}); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--link-gbps needs network namespaces (CAP_SYS_ADMIN; in a container, one allowed to "
        "create them): ",
        s.message()));
  }
  RETURN_IF_ERROR(Must({ip, "link", "add", host_end, "type", "veth", "peer", "name", ns_end}));
  RETURN_IF_ERROR(Must({ip, "link", "set", ns_end, "netns", ns}));
  RETURN_IF_ERROR(Must({ip, "addr", "add", host_ip(i) + "/30", "dev", host_end}));
  RETURN_IF_ERROR(Must({ip, "link", "set", host_end, "up"}));
  RETURN_IF_ERROR(Must({ip, "-n", ns, "addr", "add", member_ip(i) + "/30", "dev", ns_end}));
  RETURN_IF_ERROR(Must({ip, "-n", ns, "link", "set", ns_end, "up"}));
  RETURN_IF_ERROR(Must({ip, "-n", ns, "link", "set", "lo", "up"}));
  RETURN_IF_ERROR(Must({ip, "-n", ns, "route", "add", "default", "via", host_ip(i)}));
  // Token bucket on both ends: the host's end shapes what flows into the
  // member, the namespace's end what flows out of it. A bucket of 4 ms of
  // traffic (at least 256 KiB, above a GSO packet) keeps bursts small next
  // to a fetch of seconds; the queue holds 50 ms before dropping.
  const double bytes_per_second = gbytes_per_second * 1e9;
  const std::string rate = absl::StrCat(static_cast<int64_t>(bytes_per_second * 8), "bit");
  const std::string burst =
      absl::StrCat(std::max<int64_t>(256 << 10, static_cast<int64_t>(bytes_per_second * 0.004)));
  RETURN_IF_ERROR(Must({tc, "qdisc", "add", "dev", host_end, "root", "tbf", "rate", rate,
                        "burst", burst, "latency", "50ms"}));
  RETURN_IF_ERROR(Must({tc, "-n", ns, "qdisc", "add", "dev", ns_end, "root", "tbf", "rate", rate,
                        "burst", burst, "latency", "50ms"}));
  return absl::OkStatus();
}

MemberLinks::~MemberLinks() {
  TearDown();
  RemoveCleanupAction(cleanup_id_);
}

void MemberLinks::TearDown() {
  absl::MutexLock lock(&mu_);
  if (torn_down_) return;
  torn_down_ = true;
  const std::string ip = Tool("ip");
  for (int i = 0; i < members_; ++i) {
    // Deleting one end of a veth pair deletes both (and their qdiscs); a
    // namespace goes once its name is deleted and no process is left in it.
    // Either may not exist (a failed SetUp): errors are expected here.
    Run({ip, "link", "del", netns(i) + "h"});
    Run({ip, "netns", "del", netns(i)});
  }
  if (!old_ip_forward_.empty()) {
    std::ofstream(kIpForward) << old_ip_forward_ << "\n";
    old_ip_forward_.clear();
  }
}

void MemberLinks::RemoveStale() {
  const CommandResult r = Run({Tool("ip"), "netns", "list"});
  if (r.exit_code != 0) return;
  for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
    // "rpb<pid>m<i>" or "rpb<pid>m<i> (id: N)".
    const absl::string_view name = line.substr(0, line.find(' '));
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, "rpb")) continue;
    const size_t m = rest.find('m');
    int pid = 0, index = 0;
    if (m == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, m), &pid) ||
        !absl::SimpleAtoi(rest.substr(m + 1), &index) || pid <= 0 || pid == getpid()) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running
    std::fprintf(stderr, "rollpack: removing namespace %s of a benchmark no longer running\n",
                 std::string(name).c_str());
    Run({Tool("ip"), "link", "del", absl::StrCat(name, "h")});
    Run({Tool("ip"), "netns", "del", std::string(name)});
  }
}

}  // namespace rollpack
