// PeerWatch: notices that the client of the current HTTP request closed its connection (spec api.md §11.4: a
// non-streaming handler must watch the socket while it waits). cpp-httplib 0.11 does not hand the socket to
// handlers, so the connection's descriptor is found once by its (local port, peer address, peer port), which
// identifies one TCP connection; then poll() + recv(MSG_PEEK) tell EOF apart from pipelined data.
#pragma once
#include <string>

namespace latent::server {

class PeerWatch {
 public:
  PeerWatch(const std::string& remote_addr, int remote_port, int local_port);
  bool found() const { return fd_ >= 0; }
  // True once the peer has closed (FIN or RST). False when unknown.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace latent::server
