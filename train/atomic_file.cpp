// Atomic file replacement.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/atomic_file.hpp>

namespace kiln {

namespace {
void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    throw Error("fsync of '" + path + "' failed: " + std::strerror(err) +
                (err == ENOSPC || err == EDQUOT ? " (is the disk full?)" : ""));
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

void write_file_atomically(const std::string& path, std::string_view bytes) {
  replace_file_atomically(path, [&](const std::string& tmp) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) throw Error("cannot create '" + tmp + "' (for '" + path + "'): " + std::strerror(errno));
    int err = 0;
    for (size_t done = 0; done < bytes.size() && err == 0;) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno != EINTR) err = errno;
      if (n == 0) err = EIO;  // no progress and no error: never loop on it
      if (n > 0) done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0)
      throw Error("writing '" + path + "' failed: " + std::strerror(err) +
                  (err == ENOSPC || err == EDQUOT ? " (is the disk full?)" : ""));
  });
}

}  // namespace kiln
