#include "inferd/peer_credentials.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace inferd {

std::vector<gid_t> supplementary_groups(pid_t pid) {
  std::vector<gid_t> groups;
  if (pid <= 0) return groups;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream values(line.substr(7));
    long long gid = 0;
    while (values >> gid) groups.push_back(static_cast<gid_t>(gid));
    break;
  }
  return groups;
}

bool may_read_and_write(const struct stat& st, const PeerCredentials& peer, std::string* why) {
  if (peer.uid == 0) return true;
  mode_t bits;
  if (peer.uid == st.st_uid) {
    bits = (st.st_mode >> 6) & 07;
  } else {
    const std::vector<gid_t> groups = supplementary_groups(peer.pid);
    const bool member = peer.gid == st.st_gid || std::find(groups.begin(), groups.end(), st.st_gid) != groups.end();
    bits = member ? (st.st_mode >> 3) & 07 : st.st_mode & 07;
  }
  if ((bits & 06) == 06) return true;
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  *why = "the client (uid " + std::to_string(peer.uid) + ", gid " + std::to_string(peer.gid) +
         ") may not read and write it itself (owner uid " + std::to_string(st.st_uid) + ", group " +
         std::to_string(st.st_gid) + ", mode " + mode + ")";
  return false;
}

}  // namespace inferd
