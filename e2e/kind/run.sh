#!/usr/bin/env bash
# Run the e2e suite (go test -tags e2e ./e2e/) against a throw-away kind
# cluster:
#
#   e2e/kind/run.sh [go test flags, e.g. -run TestAllocate]
#
# After the suite passed, it runs scenario M2 (TestM2: one node per API) on
# a second cluster of two nodes, <cluster>-m2, created from the same node
# image and config and deleted after it (KIND_M2 below).
#
# One script for two worlds (see e2e/kind/README.md):
# - registry: the pinned kindest/node image of kind-config.yaml, the plugin
#   image built from the repository's Dockerfile, busybox pulled;
# - local (no registry, or KIND_NODE_IMAGE=local): the node image built on this
#   machine by node-image.sh (cached under ~/.cache by the versions it holds),
#   the plugin image made from the host-built binary and the test image from
#   Debian's static busybox, both with e2e/cmd/mkimage.
# It picks the container engine that can run privileged containers: docker
# when its engine answers and can, else podman (installed with apt when
# missing; on hosts without CAP_SYS_RESOURCE with a CONTAINERS_CONF that lowers
# its default ulimits and selects runc). It creates the cluster, loads the
# images, runs the suite, and on exit exports kind's logs (when something
# failed) and deletes the cluster and the network kind made, also after a
# failure or Ctrl-C. Needs go; installs kind with "go install" when missing,
# and (as root, with apt) podman, runc, mmdebstrap and busybox-static when
# they are needed and missing.
#
#   KIND_NODE_IMAGE unset: the pinned image, if the engine has it or can pull
#                   it, else local; "local": build it here; else an image
#                   reference to use (pulled when missing)
#   KIND_ENGINE     docker or podman (default: the first that works, in that order)
#   KIND_CLUSTER    cluster name (default: cdi-e2e)
#   KIND_REUSE=1    use an existing cluster of that name instead of refusing;
#                   a cluster this script did not create is never deleted
#   KIND_KEEP=1     keep the cluster after the run
#   KIND_EXPORT_LOGS=1  export kind's logs also when the run passed
#   KIND_M2         unset: run scenario M2 after the suite when no go test
#                   arguments were given; 1: also after a run with arguments;
#                   0: never; only: M2 alone (no first cluster, no arguments)
#   KIND            kind binary (default: kind ${KIND_VERSION}, installed with
#                   go install into ${E2E_CACHE}/kind/bin when missing)
#   E2E_ARTIFACTS   directory for the suite's logs and kind's
#                   (default: _artifacts/kind in the repository)
#   E2E_CACHE       cache root (default: ~/.cache/cdi-device-plugin-e2e)
#   KUBECTL         kubectl binary handed to the suite (default: kubectl from
#                   PATH, else the one e2e/local/build-binaries.sh builds)
set -euo pipefail

# Keep in step with the node image in kind-config.yaml: a node image is only
# supported by the kind release that built it.
PLUGIN_IMAGE=docker.io/library/cdi-device-plugin:e2e
# Another tag of the same image, for the upgrade scenario's rollout.
PLUGIN_IMAGE_NEXT=docker.io/library/cdi-device-plugin:e2e-next
TEST_IMAGE=docker.io/library/busybox:1.36.1 # registry mode
LOCAL_TEST_IMAGE=e2e.local/busybox:debian   # local mode: Debian's busybox-static
export KIND_VERSION

LOG_TAG=kind-e2e
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
script_dir=${REPO}/e2e/kind
repo_root=${REPO}

cluster=${KIND_CLUSTER:-cdi-e2e}
[[ ${cluster} =~ ^[a-z0-9.-]+$ ]] || die "invalid KIND_CLUSTER '${cluster}' (lower-case letters, digits, '.' and '-')"
node=${cluster}-control-plane
# Scenario M2's cluster: a control plane and a worker, both schedulable.
m2_cluster=${cluster}-m2

artifacts=${E2E_ARTIFACTS:-${repo_root}/_artifacts/kind}
mkdir -p -- "${artifacts}"
# Absolute: go test runs the suite in e2e/, not here.
artifacts=$(cd -- "${artifacts}" && pwd -P)

