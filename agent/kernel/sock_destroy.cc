#include "agent/kernel/sock_destroy.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/base/errno.h"

namespace sluice::agent {
namespace {

struct DiagRequest {
  nlmsghdr nlh;
  inet_diag_req_v2 req;
};

// A request about IPv4 UDP sockets in any state.
DiagRequest UdpRequest(uint16_t type, uint16_t flags) {
  DiagRequest r{};
  r.nlh.nlmsg_type = type;
  r.nlh.nlmsg_flags = flags;
  r.req.sdiag_family = AF_INET;
  r.req.sdiag_protocol = IPPROTO_UDP;
  r.req.idiag_states = ~0u;
  return r;
}

uint64_t CookieOf(const inet_diag_sockid& id) {
  return static_cast<uint64_t>(id.idiag_cookie[1]) << 32 | id.idiag_cookie[0];
}

class NetlinkSocket {
 public:
  ~NetlinkSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Open() {
    fd_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd_ < 0) return ErrnoStatus(errno, "open NETLINK_SOCK_DIAG socket");
    return absl::OkStatus();
  }
  absl::Status Send(DiagRequest& r, absl::string_view what) {
    r.nlh.nlmsg_len = sizeof(r);
    r.nlh.nlmsg_seq = ++seq_;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_, &r, sizeof(r), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
      return ErrnoStatus(errno, what);
    }
    return absl::OkStatus();
  }
  // Reads the answers to the last request until NLMSG_DONE (a dump) or its ack; `fn` sees each
  // message of the dump. Returns the ack's errno (0: none or success).
  absl::StatusOr<int> Receive(absl::string_view what,
                              const std::function<void(const nlmsghdr&)>& fn) {
    std::vector<char> buf(64 * 1024);
    while (true) {
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, what);
      }
      auto len = static_cast<uint32_t>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, len);
           h = NLMSG_NEXT(h, len)) {
        if (h->nlmsg_seq != seq_) continue;
        if (h->nlmsg_type == NLMSG_DONE) return 0;
        if (h->nlmsg_type == NLMSG_ERROR) {
          const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
          return -e->error;
        }
        fn(*h);
      }
    }
  }

 private:
  int fd_ = -1;
  uint32_t seq_ = 0;
};

}  // namespace

absl::StatusOr<size_t> DestroyConnectedUdp4Sockets(
    const absl::flat_hash_set<ConnectedUdpSocket>& sockets) {
  if (sockets.empty()) return 0;
  NetlinkSocket nl;
  if (absl::Status st = nl.Open(); !st.ok()) return st;
  DiagRequest dump = UdpRequest(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP);
  if (absl::Status st = nl.Send(dump, "dump UDP sockets"); !st.ok()) return st;
  std::vector<inet_diag_sockid> doomed;
  auto dumped = nl.Receive("dump UDP sockets", [&](const nlmsghdr& h) {
    if (h.nlmsg_type != SOCK_DIAG_BY_FAMILY || h.nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
      return;
    const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(&h));
    // A connected UDP socket reads as TCP_ESTABLISHED, an unconnected one as TCP_CLOSE.
    if (m->idiag_state == TCP_ESTABLISHED &&
        sockets.contains({CookieOf(m->id), m->id.idiag_dst[0], m->id.idiag_dport})) {
      doomed.push_back(m->id);
    }
  });
  if (!dumped.ok()) return dumped.status();
  if (*dumped != 0) return ErrnoStatus(*dumped, "dump UDP sockets");
  size_t destroyed = 0;
  for (const inet_diag_sockid& id : doomed) {
    DiagRequest kill = UdpRequest(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK);
    kill.req.id = id;
    const std::string what = absl::StrCat("destroy UDP socket ", CookieOf(id));
    if (absl::Status st = nl.Send(kill, what); !st.ok()) return st;
    auto acked = nl.Receive(what, [](const nlmsghdr&) {});
    if (!acked.ok()) return acked.status();
    if (*acked == ENOENT) continue;  // closed meanwhile
    if (*acked != 0) return ErrnoStatus(*acked, what);
    ++destroyed;
  }
  return destroyed;
}

}  // namespace sluice::agent
