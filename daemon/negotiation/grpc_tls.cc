#include "daemon/negotiation/grpc_tls.h"

#include <fstream>
#include <sstream>

#include "daemon/common/private_files.h"

namespace sparsync::negotiation {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

Result<std::string> ReadPem(const std::string& path, const char* variable) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(std::string(variable) + " " + path + " cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.size() > kMaxPemBytes || pem.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgument(std::string(variable) + " " + path + " is not a PEM file");
  }
  return pem;
}

}  // namespace

Result<TlsMaterial> LoadTls(const Config::Tls& tls) {
  TlsMaterial m;
  SPARSYNC_ASSIGN_OR_RETURN(m.cert, ReadPem(tls.cert, "SPARSYNC_TLS_CERT"));
  SPARSYNC_ASSIGN_OR_RETURN(m.ca, ReadPem(tls.ca, "SPARSYNC_TLS_CA"));
  SPARSYNC_ASSIGN_OR_RETURN(m.key, ReadPrivateFile(tls.key, "SPARSYNC_TLS_KEY", kMaxPemBytes));
  if (m.key.find("PRIVATE KEY-----") == std::string::npos) {
    return InvalidArgument("SPARSYNC_TLS_KEY " + tls.key + " is not a PEM private key");
  }
  return m;
}

Result<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Config::Tls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  SPARSYNC_ASSIGN_OR_RETURN(TlsMaterial m, LoadTls(tls));
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = m.ca;
  options.pem_key_cert_pairs.push_back({m.key, m.cert});
  return grpc::SslServerCredentials(options);
}

Result<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const Config::Tls& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  SPARSYNC_ASSIGN_OR_RETURN(TlsMaterial m, LoadTls(tls));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = m.ca;
  options.pem_private_key = m.key;
  options.pem_cert_chain = m.cert;
  return grpc::SslCredentials(options);
}

}  // namespace sparsync::negotiation
