#include "format/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace latent {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps header order

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // same cap as the reference implementation
constexpr int kMaxJsonDepth = 8;                   // a valid header nests 3 deep; stops nesting bombs early
constexpr size_t kMaxShownChars = 200;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Length of the well-formed UTF-8 sequence at s[i] (Unicode Table 3-7), 0 if there is none.
size_t utf8_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) { return b(k) >= lo && b(k) <= hi; };
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    const unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// Untrusted text made safe for a one-line, valid UTF-8 message: control and stray bytes escaped as \xNN, long
// text shortened.
std::string printable(std::string_view s) {
  std::string out;
  const size_t n = std::min(s.size(), kMaxShownChars);
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_len(s.substr(0, n), i);
    if (len == 0 || c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

// "1.5", "-3" for numbers; the JSON type name otherwise (never dumps a large value).
std::string describe(const Json& v) { return v.is_number() ? v.dump() : std::string(v.type_name()); }

// nlohmann's "[json.exception.parse_error.101] parse error at ..." without the bracketed prefix.
std::string json_error_text(const std::exception& e) {
  std::string_view s = e.what();
  if (auto p = s.find("] "); !s.empty() && s[0] == '[' && p != std::string_view::npos) s.remove_prefix(p + 2);
  return printable(s);
}

// Parses JSON strictly: duplicate keys (at any depth) and deep nesting are errors (nlohmann keeps the last
// duplicate silently). `noun` names top-level keys in messages ("tensor" for a header, "key" for an index).
Json parse_strict_json(std::string_view text, const std::string& file, std::string_view what, std::string_view noun) {
  std::vector<std::set<std::string>> keys;  // keys seen in each open object
  std::string top;                          // the current top-level key
  auto callback = [&](int depth, Json::parse_event_t ev, Json& parsed) {
    using E = Json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      fail("{}: {}: JSON nested deeper than {} levels", file, what, kMaxJsonDepth);
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end) keys.pop_back();
    if (ev == E::key) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (depth == 1) top = k;
      if (!keys.back().insert(k).second) {
        if (depth == 1) fail("{}: {}: duplicate {} '{}'", file, what, noun, printable(k));
        fail("{}: {} '{}': duplicate key '{}'", file, noun, printable(top), printable(k));
      }
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    fail("{}: {} is not valid JSON: {}", file, what, json_error_text(e));
  }
}

// An exact non-negative integer no larger than `max` (floats, negatives and strings are rejected).
std::optional<uint64_t> as_count(const Json& v, uint64_t max) {
  if (!v.is_number_unsigned()) return std::nullopt;
  const auto x = v.get<uint64_t>();
  if (x > max) return std::nullopt;
  return x;
}

std::string known_dtypes() {
  std::string s;
  for (size_t i = 0; i < static_cast<size_t>(DType::kCount); ++i) {
    const auto st = traits(static_cast<DType>(i)).st_name;
    if (!st.empty()) s += (s.empty() ? "" : ", ") + std::string(st);
  }
  return s;
}

// Parses one header entry; every failure names the file and the tensor.
class TensorParser {
 public:
  TensorParser(const std::string& file, const std::string& name, uint64_t data_size)
      : file_(file), name_(name), data_size_(data_size) {}

  TensorInfo parse(const Json& e) {
    if (!e.is_object()) bad("entry must be an object with dtype, shape and data_offsets, got {}", describe(e));
    TensorInfo t;
    t.name = name_;
    t.dtype = parse_dtype(field(e, "dtype"));
    t.shape = parse_shape(field(e, "shape"));
    parse_offsets(field(e, "data_offsets"), t);
    check_size(t);
    return t;
  }

 private:
  template <class... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) const {
    fail("{}: tensor '{}': {}", file_, printable(name_), fmt::format(f, std::forward<Args>(args)...));
  }

  const Json& field(const Json& e, const char* key) const {
    auto it = e.find(key);
    if (it == e.end()) bad("missing '{}'", key);
    return *it;
  }

  DType parse_dtype(const Json& v) const {
    if (!v.is_string()) bad("'dtype' must be a string, got {}", describe(v));
    const auto& s = v.get_ref<const std::string&>();
    auto d = dtype_from_safetensors(s);
    if (!d) bad("unknown dtype '{}' (known: {})", printable(s), known_dtypes());
    return *d;
  }

  Shape parse_shape(const Json& v) const {
    if (!v.is_array()) bad("'shape' must be an array of non-negative integers, got {}", describe(v));
    if (v.size() > static_cast<size_t>(kMaxDims))
      bad("shape has {} dims; at most {} are supported", v.size(), kMaxDims);
    Shape s;
    for (const auto& d : v) {
      auto x = as_count(d, static_cast<uint64_t>(INT64_MAX));
      if (!x) bad("shape dim {} is {}; dims must be non-negative integers", s.ndim, describe(d));
      s.dims[s.ndim++] = static_cast<int64_t>(*x);
    }
    return s;
  }

  void parse_offsets(const Json& v, TensorInfo& t) const {
    if (!v.is_array() || v.size() != 2) bad("'data_offsets' must be [begin, end], got {}", describe(v));
    auto b = as_count(v[0], UINT64_MAX);
    auto e = as_count(v[1], UINT64_MAX);
    if (!b || !e) bad("data_offsets [{}, {}] must be non-negative integers", describe(v[0]), describe(v[1]));
    if (*b > *e) bad("data_offsets [{}, {}]: begin is past end", *b, *e);
    if (*e > data_size_) bad("data_offsets [{}, {}] run past the data region ({} bytes)", *b, *e, data_size_);
    t.begin = *b;
    t.end = *e;
  }

  // Element count, or nullopt past INT64_MAX. A zero dim makes the tensor empty whatever the other dims are.
  static std::optional<uint64_t> numel(const Shape& s) {
    for (int i = 0; i < s.ndim; ++i)
      if (s.dims[i] == 0) return 0;
    uint64_t n = 1;
    for (int i = 0; i < s.ndim; ++i)
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(s.dims[i]), &n) || n > uint64_t{INT64_MAX})
        return std::nullopt;
    return n;
  }

  void check_size(TensorInfo& t) const {
    const uint64_t span = t.end - t.begin;
    const auto n = numel(t.shape);
    if (!n) bad("shape {} has too many elements", t.shape.str());
    const auto need = dtype_storage_bytes(t.dtype, *n);
    if (need && *need == span) return;
    if (t.dtype == DType::F4_E2M1 && *n == span && span > 0 && t.shape.ndim > 0 &&
        t.shape.dims[t.shape.ndim - 1] <= INT64_MAX / 2) {
      t.shape.dims[t.shape.ndim - 1] *= 2;  // the shape counts packed bytes: make it count logical elements
      return;
    }
    const auto& tr = traits(t.dtype);
    if (!need)
      bad("shape {} x {}: {} elements do not fill whole storage blocks of {} elements", t.shape.str(), tr.name, *n,
          tr.block_elems);
    bad("shape {} x {} needs {} bytes but data_offsets span {}", t.shape.str(), tr.name, *need, span);
  }

  const std::string& file_;
  const std::string& name_;
  uint64_t data_size_;
};

