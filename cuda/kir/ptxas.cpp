// Runs ptxas as a child process (posix_spawn, no shell) on a temporary file and parses the
// resource usage out of its -v log.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/cuda/kir/ptxas.hpp>

extern char** environ;

namespace kiln::cuda {

namespace {

bool executable(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

// A PTX file in the temporary directory, unique to this call, removed when this goes out of scope.
class TempPtx {
 public:
  explicit TempPtx(const std::string& text) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln_XXXXXX.ptx").string();
    int fd = mkostemps(tmpl.data(), 4, O_CLOEXEC);
    if (fd < 0) throw Error("run_ptxas: cannot create a temporary file " + tmpl + ": " + std::strerror(errno));
    path_ = tmpl;
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int err = errno;
        close(fd);
        std::remove(path_.c_str());
        throw Error("run_ptxas: cannot write " + path_ + ": " + std::strerror(err));
      }
      done += static_cast<size_t>(n);
    }
    close(fd);
  }
  ~TempPtx() { std::remove(path_.c_str()); }
  TempPtx(const TempPtx&) = delete;
  TempPtx& operator=(const TempPtx&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The largest number captured by `pattern` anywhere in the log, or `none` when it never matches.
int parse_max(const std::string& log, const std::string& pattern, int none) {
  int best = none;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    best = std::max(best, std::stoi((*it)[1].str()));
  return best;
}

}  // namespace

std::string find_ptxas() {
  if (const std::string path = settings().search_path; !path.empty()) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (dir.empty()) continue;
      std::string candidate = dir + "/ptxas";
      if (executable(candidate)) return candidate;
    }
  }
  const std::string fallback = "/usr/local/cuda/bin/ptxas";
  return executable(fallback) ? fallback : "";
}

PtxasResult run_ptxas(const std::string& ptx, int sm) {
  const std::string ptxas = find_ptxas();
  if (ptxas.empty()) throw Error("run_ptxas: ptxas not found on PATH or in /usr/local/cuda/bin");
  TempPtx file(ptx);

  int pipe_fds[2];
  // Close-on-exec, so that no other child process keeps the pipe open; ptxas gets it as its
  // stdout and stderr (dup2 clears the flag).
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(std::string("run_ptxas: pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  // PTX for sm_90a (wgmma) assembles only for that architecture-specific target.
  const bool sm90a = sm == 90 && ptx.find(".target sm_90a") != std::string::npos;
  std::vector<std::string> args = {
      ptxas, "-arch=sm_" + std::to_string(sm) + (sm90a ? "a" : ""), "-v", "-o", "/dev/null", file.path()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, ptxas.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (rc != 0) {
    close(pipe_fds[0]);
    throw Error("run_ptxas: cannot start " + ptxas + ": " + std::strerror(rc));
  }

  PtxasResult r;
  char buf[4096];
  for (;;) {
    ssize_t n = read(pipe_fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.log.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(std::string("run_ptxas: waitpid: ") + std::strerror(errno));
  }
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.registers = parse_max(r.log, R"(Used (\d+) registers)", -1);
  r.spill_stores = parse_max(r.log, R"((\d+) bytes spill stores)", 0);
  r.spill_loads = parse_max(r.log, R"((\d+) bytes spill loads)", 0);
  // ptxas reports usage with a "Used" line and leaves smem out of it when there is none.
  r.shared_bytes = parse_max(r.log, R"((\d+) bytes smem)", r.registers >= 0 ? 0 : -1);
  return r;
}

}  // namespace kiln::cuda
