// Atomic file replacement.
#include "train/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "circuit/ir/error.hpp"

namespace kiln {

namespace {
void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("fsync of '" + path + "' failed: " + std::strerror(err));
}
}  // namespace

void replace_file_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  static std::atomic<uint64_t> calls{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(calls++);
  try {
    write(tmp);
    fsync_path(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(std::filesystem::absolute(path).parent_path().string());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  replace_file_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw Error("cannot write '" + tmp + "' (for '" + path + "'): " + std::strerror(errno));
  });
}

}  // namespace kiln
