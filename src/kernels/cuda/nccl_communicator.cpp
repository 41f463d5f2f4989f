// The NCCL communicator (parallel/communicator.h), built with the CUDA backend. Every collective is enqueued on
// the rank's backend stream, so it is ordered with the model's kernels without a host synchronization (and can be
// captured in a CUDA graph). Sums are fp32 (ncclFloat, ncclSum); all-to-all is grouped point-to-point send/recv.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace latent {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL: {} failed: {} ({})", what, ncclGetErrorString(r), static_cast<int>(r));
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: {} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, Backend& be)
      : comm_(comm), rank_(rank), size_(size), stream_(static_cast<cudaStream_t>(be.native_stream())) {
    if (be.device() != Device::Cuda || !stream_)
      fail("NCCL: rank {} is on the {} backend; NCCL needs a CUDA backend", rank, be.name());
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (token_) cudaFree(token_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  void all_reduce_sum(float* data, int64_t n) override {
    if (size_ == 1 || n <= 0) return;
    check_nccl(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    check_nccl(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
  }
  void reduce_scatter_sum(const float* send, int64_t n, float* recv) override {
    if (n <= 0) return;
    check_nccl(ncclReduceScatter(send, recv, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_),
               "ncclReduceScatter");
  }
  void all_to_all(const void* send, size_t bytes, void* recv) override {
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; peer < size_; ++peer) {
      check_nccl(ncclSend(s + peer * bytes, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
      check_nccl(ncclRecv(r + peer * bytes, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void barrier() override {
    // A one-element all-reduce is the NCCL barrier; the host waits for the stream.
    if (!token_) check_cuda(cudaMalloc(&token_, sizeof(float)), "cudaMalloc (barrier token)");
    check_nccl(ncclAllReduce(token_, token_, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (barrier)");
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
  float* token_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<Backend*>& backends,
                                                                   const std::vector<int>& devices) {
  const int n = static_cast<int>(backends.size());
  if (n < 1 || devices.size() != backends.size())
    fail("NCCL: {} backends for {} devices", backends.size(), devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  check_nccl(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  try {
    for (int r = 0; r < n; ++r) {
      out.push_back(
          std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], r, n, *backends[static_cast<size_t>(r)]));
      comms[static_cast<size_t>(r)] = nullptr;
    }
  } catch (...) {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
    throw;
  }
  return out;
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const std::string& unique_id,
                                                     Backend& backend) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    fail("NCCL: the unique id has {} bytes, expected {}", unique_id.size(), sizeof(id.internal));
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  try {
    return std::make_unique<NcclCommunicator>(comm, rank, size, backend);
  } catch (...) {
    ncclCommDestroy(comm);
    throw;
  }
}

void cuda_bind_device(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace latent
