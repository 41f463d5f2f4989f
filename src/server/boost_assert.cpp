// Boost's assertion handler for the builds that keep assertions (Debug, the sanitizer stage): the server's targets
// define BOOST_ENABLE_ASSERT_DEBUG_HANDLER (CMakeLists.txt), so every BOOST_ASSERT in Beast and Asio comes here
// instead of to assert(); with NDEBUG (Release) BOOST_ASSERT stays a no-op, as before.
//
// One assertion of Boost.Beast 1.81 (Debian 12) is wrong, not the code it guards: basic_parser::parse_chunk_header
// asserts `n >= 5` when it re-enters a final chunk whose terminating CRLF has not arrived yet, but a client can send
// as few as 3 or 4 bytes there (our fuzzer found "0\n\r\n" fed in pieces). The code after it returns need_more or a
// parse error, as a Release build does (ASan + UBSan clean); Beast fixed the assertion upstream (boostorg/beast#2861,
// Boost 1.86). Without this handler a Debug server aborted on such a request. Every other failed assertion aborts.
#include <boost/assert.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace boost {

namespace {
bool known_wrong(const char* expr, const char* function, const char* file) {
  return std::strcmp(expr, "n >= 5") == 0 && std::strstr(function, "parse_chunk_header") != nullptr &&
         std::strstr(file, "beast/http/impl/basic_parser.ipp") != nullptr;
}
}  // namespace

void assertion_failed(const char* expr, const char* function, const char* file, long line) {
  if (known_wrong(expr, function, file)) return;
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s' failed.\n", file, line, function, expr);
  std::abort();
}

void assertion_failed_msg(const char* expr, const char* msg, const char* function, const char* file, long line) {
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s' failed: %s\n", file, line, function, expr, msg);
  std::abort();
}

}  // namespace boost