std::map<std::string, std::string> parse_metadata(const Json& v, const std::string& file) {
  if (!v.is_object()) fail("{}: '__metadata__' must be an object of strings, got {}", file, describe(v));
  std::map<std::string, std::string> m;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string())
      fail("{}: '__metadata__' entry '{}' must be a string, got {}", file, printable(it.key()), describe(*it));
    m.emplace(it.key(), it->get<std::string>());
  }
  return m;
}

// Non-empty spans must not overlap; empty tensors may sit anywhere inside the data region.
void check_overlaps(const std::vector<TensorInfo>& tensors, const std::string& file) {
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = *order[i - 1];
    const TensorInfo& b = *order[i];
    if (b.begin < a.end)
      fail("{}: tensor '{}' [{}, {}) overlaps tensor '{}' [{}, {})", file, printable(b.name), b.begin, b.end,
           printable(a.name), a.begin, a.end);
  }
}

}  // namespace

ParsedHeader parse_safetensors_header(std::string_view json, uint64_t data_size, const std::string& file) {
  const Json root = parse_strict_json(json, file, "safetensors header", "tensor");
  if (!root.is_object()) fail("{}: safetensors header must be a JSON object, got {}", file, describe(root));
  ParsedHeader h;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__")
      h.metadata = parse_metadata(*it, file);
    else
      h.tensors.push_back(TensorParser(file, it.key(), data_size).parse(*it));
  }
  check_overlaps(h.tensors, file);
  return h;
}

