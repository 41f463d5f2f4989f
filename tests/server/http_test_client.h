// A small blocking HTTP/1.1 client for the server tests (one request per connection): sends a request, reads the
// whole answer (Content-Length, chunked, or until close) with a receive timeout.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace latent::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpReply {
  int status = 0;
  Headers headers;
  std::string body;
  std::string get_header_value(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (k.size() != name.size()) continue;
      bool eq = true;
      for (size_t i = 0; i < k.size() && eq; ++i)
        eq = std::tolower(static_cast<unsigned char>(k[i])) == std::tolower(static_cast<unsigned char>(name[i]));
      if (eq) return v;
    }
    return {};
  }
};

using HttpResult = std::optional<HttpReply>;

inline int connect_local(int port, double timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Parses one response from `data` (complete when `eof`); nullopt when more bytes are needed or it is malformed.
inline std::optional<HttpReply> parse_reply(const std::string& data, bool head, bool eof) {
  const size_t he = data.find("\r\n\r\n");
  if (he == std::string::npos) return std::nullopt;
  HttpReply r;
  size_t p = data.find("\r\n");
  const std::string status_line = data.substr(0, p);
  if (status_line.size() < 12) return std::nullopt;
  r.status = std::stoi(status_line.substr(9, 3));
  p += 2;
  while (p < he) {
    const size_t e = data.find("\r\n", p);
    const std::string line = data.substr(p, e - p);
    const size_t c = line.find(':');
    if (c != std::string::npos) {
      std::string v = line.substr(c + 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers.emplace_back(line.substr(0, c), v);
    }
    p = e + 2;
  }
  const size_t body = he + 4;
  if (head || r.status == 204 || r.status == 304) return r;
  if (r.get_header_value("Transfer-Encoding") == "chunked") {
    size_t q = body;
    while (true) {
      const size_t le = data.find("\r\n", q);
      if (le == std::string::npos) return std::nullopt;
      const size_t n = std::stoul(data.substr(q, le - q), nullptr, 16);
      if (data.size() < le + 2 + n + 2) return std::nullopt;
      if (n == 0) return r;
      r.body.append(data, le + 2, n);
      q = le + 2 + n + 2;
    }
  }
  const std::string cl = r.get_header_value("Content-Length");
  if (!cl.empty()) {
    const size_t n = std::stoul(cl);
    if (data.size() < body + n) return std::nullopt;
    r.body = data.substr(body, n);
    return r;
  }
  if (!eof) return std::nullopt;
  r.body = data.substr(body);
  return r;
}

class HttpClient {
 public:
  explicit HttpClient(int port, double timeout_s = 20) : port_(port), timeout_s_(timeout_s) {}
  HttpResult Get(const std::string& path, const Headers& h = {}) const { return send("GET", path, h, nullptr, ""); }
  HttpResult Head(const std::string& path, const Headers& h = {}) const { return send("HEAD", path, h, nullptr, ""); }
  HttpResult Options(const std::string& path, const Headers& h = {}) const {
    return send("OPTIONS", path, h, nullptr, "");
  }
  HttpResult Post(const std::string& path, const std::string& body, const std::string& type) const {
    return send("POST", path, {}, &body, type);
  }
  HttpResult Post(const std::string& path, const Headers& h, const std::string& body, const std::string& type) const {
    return send("POST", path, h, &body, type);
  }
  // Sends raw bytes on a new connection and parses the answer.
  HttpResult raw(const std::string& bytes, bool head = false) const {
    const int fd = connect_local(port_, timeout_s_);
    if (fd < 0) return std::nullopt;
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    std::string data;
    char buf[65536];
    std::optional<HttpReply> r;
    while (true) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        r = parse_reply(data, head, true);
        break;
      }
      data.append(buf, static_cast<size_t>(n));
      if ((r = parse_reply(data, head, false))) break;
    }
    ::close(fd);
    return r;
  }

 private:
  HttpResult send(const std::string& method, const std::string& path, const Headers& h, const std::string* body,
                  const std::string& type) const {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    for (const auto& [k, v] : h) req += k + ": " + v + "\r\n";
    if (body) req += "Content-Type: " + type + "\r\nContent-Length: " + std::to_string(body->size()) + "\r\n";
    req += "\r\n";
    if (body) req += *body;
    return raw(req, method == "HEAD");
  }
  int port_;
  double timeout_s_;
};

}  // namespace latent::testing
