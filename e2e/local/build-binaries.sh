#!/usr/bin/env bash
# Build the node's components from source once and cache them outside the
# repository, keyed by version:
#
#   ${E2E_CACHE}/bin/<name>-<version>      (E2E_CACHE defaults to ~/.cache/cdi-device-plugin-e2e)
#
# kubelet, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
# from k8s.io/kubernetes; etcd; containerd, ctr and containerd-shim-runc-v2;
# runc (with seccomp, which needs libseccomp-dev and pkg-config). A cached
# binary is reused; a build writes to a temporary name and renames it, so an
# interrupted build leaves nothing half-written behind.
#
# Prints progress on stderr. Options:
#   --link DIR   also link each binary into DIR under its plain name
#                (DIR/kubelet -> .../kubelet-v1.36.3), so that the versions
#                are named in e2e/versions.env only
#   --kind       also build what a kind node image needs beside those:
#                kubeadm and kube-proxy (same Kubernetes version), coredns and
#                crictl (e2e/kind/node-image.sh)
#   --versions   print the versions as shell assignments and exit
set -euo pipefail
LOG_TAG=build
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
BIN_DIR=${E2E_CACHE}/bin

LINK_DIR=
KIND=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--link)
		[[ -n ${2:-} ]] || die "--link needs a directory"
		LINK_DIR=$2
		shift 2
		;;
	--kind)
		KIND=1
		shift
		;;
	--versions)
		printf 'K8S_VERSION=%s\nETCD_VERSION=%s\nCONTAINERD_VERSION=%s\nRUNC_VERSION=%s\nCOREDNS_VERSION=%s\nCRICTL_VERSION=%s\n' \
			"${K8S_VERSION}" "${ETCD_VERSION}" "${CONTAINERD_VERSION}" "${RUNC_VERSION}" "${COREDNS_VERSION}" "${CRICTL_VERSION}"
		exit 0
		;;
	*) die "usage: build-binaries.sh [--link DIR] [--kind] [--versions]" ;;
	esac
done
mkdir -p "${BIN_DIR}" "${E2E_CACHE}/src"

# have NAME VERSION: true when the cached binary exists.
have() { [[ -x ${BIN_DIR}/$1-$2 ]]; }

# wrapper DIR MODULE VERSION: a module in DIR that requires MODULE@VERSION.
wrapper() {
	local dir=$1 mod=$2 ver=$3
	mkdir -p "${dir}"
	cat >"${dir}/go.mod" <<EOM
module e2e.local/wrapper

go 1.26
EOM
	(cd "${dir}" && go get "${mod}@${ver}" >&2)
}

K8S_NAMES=(kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl)
KIND_K8S_NAMES=(kubeadm kube-proxy)

# k8s_tools_go: the wrapper module's tools.go, importing every command this
# script may build, so that one "go mod tidy" serves them all.
k8s_tools_go() {
	local n
	printf '//go:build tools\n\npackage tools\n\nimport (\n'
	for n in "${K8S_NAMES[@]}" "${KIND_K8S_NAMES[@]}"; do
		printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${n}"
	done
	printf ')\n'
}