# State for the exit trap.
created=0     # this run created (or started creating) the cluster: delete it
reused=0      # KIND_REUSE=1 and the cluster existed: export its logs on failure
m2_created=0  # the same two for M2's cluster
m2_reused=0
kept=0        # a cluster was kept (KIND_KEEP=1): keep the network and /lib/modules
made_net=0    # the engine had no "kind" network before this run: remove it
made_mods=0   # this run created the empty /lib/modules kind bind-mounts
probe_ref=''  # the probe image while it exists
work_dir=''
kind_bin=kind
engine=''
node_image='' # set by resolve_node_image, with mode (registry or local)
mode=''
test_image='' # set by make_images

# Runs from the EXIT trap (shellcheck before 0.10 takes it for unreachable).
# shellcheck disable=SC2317
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if ((m2_created || m2_reused)); then
		release_cluster "${m2_cluster}" "${m2_created}" "${rc}" kind-logs-m2
	fi
	if ((created || reused)); then
		release_cluster "${cluster}" "${created}" "${rc}" kind-logs
	fi
	if ((made_net && !kept)); then
		log "removing the ${engine} network kind"
		"${engine}" network rm kind >/dev/null
	fi
	[[ -z ${probe_ref} ]] || "${engine}" rmi "${probe_ref}" >/dev/null 2>&1
	if ((made_mods && !kept)); then
		rmdir /lib/modules 2>/dev/null
	fi
	[[ -z ${work_dir} ]] || rm -rf -- "${work_dir}"
	exit "${rc}"
}

# release_cluster NAME OURS STATUS LOGS: when STATUS is not 0 (or
# KIND_EXPORT_LOGS=1), export the logs of cluster NAME to $artifacts/LOGS;
# then, when this run created it (OURS is 1), delete it, unless KIND_KEEP=1.
release_cluster() {
	local name=$1 ours=$2 rc=$3 logs=${artifacts}/$4
	if [[ ${rc} != 0 || ${KIND_EXPORT_LOGS:-} == 1 ]] && cluster_exists "${name}"; then
		log "status ${rc}: exporting the kind logs of ${name} to ${logs}"
		"${kind_bin}" export logs "${logs}" --name "${name}" >&2
	fi
	((ours)) || return 0
	if [[ ${KIND_KEEP:-} == 1 ]]; then
		log "keeping cluster ${name} (KIND_KEEP=1); delete it with: ${kind_bin} delete cluster --name ${name}"
		kept=1
	else
		log "deleting cluster ${name}"
		# --kubeconfig: the cluster's own file, not the user's.
		"${kind_bin}" delete cluster --name "${name}" --kubeconfig "${work_dir}/kubeconfig-${name}" >&2
	fi
}

# cluster_exists NAME: kind has a cluster NAME.
cluster_exists() {
	"${kind_bin}" get clusters 2>/dev/null | grep -qxF -- "$1"
}

# apt_install PKG...: install Debian packages (root with apt only).
apt_install() {
	if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
		die "missing: $* (install them, or run as root on Debian to have them installed)"
	fi
	log "installing $* with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	if [[ -z ${apt_updated:-} ]]; then
		apt-get update -qq >&2
		apt_updated=1
	fi
	apt-get install -y -qq "$@" >&2
}

# find_kind: set kind_bin: $KIND when set, else kind $KIND_VERSION from the
# cache, installed there with "go install" (module proxy) when missing. A
# kind of another release on PATH is not used: a node image is only supported
# by the kind release that built it.
find_kind() {
	if [[ -n ${KIND:-} ]]; then
		kind_bin=${KIND}
		command -v "${kind_bin}" >/dev/null 2>&1 || die "KIND='${KIND}' not found"
	else
		kind_bin=${E2E_CACHE}/kind/bin/kind-${KIND_VERSION}
		if [[ ! -x ${kind_bin} ]]; then
			log "installing kind ${KIND_VERSION} into ${kind_bin%/*}"
			mkdir -p "${work_dir}/gobin" "${kind_bin%/*}"
			GOBIN=${work_dir}/gobin GOFLAGS=-buildvcs=false go install "sigs.k8s.io/kind@${KIND_VERSION}"
			mv -f "${work_dir}/gobin/kind" "${kind_bin}"
		fi
	fi
	local version
	version=$("${kind_bin}" version 2>/dev/null || true)
	if [[ ${version} != "kind ${KIND_VERSION} "* ]]; then
		log "warning: ${kind_bin} is '${version:-unknown}', the node image is built for kind ${KIND_VERSION}"
	fi
}