SafetensorsLayout parse_safetensors_bytes(const uint8_t* data, uint64_t size, const std::string& file) {
  if (size < 8) fail("{}: {} bytes is too short for a safetensors file (needs an 8-byte header length)", file, size);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data[i]) << (8 * i);
  if (n < 2) fail("{}: safetensors header length {} is below the minimum of 2", file, n);
  if (n > kMaxHeaderBytes)
    fail("{}: safetensors header length {} exceeds the limit of {} bytes", file, n, kMaxHeaderBytes);
  if (n > size - 8) fail("{}: safetensors header length {} runs past the end of the file ({} bytes)", file, n, size);
  const std::string_view json(reinterpret_cast<const char*>(data + 8), n);
  return SafetensorsLayout{parse_safetensors_header(json, size - 8 - n, file), 8 + n};
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  SafetensorsLayout layout = parse_safetensors_bytes(file_.data(), file_.size(), path);
  header_ = std::move(layout.header);
  data_offset_ = layout.data_offset;
  for (size_t i = 0; i < header_.tensors.size(); ++i) by_name_.emplace(header_.tensors[i].name, i);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& t) const {
  return TensorView{file_.data() + data_offset_ + t.begin, t.dtype, t.shape, t.end - t.begin};
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoint

namespace {

using Files = std::vector<std::unique_ptr<SafetensorsFile>>;

struct Index {
  std::string path;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard file name, in file order
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) fail("{}: cannot read", path);
  return ss.str();
}

// A shard name must stay inside the checkpoint directory.
bool is_local_name(const std::string& shard) {
  const fs::path p(shard);
  if (shard.empty() || p.is_absolute()) return false;
  return std::none_of(p.begin(), p.end(), [](const fs::path& part) { return part == ".."; });
}

Index read_index(const std::string& path) {
  const Json root = parse_strict_json(read_text(path), path, "index", "key");
  if (!root.is_object()) fail("{}: index must be a JSON object, got {}", path, describe(root));
  auto wm = root.find("weight_map");
  if (wm == root.end()) fail("{}: missing 'weight_map'", path);
  if (!wm->is_object())
    fail("{}: 'weight_map' must be an object of tensor name -> shard file, got {}", path, describe(*wm));
  if (wm->empty()) fail("{}: 'weight_map' lists no tensors", path);
  Index idx{path, {}};
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      fail("{}: weight_map: tensor '{}' must map to a shard file name, got {}", path, printable(it.key()),
           describe(*it));
    const auto& shard = it->get_ref<const std::string&>();
    if (!is_local_name(shard))
      fail("{}: weight_map: tensor '{}' maps to shard '{}' outside the checkpoint directory", path, printable(it.key()),
           printable(shard));
    idx.weight_map.emplace_back(it.key(), shard);
  }
  return idx;
}

