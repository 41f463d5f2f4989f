// safetensors reader: single file or sharded (model.safetensors.index.json). Memory-mapped; tensors are used in
// place (never copied or upcast at load). Strict validation: every failure throws latent::Error with ONE line
// naming the file and, where there is one, the tensor.
//
// File layout: u64 little-endian header length N, then N bytes of UTF-8 JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...}
// then the data region; offsets are relative to the start of the data region.
//
// F4 (packed E2M1, two codes per byte): the shape normally counts logical elements (byte span = numel / 2). A
// file whose shape counts packed bytes instead (byte span = numel) is accepted and its last dim is doubled, so
// TensorInfo::shape always counts logical elements (docs/quantization.md §encodings: inferred from the byte size).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace latent {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // offset into the data region
  uint64_t end = 0;
};

// Parses and validates a header (the JSON bytes only) against a data region of `data_size` bytes.
// `file` is used in error messages. Exposed separately for the fuzzer and for tests.
struct ParsedHeader {
  std::vector<TensorInfo> tensors;  // in header order
  std::map<std::string, std::string> metadata;
};
ParsedHeader parse_safetensors_header(std::string_view json, uint64_t data_size, const std::string& file);

// Parses a whole file image (u64 LE header length, header, data region): header length bounds, then the header.
struct SafetensorsLayout {
  ParsedHeader header;
  uint64_t data_offset = 0;  // 8 + header length
};
SafetensorsLayout parse_safetensors_bytes(const uint8_t* data, uint64_t size, const std::string& file);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates
  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;
  TensorView view(const TensorInfo& t) const;
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data region in the file

 private:
  MappedFile file_;
  ParsedHeader header_;
  uint64_t data_offset_ = 0;
  std::unordered_map<std::string, size_t> by_name_;
};

// A checkpoint directory (or a single .safetensors file path): all shards, one name space.
class Checkpoint {
 public:
  // dir: a directory with model.safetensors, or model.safetensors.index.json + shards, or other *.safetensors
  // files (all are read); or a path to one .safetensors file.
  static Checkpoint open(const std::string& path);

  struct Entry {
    const TensorInfo* info;
    const SafetensorsFile* file;
  };
  const Entry* find(std::string_view name) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }
  // Throws latent::Error("<dir>: tensor '<name>' not found") when absent.
  TensorView view(std::string_view name) const;
  const TensorInfo& info(std::string_view name) const;
  const std::string& file_of(std::string_view name) const;
  std::vector<std::string> names() const;          // sorted
  const std::string& dir() const { return dir_; }  // the directory (the parent dir for a single-file path)
  uint64_t total_bytes() const;                    // sum of tensor byte spans
  size_t num_files() const { return files_.size(); }

 private:
  const Entry& at(std::string_view name) const;  // throws when absent

  std::string dir_;
  std::string source_;  // the path given to open(), for messages
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace latent
