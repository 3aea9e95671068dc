#!/usr/bin/env bash
# Run the e2e suite (go test -tags e2e ./e2e/) against a throw-away kind
# cluster:
#
#   e2e/kind/run.sh [go test flags, e.g. -run TestAllocate]
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

artifacts=${E2E_ARTIFACTS:-${repo_root}/_artifacts/kind}
mkdir -p -- "${artifacts}"
# Absolute: go test runs the suite in e2e/, not here.
artifacts=$(cd -- "${artifacts}" && pwd -P)

# State for the exit trap.
created=0     # this run created (or started creating) the cluster: delete it
reused=0      # KIND_REUSE=1 and the cluster existed: export its logs on failure
made_net=0    # the engine had no "kind" network before this run: remove it
made_mods=0   # this run created the empty /lib/modules kind bind-mounts
probe_ref=''  # the probe image while it exists
work_dir=''
kind_bin=kind
engine=''

# Runs from the EXIT trap (shellcheck before 0.10 takes it for unreachable).
# shellcheck disable=SC2317
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if ((created || reused)) && [[ ${rc} != 0 || ${KIND_EXPORT_LOGS:-} == 1 ]] && cluster_exists; then
		log "run ended (status ${rc}): exporting kind logs to ${artifacts}/kind-logs"
		"${kind_bin}" export logs "${artifacts}/kind-logs" --name "${cluster}" >&2
	fi
	if ((created)); then
		if [[ ${KIND_KEEP:-} == 1 ]]; then
			log "keeping cluster ${cluster} (KIND_KEEP=1); delete it with: ${kind_bin} delete cluster --name ${cluster}"
		else
			log "deleting cluster ${cluster}"
			"${kind_bin}" delete cluster --name "${cluster}" --kubeconfig "${work_dir}/kubeconfig" >&2
			if ((made_net)); then
				log "removing the ${engine} network kind"
				"${engine}" network rm kind >/dev/null
			fi
		fi
	fi
	[[ -z ${probe_ref} ]] || "${engine}" rmi "${probe_ref}" >/dev/null 2>&1
	if ((made_mods)) && ! [[ ${KIND_KEEP:-} == 1 && ${created} == 1 ]]; then
		rmdir /lib/modules 2>/dev/null
	fi
	[[ -z ${work_dir} ]] || rm -rf -- "${work_dir}"
	exit "${rc}"
}