// Opens each distinct shard the index names (in name order), keyed by shard name.
std::map<std::string, const SafetensorsFile*> open_shards(const Index& idx, const fs::path& dir, Files& files) {
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor that names it, for messages
  for (const auto& [tensor, shard] : idx.weight_map) first_tensor.emplace(shard, tensor);
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [shard, tensor] : first_tensor) {
    const std::string p = (dir / shard).string();
    std::error_code ec;
    if (!fs::is_regular_file(p, ec))
      fail("{}: shard '{}' (holding tensor '{}') not found: {}", idx.path, printable(shard), printable(tensor), p);
    files.push_back(std::make_unique<SafetensorsFile>(p));
    shards.emplace(shard, files.back().get());
  }
  return shards;
}

// Every tensor the index names is in its shard; every tensor of a shard is listed, under that shard.
void check_index(const Index& idx, const std::map<std::string, const SafetensorsFile*>& shards) {
  std::unordered_map<std::string, const std::string*> shard_of;
  for (const auto& [tensor, shard] : idx.weight_map) {
    const SafetensorsFile* f = shards.at(shard);
    if (!f->find(tensor))
      fail("{}: tensor '{}' is mapped to shard '{}' but {} does not contain it", idx.path, printable(tensor),
           printable(shard), f->path());
    shard_of.emplace(tensor, &shard);
  }
  for (const auto& [shard, f] : shards) {
    for (const auto& t : f->tensors()) {
      auto it = shard_of.find(t.name);
      if (it == shard_of.end()) fail("{}: tensor '{}' is not listed in {}", f->path(), printable(t.name), idx.path);
      if (*it->second != shard)
        fail("{}: tensor '{}' is listed in {} under shard '{}'", f->path(), printable(t.name), idx.path,
             printable(*it->second));
    }
  }
}

// All regular *.safetensors files of a directory, sorted.
std::vector<std::string> list_safetensors(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec2)) out.push_back(e.path().string());
  }
  if (ec) fail("{}: cannot list directory: {}", dir.string(), ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void open_dir(const std::string& dir, Files& files) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / kIndexName, ec)) {
    const Index idx = read_index((d / kIndexName).string());
    check_index(idx, open_shards(idx, d, files));
    return;
  }
  if (fs::is_regular_file(d / kSingleName, ec)) {
    files.push_back(std::make_unique<SafetensorsFile>((d / kSingleName).string()));
    return;
  }
  const auto paths = list_safetensors(d);
  if (paths.empty()) fail("{}: no .safetensors files", dir);
  for (const auto& p : paths) files.push_back(std::make_unique<SafetensorsFile>(p));
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.source_ = path;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (fs::is_regular_file(st)) {
    const fs::path parent = fs::path(path).parent_path();
    c.dir_ = parent.empty() ? "." : parent.string();
    c.files_.push_back(std::make_unique<SafetensorsFile>(path));
  } else if (fs::is_directory(st)) {
    c.dir_ = path;
    open_dir(path, c.files_);
  } else {
    fail("{}: no such file or directory", path);
  }
  for (const auto& f : c.files_) {
    for (const auto& t : f->tensors()) {
      auto [it, fresh] = c.entries_.emplace(t.name, Entry{&t, f.get()});
      if (!fresh)
        fail("{}: tensor '{}' is in both {} and {}", path, printable(t.name), it->second.file->path(), f->path());
    }
  }
  return c;
}

const Checkpoint::Entry* Checkpoint::find(std::string_view name) const {
  auto it = entries_.find(std::string(name));
  return it == entries_.end() ? nullptr : &it->second;
}

const Checkpoint::Entry& Checkpoint::at(std::string_view name) const {
  const Entry* e = find(name);
  if (!e) fail("{}: tensor '{}' not found", source_, printable(name));
  return *e;
}

const TensorInfo& Checkpoint::info(std::string_view name) const { return *at(name).info; }

TensorView Checkpoint::view(std::string_view name) const {
  const Entry& e = at(name);
  return e.file->view(*e.info);
}

const std::string& Checkpoint::file_of(std::string_view name) const { return at(name).file->path(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.info->end - e.info->begin;
  return n;
}

}  // namespace latent
