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
#                are named in this file only
#   --kind       also build what a kind node image needs beside those:
#                kubeadm and kube-proxy (same Kubernetes version), coredns and
#                crictl (e2e/kind/node-image.sh)
#   --versions   print the versions as shell assignments and exit
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
# The CoreDNS that kubeadm ${K8S_VERSION} deploys (kubeadm config images list);
# only for the kind node image.
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.2}
# crictl from the cri-tools release of the same Kubernetes minor; only for the
# kind node image ("kind export logs" runs it in the node).
CRICTL_VERSION=${CRICTL_VERSION:-v1.36.0}
E2E_CACHE=${E2E_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/cdi-device-plugin-e2e}
BIN_DIR=${E2E_CACHE}/bin
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

log() { printf '[build %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'build-binaries.sh: %s\n' "$*" >&2; exit 1; }

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
	local dir=${E2E_CACHE}/src/kubernetes-${K8S_VERSION} gomod minor
	log "kubernetes ${K8S_VERSION}: ${missing[*]}"
	# A wrapper made before tools.go listed every command: add them.
	if [[ -f ${dir}/.ready ]] && ! cmp -s <(k8s_tools_go) "${dir}/tools.go"; then
		rm -f "${dir}/.ready"
		k8s_tools_go >"${dir}/tools.go"
		(cd "${dir}" && go mod tidy >&2)
		touch "${dir}/.ready"
	fi
	if [[ ! -f ${dir}/.ready ]]; then
		rm -rf "${dir}"
		mkdir -p "${dir}"
		printf 'module e2e.local/wrapper\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n' "${K8S_VERSION}" >"${dir}/go.mod"
		gomod=$(cd "${dir}" && go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
		[[ -f ${gomod} ]] || die "go.mod of k8s.io/kubernetes@${K8S_VERSION} not found"
		# Every staging module k8s.io/X => ./staging/... becomes k8s.io/X v0.<minor>.<patch>.
		local staging=v0.${K8S_VERSION#v1.}
		awk -v v="${staging}" '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// { print "replace " $1 " => " $1 " " v }' "${gomod}" >>"${dir}/go.mod"
		grep -q '^replace k8s.io/api ' "${dir}/go.mod" || die "no staging replaces found in ${gomod}"
		k8s_tools_go >"${dir}/tools.go"
		(cd "${dir}" && go mod tidy >&2)
		touch "${dir}/.ready"
	fi
	minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local ld="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
	ld+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
	for n in "${missing[@]}"; do
		log "  go build ${n}"
		(cd "${dir}" && CGO_ENABLED=0 go build -trimpath -ldflags "${ld}" -o "${BIN_DIR}/.${n}-${K8S_VERSION}.tmp" "k8s.io/kubernetes/cmd/${n}")
		mv -f "${BIN_DIR}/.${n}-${K8S_VERSION}.tmp" "${BIN_DIR}/${n}-${K8S_VERSION}"
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
