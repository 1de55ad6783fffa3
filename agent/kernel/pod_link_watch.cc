#include "agent/kernel/pod_link_watch.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#ifndef NETLINK_LISTEN_ALL_NSID
#define NETLINK_LISTEN_ALL_NSID 8
#endif

namespace sluice::agent {

absl::StatusOr<std::unique_ptr<PodLinkWatch>> PodLinkWatch::Start(Callback callback) {
  int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (sock < 0) {
    return absl::ErrnoToStatus(errno, "pod link watch: open an rtnetlink socket");
  }
  auto fail = [&](const char* what) {
    absl::Status st = absl::ErrnoToStatus(errno, absl::StrCat("pod link watch: ", what));
    close(sock);
    return st;
  };
  int one = 1;
  if (setsockopt(sock, SOL_NETLINK, NETLINK_LISTEN_ALL_NSID, &one, sizeof(one)) < 0) {
    return fail("NETLINK_LISTEN_ALL_NSID");
  }
  // Room for a burst (many pods started at once); an overflow still only costs a full pass.
  int rcvbuf = 4 << 20;
  (void)setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = RTMGRP_LINK;
  if (bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    return fail("bind to RTMGRP_LINK");
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return fail("eventfd");
  return std::unique_ptr<PodLinkWatch>(new PodLinkWatch(sock, wake, std::move(callback)));
}

PodLinkWatch::PodLinkWatch(int sock, int wake, Callback callback)
    : sock_(sock), wake_(wake), callback_(std::move(callback)), thread_([this] { Run(); }) {}

PodLinkWatch::~PodLinkWatch() {
  uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  thread_.join();
  close(wake_);
  close(sock_);
}

bool PodLinkWatch::Drain(std::vector<PeerLinkChange>* changes, bool* lost) {
  alignas(nlmsghdr) char buf[32768];
  char control[CMSG_SPACE(sizeof(int))];
  for (;;) {
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(sock_, &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == ENOBUFS) {  // notifications were dropped: the next pass looks at every pod
        *lost = true;
        continue;
      }
      spdlog::error("pod link watch: recvmsg: {}", std::strerror(errno));
      return false;
    }
    // Each datagram carries the id of the netns its notification came from; none (or -1) for
    // the agent's own netns, whose links are not pods'.
    int nsid = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_NETLINK && c->cmsg_type == NETLINK_LISTEN_ALL_NSID) {
        std::memcpy(&nsid, CMSG_DATA(c), sizeof(nsid));
      }
    }
    if (nsid < 0) continue;
    const size_t len = static_cast<size_t>(n);
    for (size_t off = 0; off + sizeof(nlmsghdr) <= len;) {
      const auto* h = reinterpret_cast<const nlmsghdr*>(buf + off);
      if (h->nlmsg_len < sizeof(nlmsghdr) || off + h->nlmsg_len > len) break;
      if (h->nlmsg_type == RTM_NEWLINK && h->nlmsg_len >= NLMSG_LENGTH(sizeof(ifinfomsg))) {
        const auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(h));
        PeerLinkChange change{nsid, ifi->ifi_index};
        if (std::find(changes->begin(), changes->end(), change) == changes->end()) {
          changes->push_back(change);
        }
      }
      off += NLMSG_ALIGN(h->nlmsg_len);
    }
  }
}

void PodLinkWatch::Run() {
  for (;;) {
    pollfd fds[2] = {{sock_, POLLIN, 0}, {wake_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("pod link watch: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    std::vector<PeerLinkChange> changes;
    bool lost = false;
    const bool alive = Drain(&changes, &lost);
    if (!changes.empty() || lost) callback_(changes, lost);
    if (!alive) return;
  }
}

}  // namespace sluice::agent
