// The in-process communicator: every collective against a scalar reference (the same fp32 sums in rank order,
// so the comparison is exact), 1 to 4 ranks, odd sizes, repeated to shake out races; abort of a failed rank.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

namespace latent {
namespace {

// Runs fn(rank, comm) on `size` threads.
void on_ranks(InProcessGroup& g, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < g.size(); ++r) comms.push_back(g.communicator(r));
  std::vector<std::thread> ts;
  for (int r = 0; r < g.size(); ++r) ts.emplace_back([&, r] { fn(r, *comms[static_cast<size_t>(r)]); });
  for (auto& t : ts) t.join();
}

// A value that differs per rank, element and round, with non-trivial rounding when summed.
float value(int rank, int64_t i, int round) {
  const uint32_t h = static_cast<uint32_t>(rank * 2654435761u) ^ static_cast<uint32_t>(i * 40503u + round * 977u);
  return static_cast<float>(static_cast<int32_t>(h % 20001u) - 10000) * 1.0e-3f +
         1.0f / (1.0f + static_cast<float>(i % 7));
}

const int64_t kSizes[] = {1, 2, 7, 33, 1001};

TEST(InProcessCommunicator, AllReduceSumEqualsScalarReference) {
  for (int size = 1; size <= 4; ++size)
    for (int64_t n : kSizes) {
      InProcessGroup g(size);
      std::vector<std::vector<float>> got(static_cast<size_t>(size));
      const int rounds = 5;
      for (int round = 0; round < rounds; ++round) {
        on_ranks(g, [&](int r, Communicator& c) {
          EXPECT_EQ(c.rank(), r);
          EXPECT_EQ(c.size(), size);
          std::vector<float> x(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) x[i] = value(r, i, round);
          c.all_reduce_sum(x.data(), n);
          got[static_cast<size_t>(r)] = x;
        });
        for (int64_t i = 0; i < n; ++i) {
          float ref = value(0, i, round);
          for (int r = 1; r < size; ++r) ref += value(r, i, round);
          for (int r = 0; r < size; ++r)
            ASSERT_EQ(got[static_cast<size_t>(r)][i], ref)
                << "size " << size << " n " << n << " rank " << r << " i " << i;
        }
      }
    }
}

TEST(InProcessCommunicator, AllGatherConcatenatesInRankOrder) {
  for (int size = 1; size <= 4; ++size)
    for (int64_t bytes : {int64_t{1}, int64_t{13}, int64_t{4096 + 3}}) {
      InProcessGroup g(size);
      for (int round = 0; round < 3; ++round)
        on_ranks(g, [&](int r, Communicator& c) {
          std::vector<unsigned char> send(static_cast<size_t>(bytes)), recv(static_cast<size_t>(bytes * size), 0xEE);
          for (int64_t i = 0; i < bytes; ++i) send[i] = static_cast<unsigned char>(r * 31 + i * 7 + round);
          c.all_gather(send.data(), static_cast<size_t>(bytes), recv.data());
          for (int k = 0; k < size; ++k)
            for (int64_t i = 0; i < bytes; ++i)
              ASSERT_EQ(recv[k * bytes + i], static_cast<unsigned char>(k * 31 + i * 7 + round));
        });
    }
}

TEST(InProcessCommunicator, AllGatherInPlace) {
  InProcessGroup g(3);
  on_ranks(g, [&](int r, Communicator& c) {
    std::vector<float> buf(3 * 5, -1.0f);
    for (int i = 0; i < 5; ++i) buf[r * 5 + i] = static_cast<float>(10 * r + i);
    c.all_gather(buf.data() + r * 5, 5 * sizeof(float), buf.data());
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 5; ++i) ASSERT_EQ(buf[k * 5 + i], static_cast<float>(10 * k + i));
  });
}

