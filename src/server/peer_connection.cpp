#include "server/peer_connection.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace beamline::server {

namespace {

// An address as sock_diag wants it: the family and up to 16 bytes in network order.
struct DiagAddress {
  int family = AF_UNSPEC;
  std::array<uint32_t, 4> words{};
};

std::optional<DiagAddress> parse_address(const std::string& text) {
  DiagAddress address;
  if (::inet_pton(AF_INET, text.c_str(), address.words.data()) == 1) {
    address.family = AF_INET;
  } else if (::inet_pton(AF_INET6, text.c_str(), address.words.data()) == 1) {
    address.family = AF_INET6;
  } else {
    return std::nullopt;
  }
  return address;
}

// Closes the netlink socket on every path out.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Said once: without the kernel's answer, non-streamed requests of clients that left run to their end.
std::optional<PeerState> cannot_ask(const char* why) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    spdlog::warn("cannot ask the kernel whether clients are still connected ({}): non-streamed requests whose "
                 "client leaves will run to their end", why);
  }
  return std::nullopt;
}

}  // namespace

std::optional<PeerState> tcp_peer_state(const TcpConnection& connection) {
  const std::optional<DiagAddress> local = parse_address(connection.local_addr);
  const std::optional<DiagAddress> remote = parse_address(connection.remote_addr);
  if (!local || !remote || local->family != remote->family) return std::nullopt;

  // One exact lookup (no dump): the kernel finds the socket by its four-tuple, seen from our side.
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.request.sdiag_family = static_cast<uint8_t>(local->family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0u;
  message.request.id.idiag_sport = htons(static_cast<uint16_t>(connection.local_port));
  message.request.id.idiag_dport = htons(static_cast<uint16_t>(connection.remote_port));
  std::memcpy(message.request.id.idiag_src, local->words.data(), sizeof(message.request.id.idiag_src));
  std::memcpy(message.request.id.idiag_dst, remote->words.data(), sizeof(message.request.id.idiag_dst));
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  const FileDescriptor diag(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (diag.get() < 0) return cannot_ask(std::strerror(errno));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(diag.get(), &message, sizeof(message), 0, reinterpret_cast<const sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(message))) {
    return cannot_ask(std::strerror(errno));
  }
  alignas(nlmsghdr) std::array<char, 1024> reply{};
  const ssize_t received = ::recv(diag.get(), reply.data(), reply.size(), 0);
  if (received < static_cast<ssize_t>(sizeof(nlmsghdr))) return cannot_ask("no answer from NETLINK_SOCK_DIAG");
  const auto* header = reinterpret_cast<const nlmsghdr*>(reply.data());
  if (!NLMSG_OK(header, static_cast<unsigned>(received))) return cannot_ask("a malformed NETLINK_SOCK_DIAG answer");
  if (header->nlmsg_type == NLMSG_ERROR) {
    const auto* error = static_cast<const nlmsgerr*>(NLMSG_DATA(header));
    // No such socket: a reset connection is taken out of the kernel's tables while we still hold its descriptor.
    if (error->error == -ENOENT) return PeerState::Gone;
    return cannot_ask(std::strerror(-error->error));
  }
  if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY || header->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return cannot_ask("an unexpected NETLINK_SOCK_DIAG answer");
  }
  const auto* socket = static_cast<const inet_diag_msg*>(NLMSG_DATA(header));
  // Anything but established means the client sent FIN or RST: HTTP clients do not half-close while waiting.
  return socket->idiag_state == TCP_ESTABLISHED ? PeerState::Connected : PeerState::Gone;
}

}  // namespace beamline::server
