// Certificates made by openssl for tests (TLS, mutual TLS, etcd client
// certificate auth): one self-signed CA per name, then leaf certificates
// signed by one of them, valid for 127.0.0.1 and localhost, usable as a
// server's and as a client's. Files: DIR/NAME.crt and DIR/NAME.key.
#ifndef ROLLPACK_TESTING_TEST_CERTIFICATES_H_
#define ROLLPACK_TESTING_TEST_CERTIFICATES_H_

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rollpack {

struct TestLeafCertificate {
  std::string name;         // file name stem
  std::string common_name;  // subject CN (a member's identity, an etcd user)
  std::string ca;           // a name given to MakeTestCertificates' cas
};

inline absl::Status MakeTestCertificates(const std::string& dir,
                                         const std::vector<std::string>& cas,
                                         const std::vector<TestLeafCertificate>& leaves) {
  std::string script = absl::StrCat("set -e; cd '", dir, "'; ",
                                    "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\\n' > leaf.ext; ");
  for (const std::string& ca : cas) {
    absl::StrAppend(&script, "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=", ca,
                    "-ca -keyout ", ca, ".key -out ", ca, ".crt 2>/dev/null; ");
  }
  for (const TestLeafCertificate& leaf : leaves) {
    absl::StrAppend(&script, "openssl req -newkey rsa:2048 -nodes -subj /CN=", leaf.common_name,
                    " -keyout ", leaf.name, ".key -out ", leaf.name, ".csr 2>/dev/null; ",
                    "openssl x509 -req -in ", leaf.name, ".csr -CA ", leaf.ca, ".crt -CAkey ",
                    leaf.ca, ".key -CAcreateserial -days 1 -extfile leaf.ext -out ", leaf.name,
                    ".crt 2>/dev/null; ");
  }
  const std::string command = absl::StrCat("bash -c \"", script, "\"");
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("openssl failed making test certificates in ", dir));
  }
  return absl::OkStatus();
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_TEST_CERTIFICATES_H_
