#include "weight_sync/tcp_stream.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "util/error.h"

namespace beamline {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire protocol's integers are little-endian, as memory");

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// One nonblocking connect to `address`, waited for until `deadline`: the socket, or -1 with errno set.
int connect_once(const addrinfo& address, Clock::time_point deadline) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address.ai_protocol);
  if (fd < 0) return -1;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) == 0) return fd;
  if (errno == EINPROGRESS) {
    pollfd waiting{fd, POLLOUT, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    int error = ETIMEDOUT;
    if (left > 0 && ::poll(&waiting, 1, static_cast<int>(left)) == 1) {
      socklen_t length = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error == 0) return fd;
    errno = error;
  }
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return -1;
}

}  // namespace

TcpStream TcpStream::connect(const std::string& host, int32_t port, double timeout_seconds, std::string peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int status = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); status != 0)
    fail("{}: cannot resolve {}: {}", peer, host, ::gai_strerror(status));
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  const auto deadline = deadline_after(timeout_seconds);
  bool refused = false;
  for (;;) {
    int last_error = 0;
    for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
      const int fd = connect_once(*address, deadline);
      if (fd >= 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return TcpStream(fd, timeout_seconds, std::move(peer));
      }
      last_error = errno;
      refused = refused || last_error == ECONNREFUSED;
    }
    // A refused connection is retried: the trainer may start listening a moment after asking the server to join.
    if (last_error != ECONNREFUSED || Clock::now() >= deadline)
      fail("{}: cannot connect within {} s (--distributed-timeout-seconds): {}", peer, timeout_seconds,
           refused ? "connection refused, nothing listens there" : std::strerror(last_error));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpStream::TcpStream(int fd, double timeout_seconds, std::string peer)
    : fd_(fd), timeout_seconds_(timeout_seconds), peer_(std::move(peer)) {}

TcpStream::TcpStream(TcpStream&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), timeout_seconds_(other.timeout_seconds_), peer_(std::move(other.peer_)) {}

TcpStream::~TcpStream() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStream::wait_for(short events, std::string_view what) {
  pollfd waiting{fd_, events, 0};
  const int status = ::poll(&waiting, 1, static_cast<int>(timeout_seconds_ * 1000));
  if (status == 0)
    fail("{}: nothing from {} for {} s (--distributed-timeout-seconds): the trainer is dead, stuck or sent less than "
         "announced", what, peer_, timeout_seconds_);
  if (status < 0 && errno != EINTR) fail("{}: waiting for {}: {}", what, peer_, std::strerror(errno));
}

void TcpStream::read(std::span<std::byte> bytes, std::string_view what) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::recv(fd_, bytes.data() + done, bytes.size() - done, 0);
    if (got > 0) {
      done += static_cast<std::size_t>(got);
    } else if (got == 0) {
      fail("{}: {} closed the connection after {} of {} bytes", what, peer_, done, bytes.size());
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(POLLIN, what);
    } else if (errno != EINTR) {
      fail("{}: reading from {}: {}", what, peer_, std::strerror(errno));
    }
  }
}

void TcpStream::write(std::span<const std::byte> bytes, std::string_view what) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t sent = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (sent >= 0) {
      done += static_cast<std::size_t>(sent);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(POLLOUT, what);
    } else if (errno != EINTR) {
      fail("{}: writing to {}: {}", what, peer_, std::strerror(errno));
    }
  }
}

uint32_t TcpStream::read_u32(std::string_view what) {
  uint32_t value = 0;
  read(std::as_writable_bytes(std::span(&value, 1)), what);
  return value;
}

uint64_t TcpStream::read_u64(std::string_view what) {
  uint64_t value = 0;
  read(std::as_writable_bytes(std::span(&value, 1)), what);
  return value;
}

std::string TcpStream::read_string(std::string_view what, uint32_t max_length) {
  const uint32_t length = read_u32(what);
  require(length <= max_length, "{}: {} sent a string of {} bytes (at most {}): not this protocol", what, peer_, length,
          max_length);
  std::string value(length, '\0');
  read(std::as_writable_bytes(std::span(value.data(), value.size())), what);
  return value;
}

void TcpStream::write_u32(uint32_t value, std::string_view what) { write(std::as_bytes(std::span(&value, 1)), what); }

void TcpStream::write_string(std::string_view value, std::string_view what) {
  write_u32(static_cast<uint32_t>(value.size()), what);
  write(std::as_bytes(std::span(value.data(), value.size())), what);
}

}  // namespace beamline
