// Files written whole or not at all. `write` fills a temporary file beside `path` (a name unique
// to this process and call), which is then fsynced and renamed over `path`, and the directory
// fsynced; any failure (of `write` or of the file system) removes the temporary file, leaves
// `path` as it was and throws. HDF5 files go through h5::write_atomically, built on this.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace kiln {

void replace_file_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write);
// `bytes` as the whole file.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace kiln
