// Communicator: the collectives the model runs over its ranks (tensor and expert parallelism;
// docs/design.md §engine-contract, docs/multi-host.md). One rank = one backend (one GPU, or one CPU backend in tests).
//
// Process model: ONE process drives every GPU of a host, with ONE thread per rank (ParallelModel,
// model/parallel_model.h). The scheduler, the tokenizer and the HTTP server exist once; ranks share one address
// space, so a step is handed to the ranks as a plain C++ object and the only traffic between ranks is the
// collectives below (NCCL over NVLink on a GPU host). A process per GPU would need the step (tokens, block tables)
// serialized to every process each step and a second control plane; multi-host serving (docs/multi-host.md) adds
// processes only where hosts differ.
//
// Every pointer lives in the backend memory of this rank's backend (host memory for CPU backends, device memory
// for CUDA). A collective is ordered after the ops the rank issued before it (CPU: it runs synchronously; NCCL: it
// is enqueued on the backend's stream) and before those it issues after. Every rank of the group must call the
// same collectives in the same order with the same sizes.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace latent {

class Backend;

// Thrown by a collective of a group another rank has aborted (the peer's own error is the one to report).
class CollectiveAborted : public std::runtime_error {
 public:
  CollectiveAborted() : std::runtime_error("collective aborted: another rank failed") {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "in-process", "nccl"

  // data[i] = Σ_r data_r[i] on every rank (in place), n floats.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // recv = send_0 ‖ send_1 ‖ … ‖ send_{size-1}, `bytes` from each rank (recv holds size·bytes).
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // send holds size chunks of n floats; recv[i] = Σ_r send_r[rank·n + i] (n floats).
  virtual void reduce_scatter_sum(const float* send, int64_t n, float* recv) = 0;
  // send holds size chunks of `bytes`; chunk j goes to rank j. recv chunk i = rank i's chunk for this rank.
  virtual void all_to_all(const void* send, size_t bytes, void* recv) = 0;
  // Waits until every rank has reached it (and, on a device, until this rank's stream has drained).
  virtual void barrier() = 0;
};

// The in-process group: ranks are threads of one process over host-memory backends (the CPU backends; CI runs
// every parallel test with it). Deterministic: a sum is always accumulated in fp32 in rank order 0, 1, …,
// size-1, whichever thread computes it, so results never depend on thread timing. Each collective is two
// barriers: (1) every rank has published its buffers; each rank then computes its share of the result; (2) every
// rank has finished reading its peers' buffers, which may be reused after the call returns.
// A rank that fails inside a step calls abort(): the peers blocked in a collective (now or later) throw
// CollectiveAborted instead of waiting forever; reset() re-arms the group once every rank has returned.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  int size() const { return size_; }
  // The communicator of one rank (the group must outlive it).
  std::unique_ptr<Communicator> communicator(int rank);
  void abort();
  void reset();

 private:
  friend class InProcessCommunicator;
  // Barrier; the last rank to arrive runs `last` before releasing the others. Throws CollectiveAborted.
  template <class F>
  void arrive_and_wait(F&& last);
  void arrive_and_wait();

  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const void*> send_;  // per rank: the buffer it published for the current collective
  std::vector<float> scratch_;     // all_reduce result
};

// NCCL (built with the CUDA backend only; LATENT_HAVE_NCCL): one communicator per backend for one process driving
// backends.size() GPUs (ncclCommInitAll over `devices`), each enqueueing on its backend's stream
// (Backend::native_stream()). Throws Error naming the NCCL error.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<Backend*>& backends,
                                                                   const std::vector<int>& devices);
// Multi-process bootstrap (docs/multi-host.md): rank 0 makes the 128-byte ncclUniqueId, the launcher (MPI, a TCP
// store) hands it to every process, each calls make_nccl_communicator with its global rank.
std::string nccl_unique_id();
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const std::string& unique_id,
                                                     Backend& backend);
// Binds the calling thread to CUDA device `device` (a rank thread does it once before making its backend).
void cuda_bind_device(int device);
// Number of CUDA devices visible (0 without a CUDA build or driver).
int cuda_device_count();

}  // namespace latent
