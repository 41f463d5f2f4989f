// Test helper: run a shell command, return its standard output (and, through rc, pclose's status).
#pragma once
#include <cstdio>
#include <string>

namespace latent::test {

inline std::string run_command(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (rc) *rc = status;
  return out;
}

}  // namespace latent::test
