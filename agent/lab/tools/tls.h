// A throw-away CA and a serving certificate signed by it (ECDSA P-256), made in memory with
// OpenSSL for the lab apiserver.
#ifndef SLUICE_AGENT_LAB_TOOLS_TLS_H_
#define SLUICE_AGENT_LAB_TOOLS_TLS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::lab {

struct TlsCredentials {
  std::string ca_cert_pem;
  std::string cert_pem;  // serving certificate, signed by the CA
  std::string key_pem;   // its private key (PKCS#8)
};

// The serving certificate carries every `ip_sans` entry as an IP SAN and every `dns_sans` entry
// as a DNS SAN, extendedKeyUsage serverAuth, and is valid from an hour ago for `validity`.
absl::StatusOr<TlsCredentials> GenerateServingCredentials(
    const std::vector<std::string>& ip_sans, const std::vector<std::string>& dns_sans,
    absl::Duration validity = absl::Hours(24 * 365));

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_TOOLS_TLS_H_
