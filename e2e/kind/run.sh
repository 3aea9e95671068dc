#!/usr/bin/env bash
# Run the e2e suite (go test -tags e2e ./e2e/) against a throw-away kind
# cluster:
#
#   e2e/kind/run.sh [go test flags, e.g. -run TestAllocate]
#
# Creates the cluster from e2e/kind/kind-config.yaml, builds the plugin image
# from the repository's Dockerfile, loads it and the test image into the node,
# runs the suite, and on exit exports kind's logs (when something failed) and
# deletes the cluster. Needs docker (with a running engine), go and kubectl;
# installs kind with "go install" when it is missing. See e2e/kind/README.md.
#
#   KIND_CLUSTER    cluster name (default: cdi-e2e)
#   KIND_REUSE=1    use an existing cluster of that name instead of refusing;
#                   a cluster this script did not create is never deleted
#   KIND_KEEP=1     keep the cluster after the run
#   KIND            kind binary (default: kind from PATH, else
#                   $(go env GOPATH)/bin/kind, installed when missing)
#   E2E_ARTIFACTS   directory for the suite's logs and kind's
#                   (default: _artifacts/kind in the repository)
#   KUBECTL         kubectl binary handed to the suite (default: kubectl)
set -euo pipefail

# Keep in step with the node image in kind-config.yaml: a node image is only
# supported by the kind release that built it.
KIND_VERSION=v0.33.0
PLUGIN_IMAGE=cdi-device-plugin:e2e
TEST_IMAGE=busybox:1.36.1
TEST_IMAGE_REF=docker.io/library/${TEST_IMAGE}

log() { printf '[kind-e2e %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
	printf 'run.sh: %s\n' "$*" >&2
	exit 1
}

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo_root=$(cd -- "${script_dir}/../.." && pwd -P)

cluster=${KIND_CLUSTER:-cdi-e2e}
[[ ${cluster} =~ ^[a-z0-9.-]+$ ]] || die "invalid KIND_CLUSTER '${cluster}' (lower-case letters, digits, '.' and '-')"
node=${cluster}-control-plane
kubectl_bin=${KUBECTL:-kubectl}

artifacts=${E2E_ARTIFACTS:-${repo_root}/_artifacts/kind}
mkdir -p -- "${artifacts}"
# Absolute: go test runs the suite in e2e/, not here.
artifacts=$(cd -- "${artifacts}" && pwd -P)

# State for the exit trap.
created=0 # this run created (or started creating) the cluster: delete it
reused=0  # KIND_REUSE=1 and the cluster existed: export its logs on failure
work_dir=''

# Runs from the EXIT trap (shellcheck before 0.10 takes it for unreachable).
# shellcheck disable=SC2317
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if ((rc != 0 && (created || reused))) && cluster_exists; then
		log "run failed (status ${rc}): exporting kind logs to ${artifacts}/kind-logs"
		"${kind_bin}" export logs "${artifacts}/kind-logs" --name "${cluster}" >&2
	fi
	if ((created)); then
		if [[ ${KIND_KEEP:-} == 1 ]]; then
			log "keeping cluster ${cluster} (KIND_KEEP=1); delete it with: ${kind_bin} delete cluster --name ${cluster}"
		else
			log "deleting cluster ${cluster}"
			"${kind_bin}" delete cluster --name "${cluster}" --kubeconfig "${work_dir}/kubeconfig" >&2
		fi
	fi
	[[ -z ${work_dir} ]] || rm -rf -- "${work_dir}"
	exit "${rc}"
}

cluster_exists() {
	"${kind_bin}" get clusters 2>/dev/null | grep -qxF -- "${cluster}"
}

# find_kind: set kind_bin, installing kind $KIND_VERSION when there is none.
find_kind() {
	local gobin
	if [[ -n ${KIND:-} ]]; then
		kind_bin=${KIND}
		command -v "${kind_bin}" >/dev/null 2>&1 || die "KIND='${KIND}' not found"
	elif command -v kind >/dev/null 2>&1; then
		kind_bin=$(command -v kind)
	else
		gobin=$(go env GOPATH)
		gobin=${gobin%%:*}/bin
		if [[ ! -x ${gobin}/kind ]]; then
			log "installing kind ${KIND_VERSION} into ${gobin}"
			GOBIN=${gobin} go install "sigs.k8s.io/kind@${KIND_VERSION}"
		fi
		kind_bin=${gobin}/kind
	fi
	local version
	version=$("${kind_bin}" version 2>/dev/null || true)
	if [[ ${version} != "kind ${KIND_VERSION} "* ]]; then
		log "warning: ${kind_bin} is '${version:-unknown}', the node image is built for kind ${KIND_VERSION}" \
			"(go install sigs.k8s.io/kind@${KIND_VERSION})"
	fi
}