build_k8s() {
	local names=("${K8S_NAMES[@]}") missing=() n
	((KIND == 0)) || names+=("${KIND_K8S_NAMES[@]}")
	for n in "${names[@]}"; do have "${n}" "${K8S_VERSION}" || missing+=("${n}"); done
	[[ ${#missing[@]} -gt 0 ]] || return 0
	local dir=${E2E_CACHE}/src/kubernetes-${K8S_VERSION}
	log "kubernetes ${K8S_VERSION}: ${missing[*]}"
	k8s_wrapper "${dir}" e2e.local/wrapper "$(k8s_tools_go)"
	for n in "${missing[@]}"; do
		log "  go build ${n}"
		k8s_build "${dir}" "k8s.io/kubernetes/cmd/${n}" "${BIN_DIR}/${n}-${K8S_VERSION}" "$(k8s_version_ldflags)"
	done
}

build_etcd() {
	have etcd "${ETCD_VERSION}" && return 0
	log "etcd ${ETCD_VERSION}"
	local dir=${E2E_CACHE}/src/etcd-${ETCD_VERSION}
	[[ -f ${dir}/go.sum ]] || wrapper "${dir}" go.etcd.io/etcd/server/v3 "${ETCD_VERSION}"
	(cd "${dir}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${BIN_DIR}/.etcd.tmp" go.etcd.io/etcd/server/v3)
	mv -f "${BIN_DIR}/.etcd.tmp" "${BIN_DIR}/etcd-${ETCD_VERSION}"
}

build_containerd() {
	local n
	for n in containerd ctr containerd-shim-runc-v2; do
		have "${n}" "${CONTAINERD_VERSION}" && continue
		log "${n} ${CONTAINERD_VERSION}"
		local gobin=${E2E_CACHE}/src/gobin-containerd-${CONTAINERD_VERSION}
		mkdir -p "${gobin}"
		GOBIN=${gobin} CGO_ENABLED=0 go install -trimpath -tags no_btrfs -ldflags "-s -w" \
			"github.com/containerd/containerd/v2/cmd/${n}@${CONTAINERD_VERSION}"
		mv -f "${gobin}/${n}" "${BIN_DIR}/${n}-${CONTAINERD_VERSION}"
	done
}

build_runc() {
	have runc "${RUNC_VERSION}" && return 0
	log "runc ${RUNC_VERSION}"
	pkg-config --exists libseccomp || die "runc needs libseccomp-dev and pkg-config (apt-get install libseccomp-dev pkg-config)"
	local dir=${E2E_CACHE}/src/runc-${RUNC_VERSION}
	[[ -f ${dir}/go.sum ]] || wrapper "${dir}" github.com/opencontainers/runc "${RUNC_VERSION}"
	(cd "${dir}" && CGO_ENABLED=1 go build -trimpath -tags seccomp -o "${BIN_DIR}/.runc.tmp" github.com/opencontainers/runc)
	mv -f "${BIN_DIR}/.runc.tmp" "${BIN_DIR}/runc-${RUNC_VERSION}"
}

# coredns: "go install" works on its module as it is (no replace directives).
build_coredns() {
	have coredns "${COREDNS_VERSION}" && return 0
	log "coredns ${COREDNS_VERSION}"
	local gobin=${E2E_CACHE}/src/gobin-coredns-${COREDNS_VERSION}
	mkdir -p "${gobin}"
	GOBIN=${gobin} CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@${COREDNS_VERSION}"
	mv -f "${gobin}/coredns" "${BIN_DIR}/coredns-${COREDNS_VERSION}"
}

# crictl: "go install" works on cri-tools as it is (no replace directives);
# the version it reports is set as cri-tools' Makefile sets it (no "v").
build_crictl() {
	have crictl "${CRICTL_VERSION}" && return 0
	log "crictl ${CRICTL_VERSION}"
	local gobin=${E2E_CACHE}/src/gobin-crictl-${CRICTL_VERSION}
	mkdir -p "${gobin}"
	GOBIN=${gobin} CGO_ENABLED=0 go install -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION#v}" \
		"sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"
	mv -f "${gobin}/crictl" "${BIN_DIR}/crictl-${CRICTL_VERSION}"
}

start=${SECONDS}
build_runc
build_containerd
build_etcd
build_k8s
if ((KIND)); then
	build_coredns
	build_crictl
fi
log "all binaries in ${BIN_DIR} ($((SECONDS - start)) s)"

# link NAME VERSION: DIR/NAME -> the cached binary.
link() {
	[[ -x ${BIN_DIR}/$1-$2 ]] || die "missing binary ${BIN_DIR}/$1-$2"
	ln -sfn "${BIN_DIR}/$1-$2" "${LINK_DIR}/$1"
}
if [[ -n ${LINK_DIR} ]]; then
	mkdir -p "${LINK_DIR}"
	for n in "${K8S_NAMES[@]}"; do
		link "${n}" "${K8S_VERSION}"
	done
	if ((KIND)); then
		for n in "${KIND_K8S_NAMES[@]}"; do
			link "${n}" "${K8S_VERSION}"
		done
		link coredns "${COREDNS_VERSION}"
		link crictl "${CRICTL_VERSION}"
	fi
	link etcd "${ETCD_VERSION}"
	for n in containerd ctr containerd-shim-runc-v2; do
		link "${n}" "${CONTAINERD_VERSION}"
	done
	link runc "${RUNC_VERSION}"
fi