cluster_exists() {
	"${kind_bin}" get clusters 2>/dev/null | grep -qxF -- "${cluster}"
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

# kind_config: the effective cluster config in the work directory.
kind_config() {
	local out=${work_dir}/kind-config.yaml cgroup gates
	sed "s#^\([[:space:]]*image:[[:space:]]*\).*#\1${node_image}#" "${script_dir}/kind-config.yaml" >"${out}"
	grep -q '^featureGates:' "${out}" && die "kind-config.yaml has featureGates: set FEATURE_GATES in e2e/versions.env instead"
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

# load_archive TAR: copy an image archive into the node's containerd.
load_archive() {
	"${kind_bin}" load image-archive "$1" --name "${cluster}"
}

# load_image IMAGE: copy an image of the engine into the node's containerd.
# "kind load docker-image" calls docker whatever the provider, and with docker
# imports every platform of the saved image and fails ("content digest ...
# not found") when docker's containerd image store holds only this host's
# platform of a multi-platform image; then save that platform alone (docker
# 28+) and load the archive.
load_image() {
	local image=$1 archive=${work_dir}/image.tar platform
	if [[ ${engine} == podman ]]; then
		podman save --format docker-archive --output "${archive}" "${image}" >/dev/null
	elif "${kind_bin}" load docker-image "${image}" --name "${cluster}"; then
		return 0
	else
		platform=$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')
		log "retrying ${image} as a ${platform} archive"
		docker image save --platform "${platform}" --output "${archive}" "${image}"
	fi
	load_archive "${archive}"
	rm -f -- "${archive}"
}

# suite_images: build the plugin and test images and load them into the node.
suite_images() {
	if [[ ${mode} == registry ]]; then
		log "building ${PLUGIN_IMAGE}"
		(cd -- "${repo_root}" && "${engine}" build -t "${PLUGIN_IMAGE}" .)
		load_image "${PLUGIN_IMAGE}"
		have_or_pull "${TEST_IMAGE}"
		load_image "${TEST_IMAGE}"
		test_image=${TEST_IMAGE}
		return 0
	fi
	# What the Dockerfile's image holds (the static binaries at
	# /cdi-device-plugin, the entrypoint, and /cdi-dra-driver, run as root),
	# from the binaries built here; busybox
	# from Debian's static build, one symlink per applet.
	local dir=${work_dir}/images applets=() a
	mkdir -p "${dir}"
	log "making ${PLUGIN_IMAGE} and ${LOCAL_TEST_IMAGE}"
	(cd -- "${repo_root}" && CGO_ENABLED=0 go build -trimpath -o "${dir}/mkimage" ./e2e/cmd/mkimage)
	(cd -- "${repo_root}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=e2e" \
		-o "${dir}/" ./cmd/cdi-device-plugin ./cmd/cdi-dra-driver)
	"${dir}/mkimage" -o "${dir}/plugin.tar" -tag "${PLUGIN_IMAGE}" \
		-file /cdi-device-plugin="${dir}/cdi-device-plugin" -file /cdi-dra-driver="${dir}/cdi-dra-driver" \
		-entrypoint /cdi-device-plugin -user 0:0
	for a in $(/bin/busybox --list); do
		[[ ${a} == busybox ]] || applets+=(-symlink "/bin/${a}=busybox")
	done
	"${dir}/mkimage" -o "${dir}/busybox.tar" -tag "${LOCAL_TEST_IMAGE}" -file /bin/busybox=/bin/busybox \
		"${applets[@]}" -env PATH=/bin -cmd /bin/sh
	load_archive "${dir}/plugin.tar"
	load_archive "${dir}/busybox.tar"
	test_image=${LOCAL_TEST_IMAGE}
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

main() {
	command -v go >/dev/null 2>&1 || die "'go' not found in PATH"
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	local t0=${SECONDS}
	work_dir=$(mktemp -d "${TMPDIR:-/tmp}/cdi-kind-e2e.XXXXXX")
	local kubeconfig=${work_dir}/kubeconfig

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

	if cluster_exists; then
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
		config=$(kind_config)
		# kind bind-mounts /lib/modules, which a kernel without modules lacks.
		if [[ ! -e /lib/modules && $(id -u) == 0 ]]; then
			mkdir /lib/modules
			made_mods=1
		fi
		"${engine}" network inspect kind >/dev/null 2>&1 || made_net=1
		# From here on a cluster of that name is ours, even half-created.
		created=1
		log "creating cluster ${cluster}"
		# --kubeconfig keeps the user's kubeconfig untouched; --retain keeps
		# the nodes of a failed creation for the log export (the trap deletes
		# them).
		"${kind_bin}" create cluster --name "${cluster}" --config "${config}" \
			--kubeconfig "${kubeconfig}" --retain --wait 5m
	fi
	"${kind_bin}" get kubeconfig --name "${cluster}" >"${kubeconfig}"
	export KUBECONFIG=${kubeconfig}

	suite_images
	next_tag
	host_plugin

	export E2E_PLUGIN_IMAGE=${PLUGIN_IMAGE}
	export E2E_PLUGIN_IMAGE_NEXT=${PLUGIN_IMAGE_NEXT}
	export E2E_TEST_IMAGE=${test_image}
	export E2E_NODE_SHELL="${engine} exec -i ${node}"
	export E2E_RESTART_KUBELET="${engine} exec ${node} systemctl restart kubelet"
	# containerd's default state dir; kind's config.toml does not move it.
	export E2E_RUNTIME_STATE=/run/containerd
	# Host mode (scenario 10): the plugin as a process of the node, which is
	# the kubelet's host; the reboot is simulated inside the node.
	export E2E_PLUGIN_HOST="${script_dir}/node-hooks.sh ${engine} ${node} plugin-host"
	export E2E_REBOOT="${script_dir}/node-hooks.sh ${engine} ${node} simulate-reboot"
	export E2E_ARTIFACTS=${artifacts}
	export KUBECTL=${kubectl_bin}

	log "cluster ready after $((SECONDS - t0)) s"
	local rc=0
	run_suite "" "$@" || rc=$?
	log "$((SECONDS - t0)) s in all"
	exit "${rc}"
}

main "$@"
