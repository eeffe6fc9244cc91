#pragma once

// Who is on the other end of a Unix-socket connection, as the kernel recorded it when the peer
// connected (SO_PEERCRED), and the file-permission check the kernel would make for that peer:
// the server opens things on a client's behalf (shared-memory objects) only when the client could
// open them itself, so that the server is never a confused deputy.

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace inferd {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Whether `peer` may open the file `st` describes for reading and writing, by the kernel's rule
// for a process with the peer's uid, gid and supplementary groups (read from /proc/PID/status;
// only the gid when that process is gone): root may; the owner gets the owner's bits, a member of
// the file's group the group's, anyone else the others'. When not, `*why` says why, naming the
// uid, the owner and the mode. Thread-safe; reads /proc once.
bool may_read_and_write(const struct stat& st, const PeerCredentials& peer, std::string* why);

// The supplementary groups of process `pid` ("Groups:" of /proc/PID/status); empty when unknown.
std::vector<gid_t> supplementary_groups(pid_t pid);

}  // namespace inferd