# load_image IMAGE: copy a local docker image into the node's containerd.
# "kind load docker-image" imports every platform of the saved image and fails
# ("content digest ... not found") when docker's containerd image store holds
# only this host's platform of a multi-platform image; then save that platform
# alone (docker 28+) and load the archive.
load_image() {
	local image=$1 platform archive
	if "${kind_bin}" load docker-image "${image}" --name "${cluster}"; then
		return 0
	fi
	platform=$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')
	archive=${work_dir}/image.tar
	log "retrying ${image} as a ${platform} archive"
	docker image save --platform "${platform}" --output "${archive}" "${image}"
	"${kind_bin}" load image-archive "${archive}" --name "${cluster}"
	rm -f -- "${archive}"
}

main() {
	local tool
	for tool in docker go "${kubectl_bin}"; do
		command -v "${tool}" >/dev/null 2>&1 || die "'${tool}' not found in PATH"
	done
	docker info >/dev/null 2>&1 || die "cannot reach the Docker engine (docker info failed); kind needs one"

	kind_bin=kind
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	find_kind

	work_dir=$(mktemp -d "${TMPDIR:-/tmp}/cdi-kind-e2e.XXXXXX")
	local kubeconfig=${work_dir}/kubeconfig

	if cluster_exists; then
		[[ ${KIND_REUSE:-} == 1 ]] || die "a kind cluster named '${cluster}' already exists; delete it (${kind_bin} delete cluster --name ${cluster}), set KIND_CLUSTER to another name, or set KIND_REUSE=1 to use it"
		log "reusing cluster ${cluster} (KIND_REUSE=1); it will not be deleted"
		reused=1
	else
		# From here on a cluster of that name is ours, even half-created.
		created=1
		log "creating cluster ${cluster}"
		# --kubeconfig keeps the user's kubeconfig untouched; --retain keeps
		# the nodes of a failed creation for the log export (the trap deletes
		# them).
		"${kind_bin}" create cluster --name "${cluster}" --config "${script_dir}/kind-config.yaml" \
			--kubeconfig "${kubeconfig}" --retain --wait 5m
	fi
	"${kind_bin}" get kubeconfig --name "${cluster}" >"${kubeconfig}"
	export KUBECONFIG=${kubeconfig}

	log "building ${PLUGIN_IMAGE}"
	(cd -- "${repo_root}" && docker build -t "${PLUGIN_IMAGE}" .)
	log "loading ${PLUGIN_IMAGE} into ${node}"
	load_image "${PLUGIN_IMAGE}"

	log "pulling ${TEST_IMAGE}"
	docker pull "${TEST_IMAGE}"
	log "loading ${TEST_IMAGE} into ${node}"
	load_image "${TEST_IMAGE}"

	export E2E_PLUGIN_IMAGE=${PLUGIN_IMAGE}
	export E2E_TEST_IMAGE=${TEST_IMAGE_REF}
	export E2E_NODE_SHELL="docker exec -i ${node}"
	export E2E_RESTART_KUBELET="docker exec ${node} systemctl restart kubelet"
	# containerd's default state dir; kind's config.toml does not move it.
	export E2E_RUNTIME_STATE=/run/containerd
	export E2E_ARTIFACTS=${artifacts}
	export KUBECTL=${kubectl_bin}

	log "running the suite (artifacts: ${artifacts})"
	local rc=0
	(cd -- "${repo_root}" && go test -tags e2e -count=1 -timeout 30m -v ./e2e/ "$@") || rc=$?
	if ((rc == 0)); then
		log "suite passed"
	else
		log "suite failed (status ${rc})"
	fi
	exit "${rc}"
}

main "$@"