# privileged ENGINE: can ENGINE start a privileged container? Tried with an
# image of one static do-nothing program, imported from a tarball (no
# registry needed).
privileged() {
	local e=$1 dir=${work_dir}/probe
	if [[ ! -f ${dir}/probe.tar ]]; then
		mkdir -p "${dir}"
		printf 'package main\n\nfunc main() {}\n' >"${dir}/main.go"
		printf 'module probe\n\ngo 1.22\n' >"${dir}/go.mod"
		(cd "${dir}" && CGO_ENABLED=0 GOOS=linux GOFLAGS=-buildvcs=false go build -ldflags '-s -w' -o true .)
		tar -C "${dir}" -cf "${dir}/probe.tar" true
	fi
	probe_ref=localhost/cdi-e2e-probe:$$
	engine=${e} # for the trap's rmi
	"${e}" import "${dir}/probe.tar" "${probe_ref}" >/dev/null 2>&1 || return 1
	local rc=0
	"${e}" run --rm --privileged "${probe_ref}" /true >"${dir}/out" 2>&1 || rc=$?
	"${e}" rmi "${probe_ref}" >/dev/null 2>&1 || true
	probe_ref=''
	((rc == 0)) || log "${e} cannot start a privileged container: $(tail -n 1 "${dir}/out")"
	return "${rc}"
}

