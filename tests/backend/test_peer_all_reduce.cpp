// The fused tensor-parallel all-reduce + norm across processes (backend/peer_all_reduce.h): two processes on one GPU
// (forked, as two ranks of a tensor-parallel group sharing it) make their peer memory, exchange its handles over a
// socket, map each other's and run add_rms_norm with the kernel's handshake for several rounds of new partials. Both
// ranks' residuals and next norms must be bit for bit alike and equal the CPU's all_reduce_add_rms_norm within F32
// rounding. Each case runs 3 rounds (the handshake's epochs advance), at 1 and 64 rows (the kernel's limit) of Beam's
// 5,120 and at 5 rows of 1,000. Two processes' kernels share one GPU only under MPS (without it the GPU time-slices
// them and each rank's kernel waits for one that cannot start): without MPS both ranks must refuse to connect, naming
// the shared GPU, which is what sends a tensor-parallel group down the unfused path; under MPS they must compute.
// bench/gpu_ctest.sh runs this program again under MPS where the machine has it. The CPU backend has no peer memory.
// The GPU part skips without a device (a failure with BEAMLINE_REQUIRE_CUDA=1).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend_test_support.h"
#include "backend/peer_all_reduce.h"

namespace beamline::testing {
namespace {

constexpr int kRounds = 3;
constexpr int kSkipped = 77;  // a child that found no CUDA device
constexpr int kRefused = 78;  // a child whose connect() refused a peer on its own GPU without MPS
constexpr float kEps = 1e-6f, kScale = 0.7f;

struct Case {
  int64_t rows, hidden;
};
constexpr std::array<Case, 3> kCases{{{1, 5120}, {64, 5120}, {5, 1000}}};

// Deterministic values in [-1, 1) from (stream, index), the same in every process.
float value(uint64_t stream, int64_t index) {
  uint64_t x = stream * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull + 1;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0);
}
std::vector<float> values(uint64_t stream, int64_t count) {
  std::vector<float> out(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = value(stream, i);
  return out;
}
// Rank r's partial in round k of case c; the residual and the two weights of case c.
uint64_t partial_stream(std::size_t c, int rank, int round) { return 1000 * c + 10 * static_cast<uint64_t>(round) + rank; }
uint64_t input_stream(std::size_t c, int which) { return 900000 + 10 * c + static_cast<uint64_t>(which); }
std::vector<float> weight_values(std::size_t c, int which, int64_t hidden) {
  std::vector<float> w = values(input_stream(c, which), hidden);
  for (float& v : w) v = 1.0f + 0.25f * v;
  return w;
}

bool write_all(int fd, const void* data, std::size_t bytes) {
  const auto* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, at, bytes);
    if (n <= 0) return false;
    at += n, bytes -= static_cast<std::size_t>(n);
  }
  return true;
}
bool read_all(int fd, void* data, std::size_t bytes) {
  auto* at = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = read(fd, at, bytes);
    if (n <= 0) return false;
    at += n, bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

// One rank, in its own process: every case's residual and next norm after kRounds rounds, written to `results`.
int run_rank(int rank, int peer_socket, int results) {
  std::unique_ptr<Backend> backend;
  try {
    backend = create_backend("cuda");
  } catch (const std::exception&) {
    return kSkipped;
  }
  try {
    std::unique_ptr<PeerAllReduce> peer = make_peer_all_reduce(*backend);
    if (peer == nullptr) return 3;
    std::vector<std::vector<std::byte>> handles(2);
    handles[static_cast<std::size_t>(rank)] = peer->handle();
    std::vector<std::byte>& theirs = handles[static_cast<std::size_t>(1 - rank)];
    const uint64_t size = handles[static_cast<std::size_t>(rank)].size();
    uint64_t their_size = 0;
    if (!write_all(peer_socket, &size, sizeof size) ||
        !write_all(peer_socket, handles[static_cast<std::size_t>(rank)].data(), size) ||
        !read_all(peer_socket, &their_size, sizeof their_size))
      return 4;
    theirs.resize(their_size);
    if (!read_all(peer_socket, theirs.data(), their_size)) return 4;
    try {
      peer->connect(handles, rank);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      return std::string(error.what()).find("share one GPU without MPS") != std::string::npos ? kRefused : 1;
    }
    for (std::size_t c = 0; c < kCases.size(); ++c) {
      const auto [rows, hidden] = kCases[c];
      Tensor residual = backend->upload_f32(values(input_stream(c, 0), rows * hidden), {rows, hidden});
      const Tensor weight = backend->upload_f32(weight_values(c, 1, hidden), {hidden});
      const Tensor next_weight = backend->upload_f32(weight_values(c, 2, hidden), {hidden});
      Tensor out = backend->alloc(DType::F32, {rows, hidden});
      for (int round = 0; round < kRounds; ++round) {
        // Written while the peer may still be in the previous round's kernel: the handshake's end meeting is what
        // makes this safe (this rank's previous kernel ended only after the peer's last read of this partial).
        Tensor partial = peer->partial(rows, hidden);
        backend->copy_to(partial, values(partial_stream(c, rank, round), rows * hidden).data());
        peer->add_rms_norm(residual, weight, kEps, kScale, next_weight, out);
      }
      const std::vector<float> r = backend->download_f32(residual), o = backend->download_f32(out);
      if (!write_all(results, r.data(), r.size() * sizeof(float)) ||
          !write_all(results, o.data(), o.size() * sizeof(float)))
        return 5;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  }
}

TEST(PeerAllReduce, CpuBackendHasNone) {
  std::unique_ptr<Backend> cpu = create_backend("cpu");
  EXPECT_EQ(make_peer_all_reduce(*cpu), nullptr);
}

TEST(PeerAllReduce, TwoProcessesOnOneGpuSumInRankOrderUnderMpsElseRefuse) {
  // CUDA must not start in this process before the fork: each rank starts it in its own.
  int sockets[2], pipes[2][2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets), 0);
  ASSERT_EQ(pipe(pipes[0]), 0);
  ASSERT_EQ(pipe(pipes[1]), 0);
  pid_t children[2];
  for (int rank = 0; rank < 2; ++rank) {
    children[rank] = fork();
    ASSERT_GE(children[rank], 0);
    if (children[rank] == 0) {
      close(sockets[1 - rank]);  // so that the peer's end closes when the peer exits
      close(pipes[rank][0]);
      _exit(run_rank(rank, sockets[rank], pipes[rank][1]));
    }
    close(pipes[rank][1]);
  }
  close(sockets[0]);
  close(sockets[1]);
  // Every case's results from both ranks (read before waiting: they exceed a pipe's buffer).
  std::vector<std::array<std::vector<float>, 2>> residuals(kCases.size()), outs(kCases.size());
  bool complete = true;
  for (int rank = 0; rank < 2; ++rank) {
    for (std::size_t c = 0; c < kCases.size() && complete; ++c) {
      const auto count = static_cast<std::size_t>(kCases[c].rows * kCases[c].hidden);
      residuals[c][rank].resize(count);
      outs[c][rank].resize(count);
      complete = read_all(pipes[rank][0], residuals[c][rank].data(), count * sizeof(float)) &&
                 read_all(pipes[rank][0], outs[c][rank].data(), count * sizeof(float));
    }
    close(pipes[rank][0]);
  }
  int codes[2];
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    waitpid(children[rank], &status, 0);
    codes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  if (codes[0] == kSkipped || codes[1] == kSkipped) {
    if (device_required()) FAIL() << "backend cuda required but unavailable in the ranks' processes";
    GTEST_SKIP() << "backend cuda unavailable";
  }
  if (codes[0] == kRefused || codes[1] == kRefused) {
    if (std::getenv("BEAMLINE_EXPECT_MPS") != nullptr) FAIL() << "a rank refused to share the GPU under MPS";
    EXPECT_EQ(codes[0], kRefused) << "rank 1 refused the shared GPU, rank 0 did not";
    EXPECT_EQ(codes[1], kRefused) << "rank 0 refused the shared GPU, rank 1 did not";
    std::printf("both ranks refused to share one GPU without MPS: the fused kernel's math is checked under MPS\n");
    return;
  }
  ASSERT_EQ(codes[0], 0) << "rank 0's process (its error is on stderr)";
  ASSERT_EQ(codes[1], 0) << "rank 1's process (its error is on stderr)";
  ASSERT_TRUE(complete);

  std::unique_ptr<Backend> cpu = create_backend("cpu");
  for (std::size_t c = 0; c < kCases.size(); ++c) {
    const auto [rows, hidden] = kCases[c];
    const std::string what = "rows " + std::to_string(rows) + ", hidden " + std::to_string(hidden);
    EXPECT_EQ(residuals[c][0], residuals[c][1]) << what << ": the ranks' residuals differ";
    EXPECT_EQ(outs[c][0], outs[c][1]) << what << ": the ranks' next norms differ";
    Tensor residual = cpu->upload_f32(values(input_stream(c, 0), rows * hidden), {rows, hidden});
    const Tensor weight = cpu->upload_f32(weight_values(c, 1, hidden), {hidden});
    const Tensor next_weight = cpu->upload_f32(weight_values(c, 2, hidden), {hidden});
    Tensor out = cpu->alloc(DType::F32, {rows, hidden});
    for (int round = 0; round < kRounds; ++round) {
      const std::array<Tensor, 2> partials{
          cpu->upload_f32(values(partial_stream(c, 0, round), rows * hidden), {rows, hidden}),
          cpu->upload_f32(values(partial_stream(c, 1, round), rows * hidden), {rows, hidden})};
      cpu->all_reduce_add_rms_norm(partials, residual, weight, kEps, kScale, next_weight, out);
    }
    const std::vector<float> expected_residual = cpu->download_f32(residual), expected_out = cpu->download_f32(out);
    expect_close(residuals[c][0], std::vector<double>(expected_residual.begin(), expected_residual.end()), 1e-5,
                 what + ": residual");
    expect_close(outs[c][0], std::vector<double>(expected_out.begin(), expected_out.end()), 1e-5, what + ": next norm");
  }
}

}  // namespace
}  // namespace beamline::testing
