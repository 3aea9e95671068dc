#!/usr/bin/env bash
# Install, with apt-get, the Debian packages that make test, make e2e and
# make demo need and this machine lacks (none: nothing is run). Called by
# .ci/run and e2e/local/demo.sh; needs root when something is missing.
set -euo pipefail

need=()
command -v make >/dev/null || need+=(make)
command -v gcc  >/dev/null || need+=(gcc libc6-dev)   # the race detector needs cgo
command -v git  >/dev/null || need+=(git)
# For make e2e and make demo: runc's seccomp support, the CNI plugins, the
# test image's busybox, and the tools the node harness calls.
pkg-config --exists libseccomp 2>/dev/null || need+=(libseccomp-dev pkg-config)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v curl    >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v ip      >/dev/null || need+=(iproute2)
command -v setsid  >/dev/null || need+=(util-linux)
command -v pkill   >/dev/null || need+=(procps)
# For make test: the durability test traces a spec write, the write-failure
# test makes the CDI dir immutable.
command -v strace  >/dev/null || need+=(strace)
command -v chattr  >/dev/null || need+=(e2fsprogs)
[ "${#need[@]}" -gt 0 ] || exit 0

if ! command -v apt-get >/dev/null; then
	echo "deps.sh: missing ${need[*]}, and this is not a Debian-like system: install them by hand" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "deps.sh: missing ${need[*]}; run as root to install them (apt-get)" >&2
	exit 1
fi
echo "deps.sh: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}"
