#include "agent/lab/tools/tls.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice::lab {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;
using CertPtr = std::unique_ptr<X509, Free>;
using BioPtr = std::unique_ptr<BIO, Free>;

absl::Status OpenSslError(const std::string& what) {
  unsigned long code = ERR_get_error();
  char buf[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", buf));
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext) return OpenSslError(absl::StrCat("x509 extension ", OBJ_nid2sn(nid), "=", value));
  if (X509_add_ext(cert, ext.get(), -1) != 1) return OpenSslError("X509_add_ext");
  return absl::OkStatus();
}

absl::StatusOr<CertPtr> NewCert(EVP_PKEY* key, const std::string& cn, absl::Duration validity) {
  CertPtr cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity));
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslError("PEM_write_bio_X509");
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, len);
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("PEM_write_bio_PrivateKey");
  }
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, len);
}

}  // namespace

absl::StatusOr<TlsCredentials> GenerateServingCredentials(const std::vector<std::string>& ip_sans,
                                                          const std::vector<std::string>& dns_sans,
                                                          absl::Duration validity) {
  KeyPtr ca_key(EVP_EC_gen("P-256"));
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!ca_key || !key) return OpenSslError("EVP_EC_gen P-256");

  auto ca = NewCert(ca_key.get(), "sluice-lab-ca", validity + absl::Hours(24));
  if (!ca.ok()) return ca.status();
  X509_set_issuer_name(ca->get(), X509_get_subject_name(ca->get()));
  for (auto [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:TRUE"},
           {NID_key_usage, "critical,digitalSignature,keyCertSign,cRLSign"},
           {NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(ca->get(), ca->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(ca->get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("sign CA");

  auto cert = NewCert(key.get(), "sluice-lab-apiserver", validity);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(ca->get()));
  std::vector<std::string> sans;
  for (const std::string& ip : ip_sans) sans.push_back("IP:" + ip);
  for (const std::string& dns : dns_sans) sans.push_back("DNS:" + dns);
  std::vector<std::pair<int, std::string>> exts = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
      {NID_ext_key_usage, "serverAuth"},
      {NID_authority_key_identifier, "keyid:always"}};
  if (!sans.empty()) exts.push_back({NID_subject_alt_name, absl::StrJoin(sans, ",")});
  for (auto& [nid, value] : exts) {
    if (absl::Status s = AddExtension(cert->get(), ca->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(cert->get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("sign cert");

  TlsCredentials out;
  auto ca_pem = CertPem(ca->get());
  auto cert_pem = CertPem(cert->get());
  auto key_pem = KeyPem(key.get());
  if (!ca_pem.ok()) return ca_pem.status();
  if (!cert_pem.ok()) return cert_pem.status();
  if (!key_pem.ok()) return key_pem.status();
  out.ca_cert_pem = *ca_pem;
  out.cert_pem = *cert_pem;
  out.key_pem = *key_pem;
  return out;
}

}  // namespace sluice::lab