# choose_engine: set engine to docker or podman, the first that can run
# privileged containers (KIND_ENGINE: only that one).
choose_engine() {
	local candidates=()
	case ${KIND_ENGINE:-} in
	docker | podman) candidates=("${KIND_ENGINE}") ;;
	'') candidates=(docker podman) ;;
	*) die "KIND_ENGINE='${KIND_ENGINE}': docker or podman" ;;
	esac
	local e
	for e in "${candidates[@]}"; do
		case ${e} in
		docker)
			if command -v docker >/dev/null && docker info >/dev/null 2>&1 && privileged docker; then
				engine=docker
				return 0
			fi
			[[ ${#candidates[@]} -gt 1 ]] || die "docker cannot run kind's privileged nodes here (docker info, or the probe above, failed)"
			log "docker: no engine answering, or it cannot run privileged containers; trying podman"
			;;
		podman)
			if ! command -v podman >/dev/null; then
				apt_install podman runc
			fi
			privileged podman && { engine=podman; return 0; }
			# Rootful podman raises the containers' nofile/nproc hard limits,
			# which needs CAP_SYS_RESOURCE; conmon's hard NPROC is 32768.
			# Debian's crun also refuses hybrid cgroup v1 hosts: use runc.
			# Kept in the cache, for podman commands on a KIND_KEEP=1 cluster.
			local conf=${E2E_CACHE}/kind/containers.conf
			mkdir -p "${conf%/*}"
			{
				printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
				if command -v runc >/dev/null; then printf '[engine]\nruntime = "runc"\n'; fi
			} >"${conf}.tmp.$$"
			mv -f "${conf}.tmp.$$" "${conf}"
			export CONTAINERS_CONF=${conf}
			log "retrying podman with CONTAINERS_CONF=${conf} (lower default ulimits, runc)"
			privileged podman && { engine=podman; return 0; }
			die "podman cannot run privileged containers here either"
			;;
		esac
	done
}

# resolve_node_image: set node_image and mode (registry or local).
resolve_node_image() {
	local pinned
	pinned=$(sed -n 's/^[[:space:]]*image:[[:space:]]*//p' "${script_dir}/kind-config.yaml")
	[[ -n ${pinned} ]] || die "no node image in ${script_dir}/kind-config.yaml"
	case ${KIND_NODE_IMAGE:-} in
	local)
		mode=local
		;;
	'')
		if have_or_pull "${pinned}"; then
			mode=registry node_image=${pinned}
		else
			log "cannot pull ${pinned}: building the node and the suite's images locally"
			mode=local
		fi
		;;
	*)
		have_or_pull "${KIND_NODE_IMAGE}" || die "cannot pull KIND_NODE_IMAGE=${KIND_NODE_IMAGE}"
		mode=registry node_image=${KIND_NODE_IMAGE}
		;;
	esac
	if [[ ${mode} == local ]]; then
		local pkgs=()
		command -v mmdebstrap >/dev/null || pkgs+=(mmdebstrap)
		if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then pkgs+=(busybox-static); fi
		[[ ${#pkgs[@]} -eq 0 ]] || apt_install "${pkgs[@]}"
		node_image=$("${script_dir}/node-image.sh" "${engine}")
	fi
}

# have_or_pull REF: the engine has the image, or pulls it.
have_or_pull() {
	local ref=$1
	"${engine}" image inspect "${ref}" >/dev/null 2>&1 && return 0
	if [[ ${engine} == podman ]]; then
		# podman wants a fully qualified name, and no tag beside a digest.
		[[ ${ref%%/*} == *[.:]* || ${ref%%/*} == localhost ]] || ref=docker.io/${ref}
		[[ ${ref} != *@sha256:* ]] || ref=${ref%%:*@sha256:*}@${ref#*@}
	fi
	log "pulling ${ref}"
	timeout 600 "${engine}" pull "${ref}" >&2
}

# kind_config NAME WORKERS: the effective config of cluster NAME, with
# WORKERS worker nodes after the control plane, in the work directory; prints
# its path.
kind_config() {
	local out=${work_dir}/kind-config-$1.yaml workers=$2 cgroup gates
	# The node image on the control plane's image line, and after it each
	# worker, with the same image, as an item of the same nodes list.
	awk -v img="${node_image}" -v workers="${workers}" '
		!done && match($0, /^[[:space:]]*image:/) {
			ind = substr($0, 1, RLENGTH - length("image:"))
			print ind "image: " img
			for (i = 0; i < workers; i++) {
				print substr(ind, 3) "- role: worker # added by run.sh"
				print ind "image: " img
			}
			done = 1
			next
		}
		{ print }' "${script_dir}/kind-config.yaml" >"${out}"
	grep -q '^featureGates:' "${out}" && die "kind-config.yaml has featureGates: set FEATURE_GATES_<major>_<minor> in e2e/versions.env instead"
	gates=$(feature_gates_yaml "  ") || exit 1
	cat >>"${out}" <<EOF
# Added by run.sh: FEATURE_GATES of e2e/versions.env, which kind hands to the
# API server, controller manager, scheduler, kubelet and kube-proxy (the
# local node's components get the same, from e2e/local/cluster.sh).
featureGates:
${gates}
EOF
	if [[ ${mode} == local ]]; then
		grep -q '^networking:' "${out}" && die "kind-config.yaml has a networking section: merge disableDefaultCNI by hand"
		cat >>"${out}" <<'EOF'
# Added by run.sh for the locally built node image: it has no kindnetd image
# but a bridge CNI config for the node's pod subnet.
networking:
  disableDefaultCNI: true
EOF
	fi
	if [[ ${engine} == docker ]]; then
		cgroup=$(docker info --format '{{.CgroupVersion}}' 2>/dev/null || true)
	else
		cgroup=$(podman info --format '{{.Host.CgroupsVersion}}' 2>/dev/null || true)
	fi
	if [[ ${cgroup#v} == 1 ]]; then
		grep -q '^kubeadmConfigPatches:' "${out}" && die "kind-config.yaml has kubeadmConfigPatches: merge failCgroupV1 by hand"
		cat >>"${out}" <<'EOF'
# Added by run.sh: the engine's host runs cgroup v1, which the kubelet refuses
# from v1.35 on unless told otherwise.
kubeadmConfigPatches:
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
EOF
	fi
	printf '%s\n' "${out}"
}

# load_archive NAME TAR: copy an image archive into the containerd of every
# node of cluster NAME.
load_archive() {
	"${kind_bin}" load image-archive "$2" --name "$1"
}

# load_image NAME IMAGE: copy an image of the engine into the nodes of
# cluster NAME.
# "kind load docker-image" calls docker whatever the provider, and with docker
# imports every platform of the saved image and fails ("content digest ...
# not found") when docker's containerd image store holds only this host's
# platform of a multi-platform image; then save that platform alone (docker
# 28+) and load the archive.
load_image() {
	local name=$1 image=$2 archive=${work_dir}/image.tar platform
	if [[ ${engine} == podman ]]; then
		podman save --format docker-archive --output "${archive}" "${image}" >/dev/null
	elif "${kind_bin}" load docker-image "${image}" --name "${name}"; then
		return 0
	else
		platform=$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')
		log "retrying ${image} as a ${platform} archive"
		docker image save --platform "${platform}" --output "${archive}" "${image}"
	fi
	load_archive "${name}" "${archive}"
	rm -f -- "${archive}"
}

# make_images: build the plugin and test images (registry: in the engine;
# local: as archives in the work directory) and set test_image.
make_images() {
	if [[ ${mode} == registry ]]; then
		log "building ${PLUGIN_IMAGE}"
		(cd -- "${repo_root}" && "${engine}" build -t "${PLUGIN_IMAGE}" .)
		have_or_pull "${TEST_IMAGE}"
		test_image=${TEST_IMAGE}
		return 0
	fi
	# What the Dockerfile's image holds (the static binaries at
	# /cdi-device-plugin, the entrypoint, /cdi-dra-driver and
	# /cdi-dra-controller, run as root),
	# from the binaries built here; busybox
	# from Debian's static build, one symlink per applet.
	local dir=${work_dir}/images applets=() a
	mkdir -p "${dir}"
	log "making ${PLUGIN_IMAGE} and ${LOCAL_TEST_IMAGE}"
	(cd -- "${repo_root}" && CGO_ENABLED=0 go build -trimpath -o "${dir}/mkimage" ./e2e/cmd/mkimage)
	(cd -- "${repo_root}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=e2e" \
		-o "${dir}/" ./cmd/cdi-device-plugin ./cmd/cdi-dra-driver ./cmd/cdi-dra-controller)
	"${dir}/mkimage" -o "${dir}/plugin.tar" -tag "${PLUGIN_IMAGE}" \
		-file /cdi-device-plugin="${dir}/cdi-device-plugin" -file /cdi-dra-driver="${dir}/cdi-dra-driver" \
		-file /cdi-dra-controller="${dir}/cdi-dra-controller" \
		-entrypoint /cdi-device-plugin -user 0:0
	for a in $(/bin/busybox --list); do
		[[ ${a} == busybox ]] || applets+=(-symlink "/bin/${a}=busybox")
	done
	"${dir}/mkimage" -o "${dir}/busybox.tar" -tag "${LOCAL_TEST_IMAGE}" -file /bin/busybox=/bin/busybox \
		"${applets[@]}" -env PATH=/bin -cmd /bin/sh
	test_image=${LOCAL_TEST_IMAGE}
}

# load_images NAME: load what make_images made into the nodes of cluster
# NAME.
load_images() {
	if [[ ${mode} == registry ]]; then
		load_image "$1" "${PLUGIN_IMAGE}"
		load_image "$1" "${TEST_IMAGE}"
	else
		load_archive "$1" "${work_dir}/images/plugin.tar"
		load_archive "$1" "${work_dir}/images/busybox.tar"
	fi
}

# next_tag: the plugin image under a second tag in the node's containerd,
# which the upgrade scenario (11) rolls the DaemonSet to.
next_tag() {
	"${engine}" exec "${node}" ctr -n k8s.io images tag --force "${PLUGIN_IMAGE}" "${PLUGIN_IMAGE_NEXT}" >/dev/null
}

# host_plugin: the plugin binary built here, copied into the node for the
# suite's host mode (node-hooks.sh plugin-host).
host_plugin() {
	local bin=${work_dir}/host-plugin/cdi-device-plugin
	mkdir -p "${bin%/*}"
	(cd -- "${repo_root}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=e2e" \
		-o "${bin}" ./cmd/cdi-device-plugin)
	"${engine}" cp "${bin}" "${node}:/usr/local/bin/cdi-device-plugin-e2e"
}

# create_cluster NAME CONFIG: create kind cluster NAME from the effective
# CONFIG (kind_config), its kubeconfig in the work directory. The caller marks
# the cluster as its own first: from then on it is deleted on exit, even
# half-created.
create_cluster() {
	local name=$1 config=$2
	# kind bind-mounts /lib/modules, which a kernel without modules lacks.
	if [[ ! -e /lib/modules && $(id -u) == 0 ]]; then
		mkdir /lib/modules
		made_mods=1
	fi
	"${engine}" network inspect kind >/dev/null 2>&1 || made_net=1
	log "creating cluster ${name}"
	# --kubeconfig keeps the user's kubeconfig untouched; --retain keeps
	# the nodes of a failed creation for the log export (the trap deletes
	# them).
	"${kind_bin}" create cluster --name "${name}" --config "${config}" \
		--kubeconfig "${work_dir}/kubeconfig-${name}" --retain --wait 5m
}

# suite_env NODE KUBECONFIG: the suite's variables for the cluster of
# KUBECONFIG whose node-side checks go to the node container NODE.
suite_env() {
	export KUBECONFIG=$2
	export E2E_PLUGIN_IMAGE=${PLUGIN_IMAGE}
	export E2E_TEST_IMAGE=${test_image}
	export E2E_NODE_SHELL="${engine} exec -i $1"
	# The node container's root from here: the kubelet's PodResources
	# socket, for the real-hardware scenario's topology check.
	E2E_NODE_ROOT=/proc/$("${engine}" inspect -f '{{.State.Pid}}' "$1")/root
	export E2E_NODE_ROOT
	export E2E_RESTART_KUBELET="${engine} exec $1 systemctl restart kubelet"
	# containerd's default state dir; kind's config.toml does not move it.
	export E2E_RUNTIME_STATE=/run/containerd
	export E2E_ARTIFACTS=${artifacts}
	export KUBECTL=${kubectl_bin}
}

# first_suite [GO TEST ARGS...]: the suite on the one-node cluster (created,
# or reused with KIND_REUSE=1); its status in rc.
first_suite() {
	local kubeconfig=${work_dir}/kubeconfig-${cluster}
	if cluster_exists "${cluster}"; then
		[[ ${KIND_REUSE:-} == 1 ]] || die "a kind cluster named '${cluster}' already exists; delete it (${kind_bin} delete cluster --name ${cluster}), set KIND_CLUSTER to another name, or set KIND_REUSE=1 to use it"
		log "reusing cluster ${cluster} (KIND_REUSE=1); it will not be deleted"
		reused=1
		# Only to know how to make the suite's images.
		if [[ ${KIND_NODE_IMAGE:-} == local ]] || ! have_or_pull "$(sed -n 's/^[[:space:]]*image:[[:space:]]*//p' "${script_dir}/kind-config.yaml")"; then
			mode=local
		else
			mode=registry
		fi
	else
		resolve_node_image
		log "node image: ${node_image} (${mode}; ready after $((SECONDS - t0)) s)"
		local config
		config=$(kind_config "${cluster}" 0)
		# From here on a cluster of that name is ours, even half-created.
		created=1
		create_cluster "${cluster}" "${config}"
	fi
	"${kind_bin}" get kubeconfig --name "${cluster}" >"${kubeconfig}"

	make_images
	load_images "${cluster}"
	next_tag
	host_plugin

	suite_env "${node}" "${kubeconfig}"
	export E2E_PLUGIN_IMAGE_NEXT=${PLUGIN_IMAGE_NEXT}
	# Host mode (scenario 10): the plugin as a process of the node, which is
	# the kubelet's host; the reboot is simulated inside the node.
	export E2E_PLUGIN_HOST="${script_dir}/node-hooks.sh ${engine} ${node} plugin-host"
	export E2E_REBOOT="${script_dir}/node-hooks.sh ${engine} ${node} simulate-reboot"

	log "cluster ready after $((SECONDS - t0)) s"
	run_suite "" "$@" || rc=$?
}

# m2_suite: scenario M2 (TestM2) alone, with E2E_M2=1, on a cluster of its
# own: a control plane and a worker, both schedulable, from the same node
# image, config (feature gates, CDI in containerd) and images as the first
# (created, or reused with KIND_REUSE=1); its status in rc. The exit trap
# deletes it, after exporting its logs when something failed.
m2_suite() {
	local t1=${SECONDS} kubeconfig=${work_dir}/kubeconfig-${m2_cluster} cp=${m2_cluster}-control-plane
	[[ -n ${node_image} ]] || resolve_node_image
	[[ -n ${test_image} ]] || make_images
	if cluster_exists "${m2_cluster}"; then
		[[ ${KIND_REUSE:-} == 1 ]] || die "a kind cluster named '${m2_cluster}' already exists; delete it (${kind_bin} delete cluster --name ${m2_cluster}), set KIND_CLUSTER to another name, or set KIND_REUSE=1 to use it"
		log "reusing cluster ${m2_cluster} (KIND_REUSE=1); it will not be deleted"
		m2_reused=1
	else
		local config
		config=$(kind_config "${m2_cluster}" 1)
		m2_created=1
		create_cluster "${m2_cluster}" "${config}"
	fi
	"${kind_bin}" get kubeconfig --name "${m2_cluster}" >"${kubeconfig}"
	# kind taints the control plane of a cluster with workers: M2 puts a
	# pod on each node.
	if "${kubectl_bin}" --kubeconfig "${kubeconfig}" get node "${cp}" -o jsonpath='{.spec.taints[*].key}' |
		grep -qw node-role.kubernetes.io/control-plane; then
		"${kubectl_bin}" --kubeconfig "${kubeconfig}" taint node "${cp}" node-role.kubernetes.io/control-plane:NoSchedule- >&2
	fi
	# kind --wait waits for the control plane only.
	"${kubectl_bin}" --kubeconfig "${kubeconfig}" wait --for=condition=Ready node --all --timeout=3m >&2
	load_images "${m2_cluster}"

	suite_env "${cp}" "${kubeconfig}"
	# Neither host mode nor the upgrade: only TestM2 runs here.
	unset E2E_PLUGIN_IMAGE_NEXT E2E_PLUGIN_HOST E2E_REBOOT
	export E2E_M2=1
	log "cluster ${m2_cluster} ready after $((SECONDS - t1)) s"
	E2E_TIMEOUT=10m run_suite "" -run '^TestM2$' || rc=$?
	log "M2: $((SECONDS - t1)) s, its cluster's deletion not included"
}

main() {
	command -v go >/dev/null 2>&1 || die "'go' not found in PATH"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	# t0, kubectl_bin and rc are read and set by the functions main calls.
	local t0=${SECONDS} rc=0 m2=${KIND_M2:-}
	if [[ -z ${m2} ]]; then
		m2=1
		(($# == 0)) || m2=0
	fi
	case ${m2} in
	0 | 1) ;;
	only) (($# == 0)) || die "KIND_M2=only runs scenario M2 alone and takes no go test arguments" ;;
	*) die "KIND_M2='${m2}': 0, 1 or only" ;;
	esac
	work_dir=$(mktemp -d "${TMPDIR:-/tmp}/cdi-kind-e2e.XXXXXX")

	choose_engine
	export KIND_EXPERIMENTAL_PROVIDER=${engine}
	log "engine: ${engine}${CONTAINERS_CONF:+ (CONTAINERS_CONF=${CONTAINERS_CONF})}"
	find_kind

	local kubectl_bin=${KUBECTL:-}
	if [[ -z ${kubectl_bin} ]]; then
		if command -v kubectl >/dev/null 2>&1; then
			kubectl_bin=kubectl
		else
			"${repo_root}/e2e/local/build-binaries.sh" --link "${work_dir}/bin"
			kubectl_bin=${work_dir}/bin/kubectl
		fi
	fi
	command -v "${kubectl_bin}" >/dev/null 2>&1 || die "KUBECTL='${kubectl_bin}' not found"

	# Not "cond || first_suite": set -e would be off inside it.
	if [[ ${m2} != only ]]; then
		first_suite "$@"
	fi
	if ((rc == 0)) && [[ ${m2} != 0 ]]; then
		# Done with the first cluster: delete it before M2's two nodes
		# start, rather than have them share the machine.
		if ((created || reused)); then
			release_cluster "${cluster}" "${created}" 0 kind-logs
			created=0 reused=0
		fi
		m2_suite
	fi
	log "$((SECONDS - t0)) s in all"
	exit "${rc}"
}

main "$@"
