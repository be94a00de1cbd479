#pragma once
// A connected TCP socket for the weight-sync wire protocol (weight_sync/weight_update_group.h). Every read and write
// waits at most `timeout_seconds` without progress (a slow but moving transfer is never cut); then, or when the peer
// closes or resets the connection, an Error names the peer and what was being moved.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace beamline {

class TcpStream {
 public:
  // Connects to host:port, retrying a refused connection (the peer may not listen yet) until the timeout.
  // `peer` names the other end in messages ("the trainer (rank 0) at 10.0.0.1:29500").
  static TcpStream connect(const std::string& host, int32_t port, double timeout_seconds, std::string peer);
  TcpStream(TcpStream&& other) noexcept;
  TcpStream& operator=(TcpStream&&) = delete;
  ~TcpStream();

  // `what` says what the bytes are ("tensor 3 of 7 (model.norm.weight)").
  void read(std::span<std::byte> bytes, std::string_view what);
  void write(std::span<const std::byte> bytes, std::string_view what);
  // Little-endian integers and length-prefixed (u32) strings of the protocol.
  uint32_t read_u32(std::string_view what);
  uint64_t read_u64(std::string_view what);
  std::string read_string(std::string_view what, uint32_t max_length);
  void write_u32(uint32_t value, std::string_view what);
  void write_string(std::string_view value, std::string_view what);
  const std::string& peer() const { return peer_; }

 private:
  TcpStream(int fd, double timeout_seconds, std::string peer);
  // Waits for `events` on the socket; fails after timeout_seconds_.
  void wait_for(short events, std::string_view what);

  int fd_ = -1;
  double timeout_seconds_;
  std::string peer_;
};

}  // namespace beamline
