// Internal: the memory the CPU backend copies weights into (cpu_backend.cpp, prepare_weight). Carved
// 64-byte aligned out of large anonymous mappings that ask the kernel for transparent huge pages: a decode step
// streams every weight once (~190 MB for the bf16 DeepSeek-V3 bench shape), and with 4 KiB pages that is one TLB
// miss and page walk per 4 KiB read. The checkpoint mapping the AVX2 kernels read in place is mostly backed by the
// page cache's large folios (ext4 on Linux 6.x: `FilePmdMapped` in /proc/PID/smaps_rollup), so copies on 4 KiB
// pages made the AVX-512 decode slower than the AVX2 one reading the same bytes (bench/README.md, issue 26).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace latent::cpu {

class WeightArena {
 public:
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena();

  // `bytes` of 64-byte aligned memory that stays valid (at the same address) until the arena is destroyed.
  uint8_t* alloc(size_t bytes);
  // Whether `p` points into a block this arena handed out.
  bool owns(const void* p) const;
  // Whether the chunks were advised for transparent huge pages (Linux); false where the platform has no such advice
  // or madvise refused it (the memory is then ordinary, still 64-byte aligned).
  bool huge_pages_advised() const { return advised_; }

 private:
  struct Chunk {
    uint8_t* base;
    size_t size, used;
    bool mapped;  // mmap'ed (else operator new)
  };
  std::vector<Chunk> chunks_;
  bool advised_ = false;
};

}  // namespace latent::cpu
