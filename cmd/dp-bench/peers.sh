#!/usr/bin/env bash
# Build the peer device plugins that `make bench` runs next to ours, from
# the Go module proxy at pinned versions, once, into a cache outside the
# repository keyed by version:
#
#   ${BENCH_CACHE}/bin/<name>-<version>   (BENCH_CACHE defaults to ~/.cache/cdi-device-plugin-bench)
#
# - sample-device-plugin: the kubelet's own sample plugin,
#   k8s.io/kubernetes/test/images/sample-device-plugin, built like the e2e
#   components (e2e/local/build-binaries.sh): a wrapper module that requires
#   k8s.io/kubernetes with a replace line per staging module.
# - generic-device-plugin: github.com/squat/generic-device-plugin at a
#   pinned pseudo-version. If the module proxy refuses it, this says so and
#   goes on; `make bench` then runs without it (or with SQUAT_BIN).
# - dra-example-kubeletplugin: the kubelet plugin of
#   sigs.k8s.io/dra-example-driver at DRA_EXAMPLE_VERSION, the DRA peer of
#   cdi-dra-driver; built from its own go.mod (a wrapper module that
#   requires it). Refused by the module proxy: said, and skipped.
#
# With names (sample-device-plugin, generic-device-plugin,
# dra-example-kubeletplugin), builds only those. Prints "name=path" for
# every binary it has on stdout, progress on stderr.
set -euo pipefail
LOG_TAG=peers
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../../e2e/lib.sh"
BENCH_CACHE=${BENCH_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/cdi-device-plugin-bench}
BIN_DIR=${BENCH_CACHE}/bin

mkdir -p "${BIN_DIR}" "${BENCH_CACHE}/src"

build_sample() {
	local out=${BIN_DIR}/sample-device-plugin-${K8S_VERSION}
	[[ -x ${out} ]] && return 0
	local dir=${BENCH_CACHE}/src/sample-device-plugin-${K8S_VERSION}
	log "sample-device-plugin ${K8S_VERSION}"
	k8s_wrapper "${dir}" bench.local/wrapper "$(printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/test/images/sample-device-plugin"\n')"
	k8s_build "${dir}" k8s.io/kubernetes/test/images/sample-device-plugin "${out}"
}

build_squat() {
	local out=${BIN_DIR}/generic-device-plugin-${SQUAT_VERSION}
	[[ -x ${out} ]] && return 0
	local dir=${BENCH_CACHE}/src/generic-device-plugin-${SQUAT_VERSION}
	log "generic-device-plugin ${SQUAT_VERSION}"
	mkdir -p "${dir}"
	printf 'module bench.local/wrapper\n\ngo 1.26\n' >"${dir}/go.mod"
	if ! (cd "${dir}" && go get "github.com/squat/generic-device-plugin@${SQUAT_VERSION}" >&2); then
		log "generic-device-plugin ${SQUAT_VERSION}: not available from the module proxy; benchmarking without it (set SQUAT_BIN to a binary to include it)"
		return 0
	fi
	(cd "${dir}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${out}.tmp" github.com/squat/generic-device-plugin)
	mv -f "${out}.tmp" "${out}"
}

build_dra_example() {
	local out=${BIN_DIR}/dra-example-kubeletplugin-${DRA_EXAMPLE_VERSION}
	[[ -x ${out} ]] && return 0
	local dir=${BENCH_CACHE}/src/dra-example-driver-${DRA_EXAMPLE_VERSION}
	log "dra-example-kubeletplugin ${DRA_EXAMPLE_VERSION}"
	mkdir -p "${dir}"
	printf 'module bench.local/wrapper\n\ngo 1.26\n' >"${dir}/go.mod"
	if ! (cd "${dir}" && go get "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin@${DRA_EXAMPLE_VERSION}" >&2); then
		log "dra-example-driver ${DRA_EXAMPLE_VERSION}: not available from the module proxy; benchmarking without it (set DRA_EXAMPLE_BIN to a binary to include it)"
		return 0
	fi
	(cd "${dir}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${out}.tmp" sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin)
	mv -f "${out}.tmp" "${out}"
}

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(sample-device-plugin generic-device-plugin dra-example-kubeletplugin)
for n in "${names[@]}"; do
	case ${n} in
	sample-device-plugin) build_sample ;;
	generic-device-plugin) build_squat ;;
	dra-example-kubeletplugin) build_dra_example ;;
	*) die "unknown peer ${n} (sample-device-plugin, generic-device-plugin, dra-example-kubeletplugin)" ;;
	esac
done
for f in "${BIN_DIR}/sample-device-plugin-${K8S_VERSION}" "${BIN_DIR}/generic-device-plugin-${SQUAT_VERSION}" \
	"${BIN_DIR}/dra-example-kubeletplugin-${DRA_EXAMPLE_VERSION}"; do
	[[ -x ${f} ]] || continue
	n=$(basename "${f}")
	printf '%s=%s\n' "${n%%-v*}" "${f}"
done
