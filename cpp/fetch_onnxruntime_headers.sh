#!/usr/bin/env bash
# Usage: cpp/fetch_onnxruntime_headers.sh DEST
#
# Puts ONNX Runtime's C/C++ API headers (onnxruntime_c_api.h, onnxruntime_cxx_api.h, ...) into
# DEST. The onnxruntime wheel ships the library but no headers, so the build takes them from
# Debian 13 (trixie)'s libonnxruntime-dev, ORT 1.21: the core asks the library for API version 21,
# which every ORT >= 1.21 provides. Run by CMake at configure time; nothing it fetches is committed.
#
# apt downloads the package with a one-off source for suite trixie, on the mirror this system's
# own apt sources use. Every apt state and cache folder is redirected into a temporary folder, so
# the system's sources, lists and caches stay untouched and it works without root.
set -euo pipefail

dest=${1:?usage: $0 DEST}
PACKAGE=libonnxruntime-dev
SUITE=trixie
KEYRINGS=/usr/share/keyrings
# Fallback pin, for a system whose keyring predates trixie (see below): the SHA-256 of
# libonnxruntime-dev 1.21.0+dfsg-1 amd64, as listed in trixie's signed Packages index.
PINNED_SHA256_AMD64=14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08

fail() {
  echo "fetch_onnxruntime_headers: $*" >&2
  exit 1
}

for tool in apt-get dpkg dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || fail "needs $tool (a Debian system); otherwise install ONNX Runtime's headers and pass -DINFERD_ONNXRUNTIME_INCLUDE_DIR=DIR"
done

# The main archive's mirror: the first `deb` source that serves this system's own release
# (VERSION_CODENAME, e.g. bookworm) as a plain suite. That rules out -security/-updates pockets and
# third-party repositories. INFERD_DEBIAN_MIRROR overrides it.
debian_mirror() {
  local codename found=""
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 0
  shopt -s nullglob
  local deb822=(/etc/apt/sources.list.d/*.sources)
  local one_line=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
  shopt -u nullglob
  if [ ${#deb822[@]} -gt 0 ]; then
    # One stanza per blank-line-separated paragraph; "#" lines are comments.
    found=$(awk -v codename="$codename" 'BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^[ \t]*#/ || index($i, ":") == 0) continue
          key = tolower(substr($i, 1, index($i, ":") - 1)); value = substr($i, index($i, ":") + 1)
          gsub(/^[ \t]+|[ \t]+$/, "", value)
          if (key == "types") types = value; else if (key == "uris") uris = value
          else if (key == "suites") suites = value; else if (key == "enabled") enabled = tolower(value)
        }
        if (enabled == "no" || (" " types " ") !~ / deb /) next
        n = split(suites, s, /[ \t]+/)
        for (j = 1; j <= n; j++) if (s[j] == codename) { split(uris, u, /[ \t]+/); print u[1]; exit }
      }' "${deb822[@]}" || true)
  fi
  for file in "${one_line[@]}"; do
    [ -z "$found" ] || break
    # deb [options] URI suite component...
    found=$(sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$file" |
      awk -v codename="$codename" '$1 == "deb" && $3 == codename { print $2; exit }' || true)
  done
  echo "$found"
}

mirror=${INFERD_DEBIAN_MIRROR:-}
[ -n "$mirror" ] || mirror=$(debian_mirror)
[ -n "$mirror" ] || fail "found no Debian mirror for this release in /etc/apt/sources.list{,.d} (set INFERD_DEBIAN_MIRROR to one)"

work=$(mktemp -d "${TMPDIR:-/tmp}/inferd-ort-headers.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parts" "$work/empty" "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"

# Signatures are checked against the system's Debian keyring when it holds trixie's archive key
# (debian-archive-keyring 2023.3 and later, bookworm included). An older keyring cannot verify
# trixie's Release file; rather than trusting the index blindly, the .deb is then accepted only if
# it is byte-for-byte the one pinned above, and only for amd64.
if [ -f "$KEYRINGS/debian-archive-trixie-automatic.gpg" ] && [ -f "$KEYRINGS/debian-archive-keyring.gpg" ]; then
  trust="Signed-By: $KEYRINGS/debian-archive-keyring.gpg"
  pin=""
else
  [ "$(dpkg --print-architecture)" = amd64 ] ||
    fail "the keyring in $KEYRINGS lacks trixie's key (upgrade debian-archive-keyring), and the unsigned fallback is pinned for amd64 only"
  echo "fetch_onnxruntime_headers: $KEYRINGS lacks trixie's archive key; accepting only the pinned .deb" >&2
  trust="Trusted: yes"
  pin=$PINNED_SHA256_AMD64
fi
printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n%s\n' "$mirror" "$SUITE" "$trust" \
  >"$work/parts/inferd-onnxruntime.sources"

apt_options=(
  -q
  -o "Dir::Etc::SourceList=/dev/null"
  -o "Dir::Etc::SourceParts=$work/parts"
  -o "Dir::Etc::Preferences=/dev/null"
  -o "Dir::Etc::PreferencesParts=$work/empty"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache"
  -o "Acquire::Languages=none"
)
# The system's apt configuration still applies (a proxy, say), but not its update hooks, which
# refresh system caches (AppStream, PackageKit). apt reads Dir::Etc::main after apt.conf.d, so a
# main file of our own, named through APT_CONFIG (read first), can clear them.
{
  [ -z "${APT_CONFIG:-}" ] || echo "#include \"$APT_CONFIG\";"
  echo "Dir::Etc::main \"$work/apt-main.conf\";"
} >"$work/apt-config.conf"
{
  [ ! -f /etc/apt/apt.conf ] || echo '#include "/etc/apt/apt.conf";'
  echo '#clear APT::Update::Pre-Invoke;'
  echo '#clear APT::Update::Post-Invoke;'
  echo '#clear APT::Update::Post-Invoke-Success;'
} >"$work/apt-main.conf"
export APT_CONFIG="$work/apt-config.conf"
if [ "$(id -u)" = 0 ] && id _apt >/dev/null 2>&1; then
  # As root apt downloads as the unprivileged _apt user: let it reach the folders it writes.
  chmod 755 "$work"
  chown _apt "$work/deb"
fi

apt-get "${apt_options[@]}" --error-on=any update >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log" >&2; fail "apt-get update for $SUITE on $mirror failed"; }
(cd "$work/deb" && apt-get "${apt_options[@]}" download "$PACKAGE") >>"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log" >&2; fail "apt-get download $PACKAGE from $SUITE failed"; }

deb=$(echo "$work"/deb/*.deb)
[ -f "$deb" ] || fail "apt-get download left no .deb"
if [ -n "$pin" ]; then
  actual=$(sha256sum "$deb" | cut -d' ' -f1)
  [ "$actual" = "$pin" ] || fail "$(basename "$deb") has SHA-256 $actual, not the pinned $pin"
fi

dpkg-deb -x "$deb" "$work/root"
include="$work/root/usr/include/onnxruntime"
[ -f "$include/onnxruntime_cxx_api.h" ] || fail "$(basename "$deb") has no usr/include/onnxruntime/onnxruntime_cxx_api.h"
# Only the include folder is kept; it replaces DEST whole, so a rerun leaves nothing stale.
rm -rf "$dest.partial"
mkdir -p "$(dirname "$dest")"
cp -r "$include" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch_onnxruntime_headers: $(basename "$deb") -> $dest"
