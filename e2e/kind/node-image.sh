#!/usr/bin/env bash
# Build a kind node image on this machine, with no registry and no
# "kind build node-image" (which needs docker and pulls its base image):
#
#   e2e/kind/node-image.sh ENGINE      ENGINE: podman or docker
#
# Prints the image reference on stdout (progress goes to stderr). The image is
# tagged localhost/cdi-e2e-node:<kubernetes version>-<key>, where the key is a
# hash of everything it is made of: the component versions
# (e2e/local/build-binaries.sh --versions), KIND_VERSION, the Debian suite and
# packages, this script and e2e/cmd/mkimage. It is built once per key and
# reused: first from the engine's image store, then from the root filesystem
# cached as ${E2E_CACHE}/kind/node-<tag>.tar (imported in about a minute),
# else built from scratch (about 3 minutes once the Go binaries are cached).
# A new key removes the cached tarballs and engine images of the old ones.
#
# What the image holds (see e2e/kind/README.md for how it differs from
# kindest/node):
# - a Debian root filesystem made by mmdebstrap with the packages kind's base
#   image installs (systemd, iptables, ...), cleaned up as kind's base
#   Dockerfile does;
# - kind's base files (entrypoint, systemd units, kubelet drop-ins, hooks,
#   containerd config), taken from the sigs.k8s.io/kind module at KIND_VERSION
#   in the Go module cache, never copied into this repository; the containerd
#   config gets the pause image kubeadm wants and restrict_oom_score_adj = true
#   (lowering oom_score_adj needs CAP_SYS_RESOURCE, which CI lacks);
# - kubelet, kubeadm, kubectl, containerd, runc and crictl (for "kind export
#   logs"; kind's /etc/crictl.yaml points it at containerd's socket) built by
#   e2e/local/build-binaries.sh --kind; Debian's CNI plugins and a bridge
#   conflist (the cluster runs with disableDefaultCNI: no kindnetd image);
# - the images kubeadm deploys (kubeadm config images list), made from the same
#   binaries with e2e/cmd/mkimage and imported into the node's containerd by a
#   private containerd on this machine: kube-apiserver, -controller-manager,
#   -scheduler, etcd, coredns (static binaries alone), kube-proxy (the Debian
#   root filesystem, iptables in legacy mode, plus the binary) and pause (the
#   static busybox waiting forever).
#
# Needs root (chroot, mounts), mmdebstrap, busybox-static, tar, go, and the
# network access of apt (Debian mirror) and go (module proxy).
#
#   KIND_VERSION    kind release whose base files are used (required; run.sh sets it)
#   E2E_CACHE       cache root (default ~/.cache/cdi-device-plugin-e2e)
#   DEBIAN_MIRROR   mirror for mmdebstrap (default: mmdebstrap's, deb.debian.org)
set -euo pipefail

DEBIAN_SUITE=bookworm
# The packages of kind's base image (images/base/Dockerfile) that a node
# running the suite uses, plus Debian's CNI plugins and libseccomp2 for runc.
# Left out: pigz, fuse-overlayfs (rootless), nfs-common, open-iscsi (storage).
PACKAGES=(
	systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod
	libseccomp2 e2fsprogs bash ca-certificates curl jq procps socat
	containernetworking-plugins
)
IMAGE_REPO=localhost/cdi-e2e-node
POD_SUBNET=10.244.0.0/24 # the node's podCIDR: the first /24 of kind's 10.244.0.0/16

LOG_TAG=node-image
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
script_dir=${REPO}/e2e/kind
repo_root=${REPO}
engine=${1:-}
[[ ${engine} == podman || ${engine} == docker ]] || die "usage: node-image.sh podman|docker"
cache=${E2E_CACHE}/kind
build_binaries=${repo_root}/e2e/local/build-binaries.sh

# The versions build-binaries.sh builds (from e2e/versions.env).
versions=$("${build_binaries}" --versions)
eval "${versions}"

sha() { sha256sum | cut -c1-"${1:-64}"; }

# The key: everything the image is made of.
base_key=$(printf '%s\n' "${DEBIAN_SUITE}" "${DEBIAN_MIRROR:-}" "${PACKAGES[@]}" | sha 12)
key=$({
	printf '%s\n' "${versions}" "KIND_VERSION=${KIND_VERSION}" "${base_key}"
	cat "${BASH_SOURCE[0]}" "${repo_root}/e2e/cmd/mkimage/main.go"
} | sha 12)
tag=${K8S_VERSION}-${key}
image=${IMAGE_REPO}:${tag}
rootfs_tar=${cache}/node-${tag}.tar
base_tar=${cache}/debian-${DEBIAN_SUITE}-${base_key}.tar

