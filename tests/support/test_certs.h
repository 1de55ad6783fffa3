// Certificates for client tests that need more than the lab apiserver's own CA: a CA with a
// client certificate signed by it (for x509 client authentication) and an unrelated CA (for
// verification failures). Made with the openssl CLI in a temp dir; files only, no server.
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "support/temp_dir.h"

namespace sluice::testing {

inline void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  if (!out) ADD_FAILURE() << "write " << path << " failed";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct TestCerts {
  TempDir dir{"sluice-certs"};
  std::string ca_crt, client_crt, client_key, other_ca_crt;  // file paths (PEM)

  TestCerts() {
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; cd ", dir.path(), "; ",
        "openssl req -x509 ", ec, " -keyout ca.key -out ca.crt -days 2 -subj /CN=sluice-test-ca; ",
        "openssl req -x509 ", ec, " -keyout other.key -out other.crt -days 2 -subj /CN=other; ",
        "openssl req ", ec, " -keyout client.key -out client.csr -subj /CN=system:node:n1; ",
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial ",
        "-out client.crt -days 2");
    const std::string log = dir / "openssl.log";
    const std::string cmd = "bash -c '" + script + "' >" + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(log);
    ca_crt = dir / "ca.crt";
    client_crt = dir / "client.crt";
    client_key = dir / "client.key";
    other_ca_crt = dir / "other.crt";
  }
};

}  // namespace sluice::testing
