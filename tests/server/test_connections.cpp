// The HTTP layer's connection threads (started on demand, bounded, ended when idle) and the kernel's answer on
// whether a TCP client is still connected (what aborts a non-streamed request whose client left).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server/connection_threads.h"
#include "server/peer_connection.h"

namespace beamline::server {
namespace {

using namespace std::chrono_literals;

TEST(ConnectionThreads, StartOnDemandUpToTheBoundAndRunEveryJob) {
  std::atomic<int> running{0}, peak{0}, done{0};
  std::atomic<bool> release{false};
  {
    ConnectionThreads threads(4, 200ms);
    EXPECT_EQ(threads.threads(), 0u);
    for (int job = 0; job < 20; ++job) {
      threads.enqueue([&] {
        const int now = ++running;
        for (int seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
        }
        while (!release) std::this_thread::sleep_for(1ms);
        --running;
        ++done;
      });
    }
    while (running < 4) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(threads.threads(), 4u);  // the bound: the other 16 jobs wait
    release = true;
    while (done < 20) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(peak.load(), 4);
    // Idle threads end after idle_exit.
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (threads.threads() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(threads.threads(), 0u);
    threads.enqueue([&] { ++done; });  // a job after they ended starts a new one
  }  // shutdown runs what is queued
  EXPECT_EQ(done.load(), 21);
}

TEST(ConnectionThreads, ShutdownRunsTheJobsStillQueued) {
  std::atomic<int> done{0};
  ConnectionThreads threads(1);
  for (int job = 0; job < 5; ++job) {
    threads.enqueue([&] {
      std::this_thread::sleep_for(5ms);
      ++done;
    });
  }
  threads.shutdown();
  EXPECT_EQ(done.load(), 5);
  EXPECT_EQ(threads.threads(), 0u);
}

// A loopback connection: the listening side's accepted socket and the client's.
struct Loopback {
  int listener = -1, client = -1, server = -1;
  TcpConnection connection;  // as the server sees it

  Loopback() {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listener, 1), 0);
    EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    sockaddr_in peer{};
    length = sizeof(peer);
    server = ::accept(listener, reinterpret_cast<sockaddr*>(&peer), &length);
    EXPECT_GE(server, 0);
    connection = {"127.0.0.1", ntohs(address.sin_port), "127.0.0.1", ntohs(peer.sin_port)};
  }
  ~Loopback() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

// The state once the kernel has had the time to deliver a FIN or RST over loopback.
std::optional<PeerState> settled_state(const TcpConnection& connection, PeerState expected) {
  std::optional<PeerState> state;
  for (int attempt = 0; attempt < 100; ++attempt) {
    state = tcp_peer_state(connection);
    if (state == expected) break;
    std::this_thread::sleep_for(10ms);
  }
  return state;
}

TEST(PeerConnection, ConnectedUntilTheClientCloses) {
  Loopback loopback;
  EXPECT_EQ(tcp_peer_state(loopback.connection), PeerState::Connected);
  ::close(loopback.client);
  loopback.client = -1;
  EXPECT_EQ(settled_state(loopback.connection, PeerState::Gone), PeerState::Gone);
}

TEST(PeerConnection, GoneWhenTheClientResets) {
  Loopback loopback;
  const linger reset{1, 0};  // close() sends RST
  ASSERT_EQ(::setsockopt(loopback.client, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)), 0);
  ::close(loopback.client);
  loopback.client = -1;
  EXPECT_EQ(settled_state(loopback.connection, PeerState::Gone), PeerState::Gone);
}

TEST(PeerConnection, AnotherConnectionsStateIsNotTaken) {
  Loopback first;
  Loopback second;
  ::close(first.client);
  first.client = -1;
  EXPECT_EQ(settled_state(first.connection, PeerState::Gone), PeerState::Gone);
  EXPECT_EQ(tcp_peer_state(second.connection), PeerState::Connected);
}

TEST(PeerConnection, UnparsableAddressesCannotBeAsked) {
  EXPECT_EQ(tcp_peer_state({"not an address", 1, "127.0.0.1", 2}), std::nullopt);
  EXPECT_EQ(tcp_peer_state({"127.0.0.1", 1, "::1", 2}), std::nullopt);
}

}  // namespace
}  // namespace beamline::server