TEST(InProcessCommunicator, ReduceScatterSumEqualsScalarReference) {
  for (int size = 1; size <= 4; ++size)
    for (int64_t n : kSizes) {
      InProcessGroup g(size);
      for (int round = 0; round < 3; ++round)
        on_ranks(g, [&](int r, Communicator& c) {
          std::vector<float> send(static_cast<size_t>(n * size)), recv(static_cast<size_t>(n));
          for (int64_t i = 0; i < n * size; ++i) send[i] = value(r, i, round);
          c.reduce_scatter_sum(send.data(), n, recv.data());
          for (int64_t i = 0; i < n; ++i) {
            float ref = value(0, r * n + i, round);
            for (int k = 1; k < size; ++k) ref += value(k, r * n + i, round);
            ASSERT_EQ(recv[i], ref) << "size " << size << " n " << n << " rank " << r;
          }
        });
    }
}

TEST(InProcessCommunicator, AllToAllTransposesChunks) {
  for (int size = 1; size <= 4; ++size)
    for (int64_t bytes : {int64_t{1}, int64_t{9}, int64_t{1000}}) {
      InProcessGroup g(size);
      for (int round = 0; round < 3; ++round)
        on_ranks(g, [&](int r, Communicator& c) {
          std::vector<unsigned char> send(static_cast<size_t>(bytes * size)), recv(static_cast<size_t>(bytes * size));
          // chunk j of rank r: (r, j) pattern
          for (int j = 0; j < size; ++j)
            for (int64_t i = 0; i < bytes; ++i)
              send[j * bytes + i] = static_cast<unsigned char>(r * 16 + j + i * 3 + round);
          c.all_to_all(send.data(), static_cast<size_t>(bytes), recv.data());
          for (int i0 = 0; i0 < size; ++i0)
            for (int64_t i = 0; i < bytes; ++i)
              ASSERT_EQ(recv[i0 * bytes + i], static_cast<unsigned char>(i0 * 16 + r + i * 3 + round));
        });
    }
}

TEST(InProcessCommunicator, AllToAllInPlace) {
  InProcessGroup g(4);
  on_ranks(g, [&](int r, Communicator& c) {
    std::vector<int32_t> buf(4 * 3);
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 3; ++i) buf[j * 3 + i] = 100 * r + 10 * j + i;
    c.all_to_all(buf.data(), 3 * sizeof(int32_t), buf.data());
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 3; ++i) ASSERT_EQ(buf[j * 3 + i], 100 * j + 10 * r + i);
  });
}

TEST(InProcessCommunicator, MixedCollectivesInSequence) {
  // Different collectives back to back: the two-barrier protocol must not let one call's reads overlap the next
  // call's writes.
  InProcessGroup g(3);
  on_ranks(g, [&](int r, Communicator& c) {
    for (int it = 0; it < 200; ++it) {
      float x[5];
      for (int i = 0; i < 5; ++i) x[i] = static_cast<float>(r + it + i);
      c.all_reduce_sum(x, 5);
      for (int i = 0; i < 5; ++i) ASSERT_EQ(x[i], static_cast<float>(3 * (it + i) + 3));
      int32_t v = r * 1000 + it, all[3];
      c.all_gather(&v, sizeof v, all);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(all[k], k * 1000 + it);
      c.barrier();
    }
  });
}

TEST(InProcessCommunicator, AbortWakesPeersWithAnError) {
  InProcessGroup g(3);
  std::vector<std::string> errors(3);
  on_ranks(g, [&](int r, Communicator& c) {
    try {
      if (r == 1) {
        g.abort();  // rank 1 "failed" before the collective
        return;
      }
      float x = 1.0f;
      c.all_reduce_sum(&x, 1);
    } catch (const CollectiveAborted& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("another rank failed"), std::string::npos);
  EXPECT_NE(errors[2].find("another rank failed"), std::string::npos);
  // After reset the group works again.
  g.reset();
  on_ranks(g, [&](int r, Communicator& c) {
    float x = static_cast<float>(r);
    c.all_reduce_sum(&x, 1);
    EXPECT_EQ(x, 3.0f);
  });
}

TEST(InProcessCommunicator, InvalidSizesAreErrors) {
  EXPECT_THROW(InProcessGroup(0), Error);
  InProcessGroup g(2);
  EXPECT_THROW(g.communicator(2), Error);
  EXPECT_THROW(g.communicator(-1), Error);
}

}  // namespace
}  // namespace latent
