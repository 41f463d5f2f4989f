// MappedFile: read-only mmap of a whole file. Weights are used in place from here (never copied at load).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace latent {

class MappedFile {
 public:
  // Throws latent::Error naming the path if the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace latent