have_image() { "${engine}" image inspect "$1" >/dev/null 2>&1; }

# prune: drop the cached tarballs and engine images of other keys.
prune() {
	local f ref
	for f in "${cache}"/node-*.tar; do
		[[ -f ${f} && ${f} != "${rootfs_tar}" ]] || continue
		log "removing the outdated ${f}"
		rm -f -- "${f}"
	done
	while read -r ref; do
		[[ -n ${ref} && ${ref} != "${image}" && ${ref} == "${IMAGE_REPO}:"* ]] || continue
		log "removing the outdated image ${ref}"
		"${engine}" rmi "${ref}" >/dev/null 2>&1 || true
	done < <("${engine}" images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null)
}

import_image() {
	local t0=${SECONDS}
	log "importing ${rootfs_tar} into ${engine} as ${image}"
	"${engine}" import \
		--change 'ENV container=docker' \
		--change 'STOPSIGNAL SIGRTMIN+3' \
		--change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
		"${rootfs_tar}" "${image}" >/dev/null
	log "imported in $((SECONDS - t0)) s"
}

if have_image "${image}"; then
	log "using ${image} (already in ${engine})"
	printf '%s\n' "${image}"
	exit 0
fi
mkdir -p "${cache}"
if [[ -f ${rootfs_tar} ]]; then
	import_image
	prune
	printf '%s\n' "${image}"
	exit 0
fi

# From here on: a build.
[[ $(id -u) == 0 ]] || die "building the node image needs root (chroot, mounts)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then
	die "a static /bin/busybox is missing (apt-get install busybox-static)"
fi

work=''
ctrd_pid=''
# Runs from the EXIT trap.
# shellcheck disable=SC2317
cleanup() {
	local rc=$? m
	trap - EXIT INT TERM
	set +e
	if [[ -n ${ctrd_pid} ]]; then
		kill -TERM "${ctrd_pid}" 2>/dev/null
		wait "${ctrd_pid}" 2>/dev/null
	fi
	if [[ -n ${work} ]]; then
		# Mounts the private containerd may have left (deepest first).
		awk -v d="${work}" 'index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
			while read -r m; do umount -l "${m}"; done
		rm -rf -- "${work}"
	fi
	rm -f -- "${rootfs_tar}.tmp" "${base_tar}.tmp"
	exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
t_start=${SECONDS}
# Beside the cache rather than in /tmp (often a small tmpfs): the root
# filesystem is about 2 GB.
work=$(mktemp -d "${cache}/.build.XXXXXX")
bin=${work}/bin
images=${work}/images
rootfs=${work}/rootfs
mkdir -p "${images}" "${rootfs}"

log "building ${image}"
"${build_binaries}" --kind --link "${bin}"

# kind's base files, from the module cache.
kind_dir=$(cd "${work}" && go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
files=${kind_dir}/images/base/files
[[ -f ${files}/usr/local/bin/entrypoint ]] || die "kind's base files not found in ${kind_dir:-the module cache}"

# The Debian root filesystem, cached by suite and package list. iptables is
# set to legacy for the kube-proxy image (the node's entrypoint picks its own
# mode at start: legacy unless the host's nft rules outnumber its legacy ones).
if [[ ! -f ${base_tar} ]]; then
	log "mmdebstrap ${DEBIAN_SUITE} (${#PACKAGES[@]} packages)"
	local_mirror=()
	[[ -z ${DEBIAN_MIRROR:-} ]] || local_mirror=("${DEBIAN_MIRROR}")
	# The hooks run in mmdebstrap's shell, where $1 is the root directory.
	# shellcheck disable=SC2016
	mmdebstrap --variant=minbase --mode=root --format=tar \
		--include="$(
			IFS=,
			echo "${PACKAGES[*]}"
		)" \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--customize-hook='chroot "$1" update-alternatives --set iptables /usr/sbin/iptables-legacy' \
		--customize-hook='chroot "$1" update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
		"${DEBIAN_SUITE}" "${base_tar}.tmp" "${local_mirror[@]}" </dev/null
	mv -f "${base_tar}.tmp" "${base_tar}"
fi

# The images kubeadm deploys, named as kubeadm lists them.
log "images for kubeadm ${K8S_VERSION}"
(cd "${repo_root}" && CGO_ENABLED=0 go build -trimpath -o "${work}/mkimage" ./e2e/cmd/mkimage)
pause_ref=''
refs=()
while read -r ref; do
	[[ -n ${ref} ]] || continue
	name=${ref##*/}
	name=${name%%:*}
	version=${ref##*:}
	args=(-o "${images}/${name}.tar" -tag "${ref}")
	case ${name} in
	kube-apiserver | kube-controller-manager | kube-scheduler)
		[[ ${version} == "${K8S_VERSION}" ]] || die "kubeadm wants ${ref}, we build ${K8S_VERSION}"
		args+=(-file "/usr/local/bin/${name}=${bin}/${name}" -env PATH=/usr/local/bin -entrypoint "/usr/local/bin/${name}")
		;;
	etcd)
		[[ ${version} == "${ETCD_VERSION#v}"-* ]] || die "kubeadm wants ${ref}, we build etcd ${ETCD_VERSION} (build-binaries.sh)"
		args+=(-file "/usr/local/bin/etcd=${bin}/etcd" -env PATH=/usr/local/bin -entrypoint /usr/local/bin/etcd)
		;;
	coredns)
		[[ ${version} == "${COREDNS_VERSION}" ]] || die "kubeadm wants ${ref}, we build coredns ${COREDNS_VERSION} (build-binaries.sh)"
		args+=(-file "/coredns=${bin}/coredns" -entrypoint /coredns)
		;;
	kube-proxy)
		[[ ${version} == "${K8S_VERSION}" ]] || die "kubeadm wants ${ref}, we build ${K8S_VERSION}"
		args+=(-layer "${base_tar}" -file "/usr/local/bin/kube-proxy=${bin}/kube-proxy"
			-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -entrypoint /usr/local/bin/kube-proxy)
		;;
	pause)
		pause_ref=${ref}
		args+=(-file /bin/busybox=/bin/busybox -entrypoint /bin/busybox
			-cmd sh -cmd -c -cmd "trap 'exit 0' TERM INT; while :; do /bin/busybox sleep 3600 & wait; done")
		;;
	*) die "kubeadm lists an image this script does not know how to make: ${ref}" ;;
	esac
	"${work}/mkimage" "${args[@]}"
	refs+=("${ref}")
