// One connection attempt from inside a network namespace, for tests and operators: does
// HOST:PORT answer (CONNECTED), refuse (REFUSED: TCP RST or, for UDP, ICMP port unreachable), say
// there is no way there (UNREACHABLE: no route, or EHOSTUNREACH / ENETUNREACH from an ICMP
// unreachable or a failed neighbour resolution), or stay silent (TIMEOUT)? And a one-line
// request/response exchange with a netexec server.
#ifndef SLUICE_AGENT_LAB_NETWORK_PROBE_H_
#define SLUICE_AGENT_LAB_NETWORK_PROBE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::lab {

enum class Protocol { kTcp, kUdp };
enum class ProbeOutcome { kConnected, kRefused, kTimeout, kUnreachable };
// CONNECTED, REFUSED, TIMEOUT, UNREACHABLE
const char* ProbeOutcomeName(ProbeOutcome outcome);
// `sluice-lab probe`'s exit status for an outcome: 0 CONNECTED, 3 REFUSED, 4 TIMEOUT,
// 5 UNREACHABLE (1 is an error, 2 a usage error).
int ProbeExitCode(ProbeOutcome outcome);

struct ProbeTarget {
  std::string host;  // IPv4 address
  int port = 0;
  Protocol protocol = Protocol::kTcp;
  absl::Duration timeout = absl::Seconds(3);
};

// "HOST:PORT" -> target (protocol and timeout untouched).
absl::Status ParseHostPort(const std::string& text, ProbeTarget* target);
absl::StatusOr<Protocol> ParseProtocol(const std::string& text);

// Moves the calling thread into the network namespace at `path` (e.g. /var/run/netns/NAME).
absl::Status EnterNetns(const std::string& path);

// TCP: CONNECTED once the handshake completes. UDP: sends "hostname" (again every 500 ms) on a
// connected socket; CONNECTED when any reply arrives, REFUSED on ECONNREFUSED (ICMP port
// unreachable). UNREACHABLE on EHOSTUNREACH / ENETUNREACH (at connect, or later from an ICMP
// error); silence is TIMEOUT. Errors only for bad input.
absl::StatusOr<ProbeOutcome> Probe(const ProbeTarget& target);

// Probe of every target at once, one thread each (started from the calling thread, so in its
// network namespace): a matrix of probes costs one timeout, not one per silent target. Results
// in the order of `targets`.
std::vector<absl::StatusOr<ProbeOutcome>> ProbeAll(const std::vector<ProbeTarget>& targets);

struct RequestResult {
  ProbeOutcome outcome;
  std::string reply;  // with kConnected
};
// Sends `data` plus a newline and returns the reply (TCP: up to EOF; UDP: one datagram).
absl::StatusOr<RequestResult> Request(const ProbeTarget& target, const std::string& data);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NETWORK_PROBE_H_
