// The endpoint API between sluice-cni (and sluicectl) and sluice-agent, over a unix stream socket
// (default /run/sluice/sluice.sock, mode 0600, root only). The messages' types and their one
// encoder and decoder are in cni/protocol/messages.h; the network configuration, results and the
// Status bridge of the CNI errors below in cni/protocol/netconf.h.
//
// One request per connection. The client writes one JSON object and shuts down its write side;
// the agent answers with one JSON object and closes.
//
// Request:
//   {
//     "command": "ADD" | "DEL" | "CHECK" | "GC" | "STATUS",
//     "containerID": "...",        // ADD, DEL, CHECK
//     "netns": "/var/run/netns/x",  // ADD, CHECK (may be empty on DEL): for messages and the
//                                   // record only, never opened by the agent when...
//     "netnsFd": true,             // ...ADD and CHECK carry the namespace as a descriptor the
//                                   // plugin opened: one SCM_RIGHTS descriptor with the
//                                   // request's bytes. Absent (a plugin older than the agent):
//                                   // the agent opens "netns" itself. A descriptor declared and
//                                   // missing, undeclared, more than one, on another command, or
//                                   // not a network namespace: code 4.
//     "ifName": "eth0",            // ADD, DEL, CHECK
//     "args": "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",   // CNI_ARGS verbatim, may be empty
//     "config": { ... }            // the network configuration exactly as the runtime sent it
//   }
// Response on success:
//   { "ok": true, "result": { ... } }   // ADD, CHECK: the CNI result in config.cniVersion's
//                                       // format; DEL, GC, STATUS: result is omitted
// Response on failure:
//   { "ok": false, "code": <CNI error code>, "msg": "...", "details": "..." }
//
// The plugin prints "result" (or the error as a CNI error object) on stdout.
#pragma once

namespace sluice::api {

inline constexpr char kDefaultSocketPath[] = "/run/sluice/sluice.sock";

// The plugin's name: the network configuration's "type", and so the file the runtime runs from
// its CNI bin directory (where the agent installs sluice-cni, agent/endpoint/cni_install.h).
inline constexpr char kPluginType[] = "sluice";

// CNI spec error codes (CNI 1.1.0 "Error" section) and Sluice's own (100 and up).
enum CniError : int {
  kCniIncompatibleVersion = 1,
  kCniUnsupportedField = 2,
  kCniUnknownContainer = 3,
  kCniInvalidEnvironment = 4,
  kCniIoFailure = 5,
  kCniDecodeFailure = 6,
  kCniInvalidNetworkConfig = 7,
  kCniTryAgainLater = 11,
  kCniNotAvailable = 50,
  kCniLimitedConnectivity = 51,
  kSluiceInternal = 100,         // the agent failed; msg says what
  kSluiceInterfaceExists = 101,  // ADD: CNI_IFNAME already exists in the netns
  kSluicePoolExhausted = 102,    // ADD: no free address in the node's pod CIDR
  kSluiceCheckFailed = 103,      // CHECK: the endpoint differs from what ADD set up
  kSluiceMapFull = 104,          // ADD: a datapath map (named in msg) has no room for the pod
};

}  // namespace sluice::api