done < <("${bin}/kubeadm" config images list --kubernetes-version "${K8S_VERSION}")
[[ -n ${pause_ref} && ${#refs[@]} -eq 7 ]] || die "unexpected kubeadm image list: ${refs[*]}"

log "assembling the root filesystem"
tar -xpf "${base_tar}" -C "${rootfs}" --numeric-owner
# kind's base files, with the modes kind's Dockerfile gives them.
install -m 0755 "${files}"/usr/local/bin/* "${rootfs}/usr/local/bin/"
install -d -m 0755 "${rootfs}/kind/bin" "${rootfs}/etc/containerd" "${rootfs}/etc/default" \
	"${rootfs}/etc/sysctl.d" "${rootfs}/etc/systemd/system/kubelet.service.d" "${rootfs}/etc/kubernetes/manifests" \
	"${rootfs}/etc/cni/net.d" "${rootfs}/opt/cni" "${rootfs}/usr/local/sbin"
install -m 0755 "${files}"/kind/bin/* "${rootfs}/kind/bin/"
install -m 0644 "${files}/etc/crictl.yaml" "${rootfs}/etc/"
grep -qx 'runtime-endpoint: unix:///run/containerd/containerd.sock' "${rootfs}/etc/crictl.yaml" ||
	die "kind's /etc/crictl.yaml changed: no runtime-endpoint at containerd's socket"
install -m 0644 "${files}"/etc/containerd/* "${rootfs}/etc/containerd/"
install -m 0644 "${files}"/etc/default/* "${rootfs}/etc/default/"
install -m 0644 "${files}"/etc/sysctl.d/* "${rootfs}/etc/sysctl.d/"
find "${files}/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "${rootfs}/etc/systemd/system/" \;
install -m 0644 "${files}"/etc/systemd/system/kubelet.service.d/* "${rootfs}/etc/systemd/system/kubelet.service.d/"
# The systemd clean-up of kind's Dockerfile.
find "${rootfs}/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "${rootfs}"/lib/systemd/system/multi-user.target.wants/* "${rootfs}"/etc/systemd/system/*.wants/* \
	"${rootfs}"/lib/systemd/system/local-fs.target.wants/* "${rootfs}"/lib/systemd/system/sockets.target.wants/*udev* \
	"${rootfs}"/lib/systemd/system/sockets.target.wants/*initctl* "${rootfs}"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"${rootfs}/etc/systemd/journald.conf"
ln -sfn /usr/lib/systemd/systemd "${rootfs}/sbin/init"
# Binaries, where kind's units and kind itself look for them.
for n in kubelet kubeadm kubectl; do install -m 0755 "${bin}/${n}" "${rootfs}/usr/bin/${n}"; done
for n in containerd ctr containerd-shim-runc-v2 crictl; do install -m 0755 "${bin}/${n}" "${rootfs}/usr/local/bin/${n}"; done
install -m 0755 "${bin}/runc" "${rootfs}/usr/local/sbin/runc"
chroot "${rootfs}" systemctl enable kubelet.service containerd.service undo-mount-hacks.service 2>&1 | sed 's/^/  /' >&2
chroot "${rootfs}" systemctl mask systemd-binfmt.service 2>&1 | sed 's/^/  /' >&2
# containerd: kind's config, with the pause image kubeadm wants and no
# lowering of oom_score_adj; kind's base runtime spec.
sed -i -e "s#^\([[:space:]]*sandbox_image = \).*#\1\"${pause_ref}\"#" \
	-e 's#^\([[:space:]]*restrict_oom_score_adj = \).*#\1true#' "${rootfs}/etc/containerd/config.toml"
if ! grep -q "sandbox_image = \"${pause_ref}\"" "${rootfs}/etc/containerd/config.toml" ||
	! grep -q 'restrict_oom_score_adj = true' "${rootfs}/etc/containerd/config.toml"; then
	die "kind's containerd config.toml changed: sandbox_image or restrict_oom_score_adj not found"
fi
chroot "${rootfs}" sh -ec "ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' | jq 'del(.process.rlimits)'" \
	>"${rootfs}/etc/containerd/cri-base.json"
# CNI: Debian's plugins and a bridge for the node's pod subnet.
ln -sfn /usr/lib/cni "${rootfs}/opt/cni/bin"
cat >"${rootfs}/etc/cni/net.d/10-bridge.conflist" <<EOF
{"cniVersion":"1.0.0","name":"kind-bridge","plugins":[
 {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"hairpinMode":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"${POD_SUBNET}"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
EOF
printf '%s\n' "${K8S_VERSION}" >"${rootfs}/kind/version"

# Preload the images into the node's containerd store: a private containerd
# whose root is the node's /var/lib/containerd, with nothing that touches this
# machine (no CRI, no NRI socket, no /opt/containerd).
log "preloading ${#refs[@]} images"
mkdir -p "${work}/ctrd"
cat >"${work}/ctrd/config.toml" <<EOF
version = 3
root = "${rootfs}/var/lib/containerd"
state = "${work}/ctrd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",
  "io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "${work}/ctrd/containerd.sock"
[ttrpc]
  address = "${work}/ctrd/containerd.sock.ttrpc"
[debug]
  address = ""
EOF
"${bin}/containerd" --config "${work}/ctrd/config.toml" >"${work}/ctrd/log" 2>&1 &
ctrd_pid=$!
ctr=("${bin}/ctr" -a "${work}/ctrd/containerd.sock")
for ((i = 0; i < 120; i++)); do
	"${ctr[@]}" version >/dev/null 2>&1 && break
	kill -0 "${ctrd_pid}" 2>/dev/null || die "private containerd exited: $(tail -n 20 "${work}/ctrd/log")"
	sleep 0.5
done
"${ctr[@]}" version >/dev/null || die "private containerd did not start: $(tail -n 20 "${work}/ctrd/log")"
for ref in "${refs[@]}"; do
	name=${ref##*/}
	name=${name%%:*}
	"${ctr[@]}" -n k8s.io images import --local --snapshotter overlayfs --discard-unpacked-layers "${images}/${name}.tar" \
		>/dev/null 2> >(grep -v "support for cgroup v1 is deprecated" >&2)
done
"${ctr[@]}" -n k8s.io images ls -q | sed 's/^/  /' >&2
kill -TERM "${ctrd_pid}"
wait "${ctrd_pid}" || true
ctrd_pid=''

log "writing ${rootfs_tar}"
tar -C "${rootfs}" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
	-cf "${rootfs_tar}.tmp" .
mv -f "${rootfs_tar}.tmp" "${rootfs_tar}"
rm -rf -- "${rootfs}"
import_image
prune
log "built ${image} in $((SECONDS - t_start)) s ($(du -m "${rootfs_tar}" | cut -f1) MB root filesystem)"
printf '%s\n' "${image}"
