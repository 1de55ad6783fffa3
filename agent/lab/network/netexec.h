// The lab's test server, in the manner of agnhost netexec: on one port, over TCP and/or UDP, a
// request "hostname" is answered with the pod's name, "clientip" with the client's "IP:PORT" as
// this server sees it, and anything else is echoed back. UDP replies leave from the address the
// request was sent to (IP_PKTINFO), as clients on multi-address hosts expect. Once its ports are
// bound it says "READY=1" to the datagram socket named by $NOTIFY_SOCKET, if set (the sd_notify
// protocol): that is how the lab kubelet knows a pod serves before it reports it Ready.
#ifndef SLUICE_AGENT_LAB_NETWORK_NETEXEC_H_
#define SLUICE_AGENT_LAB_NETWORK_NETEXEC_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::lab {

struct NetexecOptions {
  int port = 8080;
  std::string name;  // answered to "hostname"
  bool tcp = true;
  bool udp = true;
  // A line per request served (protocol, client, what it asked) on the default logger: the pod's
  // log, what `kubectl logs` shows.
  bool log_requests = false;
};

// The answer to one request (a line, without its newline, for TCP; a datagram for UDP).
std::string NetexecAnswer(const std::string& name, const std::string& request,
                          const std::string& client);

class NetexecServer {
 public:
  // Binds 0.0.0.0:port (TCP and/or UDP), notifies $NOTIFY_SOCKET, serves on background threads.
  static absl::StatusOr<std::unique_ptr<NetexecServer>> Start(const NetexecOptions& options);
  ~NetexecServer();
  NetexecServer(const NetexecServer&) = delete;
  NetexecServer& operator=(const NetexecServer&) = delete;
  // Blocks until Stop() (from another thread) — the `sluice-lab netexec` main loop.
  void Wait();
  void Stop();

 private:
  explicit NetexecServer(NetexecOptions options) : options_(std::move(options)) {}
  void ServeTcp();
  void ServeUdp();

  NetexecOptions options_;
  int tcp_fd_ = -1;
  int udp_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NETWORK_NETEXEC_H_
