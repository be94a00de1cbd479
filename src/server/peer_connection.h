#pragma once
// Whether the client of a TCP connection is still there, asked of the kernel by the connection's addresses.
// A non-streamed request writes nothing until its output is complete, so a client that went away is not
// noticed by a failed write (as a stream's is); httplib hands the handler the connection's addresses but not
// its socket, so the kernel's socket table (NETLINK_SOCK_DIAG, what `ss` reads) is asked instead.
#include <optional>
#include <string>

namespace beamline::server {

struct TcpConnection {
  std::string local_addr;   // numeric, as httplib reports it (IPv4 or IPv6)
  int local_port = -1;
  std::string remote_addr;
  int remote_port = -1;
};

enum class PeerState {
  Connected,  // established: the client waits for its answer
  Gone,       // the client closed or reset the connection (or the kernel no longer knows it)
};

// nullopt when the kernel cannot be asked (no sock_diag support, warned once; or an address that does not parse): the
// caller then cannot tell, and keeps the request.
std::optional<PeerState> tcp_peer_state(const TcpConnection& connection);

}  // namespace beamline::server
