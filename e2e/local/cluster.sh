#!/usr/bin/env bash
# A local single-node Kubernetes cluster from real components, for the e2e
# suite and `make demo`: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, containerd (CDI on) and runc, started as plain
# processes on this machine, as Kubernetes' hack/local-up-cluster.sh does.
# No Docker engine, no registry: the pause, test and plugin images are built
# locally as tarballs and imported into containerd.
#
#   e2e/local/cluster.sh up               build what is missing, start everything, wait for the node
#   e2e/local/cluster.sh check            only the checks up makes before it touches anything
#   e2e/local/cluster.sh down             stop everything up made and clean up (also after a failed run)
#   e2e/local/cluster.sh restart-kubelet  stop and start the kubelet (e2e scenario "kubelet restart")
#   e2e/local/cluster.sh plugin-host start VAR=VALUE... | stop
#                                         the plugin binary as a host process, run as systemd would run
#                                         deploy/systemd/cdi-device-plugin.service: its Environment=, then
#                                         its env file (deploy/systemd's example with VAR=VALUE... appended),
#                                         its ExecStart, its CapabilityBoundingSet and NoNewPrivileges
#   e2e/local/cluster.sh unit-command ENVFILE
#                                         print that command, one word a line (for its test)
#   e2e/local/cluster.sh simulate-reboot  what a node reboot does: everything stops, mounts, network
#                                         namespaces, containerd's state and the tmpfs /var/run/cdi and
#                                         simulated /dev nodes are gone; then the host plugin (if it ran),
#                                         containerd and the kubelet start again, in that order
#   e2e/local/cluster.sh env              print the variables the e2e suite needs (after up)
#   e2e/local/cluster.sh logs [N]         print the last N (default 200) lines of every component log
#
# Every component runs with the feature gates FEATURE_GATES of
# e2e/versions.env (the kubelet through its KubeletConfiguration).
#
# Needs root, Linux with cgroup v1 or v2, and Debian's libseccomp-dev,
# pkg-config, containernetworking-plugins and busybox-static (.ci/run installs
# them). Everything lives under E2E_WORK (default /var/lib/cdi-device-plugin-e2e)
# except what the kubelet and CNI insist on: /var/lib/kubelet, /var/log/pods,
# /var/log/containers, /etc/cni/net.d/10-e2e.conflist, /var/lib/cni/networks/e2e,
# the e2e0 bridge and the cgroup ${CGROUP_ROOT}; "down" removes all of them,
# and the plugins' leftovers: their CDI specs, simulated device nodes and
# state, and the DRA driver's claim checkpoint and per-claim CDI specs if
# written since "up".
# "up" first writes a marker (${E2E_WORK}/made-by-cluster-sh): "down" touches
# nothing without it, nor while a kubelet it did not start runs, and "up"
# refuses a /var/lib/kubelet that it did not make, so neither can wipe a
# real node's kubelet state.
set -euo pipefail

LOG_TAG=cluster
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
E2E_WORK=${E2E_WORK:-/var/lib/cdi-device-plugin-e2e}
NODE_NAME=${E2E_NODE_NAME:-e2e-node}
CGROUP_ROOT=/e2enode
ETCD_PORT=${E2E_ETCD_PORT:-12379}
ETCD_PEER_PORT=${E2E_ETCD_PEER_PORT:-12380}
API_PORT=${E2E_API_PORT:-16443}
SERVICE_CIDR=10.0.0.0/24
SERVICE_IP=10.0.0.1
POD_CIDR=10.244.0.0/24
BRIDGE=e2e0
CNI_CONF=/etc/cni/net.d/10-e2e.conflist
# The kubelet's root (its device plugin directory is fixed below it);
# E2E_KUBELET_ROOT is for the tests of this script's guards only.
KUBELET_ROOT=${E2E_KUBELET_ROOT:-/var/lib/kubelet}
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
TEST_IMAGE=e2e.local/busybox:debian
PLUGIN_IMAGE=docker.io/library/cdi-device-plugin:e2e
# The same image under a second tag: e2e scenario 11 rolls the DaemonSet to it.
PLUGIN_IMAGE_NEXT=docker.io/library/cdi-device-plugin:e2e-next

RUN=${E2E_WORK}/run     # pid files
LOGS=${E2E_WORK}/logs
PKI=${E2E_WORK}/pki
BIN=${E2E_WORK}/bin     # unversioned names of the cached binaries
CTRD=${E2E_WORK}/containerd
SOCK=${CTRD}/containerd.sock
MARKER=${E2E_WORK}/made-by-cluster-sh
# The host install that plugin-host follows.
UNIT=${REPO}/deploy/systemd/cdi-device-plugin.service
UNIT_ENV=${REPO}/deploy/systemd/cdi-device-plugin.env


node_ip() {
	local ip
	ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)
	[[ -n ${ip} ]] || ip=$(ip -4 -o addr show scope global | awk '{sub(/\/.*/, "", $4); print $4; exit}')
	[[ -n ${ip} ]] || die "no global IPv4 address found for the node"
	printf '%s\n' "${ip}"
}

# start NAME CMD...: run CMD detached in its own session, logging to
# $LOGS/NAME.log, pid in $RUN/NAME.pid.
start() {
	local name=$1
	shift
	setsid "$@" >>"${LOGS}/${name}.log" 2>&1 </dev/null &
	echo $! >"${RUN}/${name}.pid"
}

# pid_alive PID: the process exists and is not a zombie. Our components are
# reparented to PID 1 when this script exits, and a zombie that PID 1 has not
# reaped yet still answers kill -0.
pid_alive() {
	local _pid _comm state
	read -r _pid _comm state _ <"/proc/$1/stat" 2>/dev/null || return 1
	[[ ${state} != Z ]]
}

# stop NAME: SIGTERM, then SIGKILL after 10 s.
stop() {
	local f=${RUN}/$1.pid pid i
	[[ -f ${f} ]] || return 0
	pid=$(cat "${f}")
	if pid_alive "${pid}"; then
		kill -TERM "${pid}" 2>/dev/null || true
		for ((i = 0; i < 200; i++)); do
			pid_alive "${pid}" || break
			sleep 0.05
		done
		if pid_alive "${pid}"; then
			kill -KILL "${pid}" 2>/dev/null || true
			log "$1 did not stop within 10 s of SIGTERM: killed"
		fi
		for ((i = 0; i < 100; i++)); do
			pid_alive "${pid}" || break
			sleep 0.05
		done
	fi
	rm -f "${f}"
}

running() { [[ -f ${RUN}/$1.pid ]] && pid_alive "$(cat "${RUN}/$1.pid")"; }

# wait_for WHAT SECONDS CMD...: poll CMD every 0.5 s.
wait_for() {
	local what=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.5
	done
	die "timed out after ${secs}s waiting for ${what} (see ${LOGS}/)"
}

alive() {
	local n
	for n in "$@"; do
		running "${n}" || die "${n} exited; last lines of ${LOGS}/${n}.log:
$(tail -n 40 "${LOGS}/${n}.log" 2>/dev/null)"
	done
}

binaries() {
	"${REPO}/e2e/local/build-binaries.sh" --link "${BIN}"
}

# other_kubelet: a kubelet runs that this script did not start.
# A kubelet in another mount namespace (a kind node's, in its container)
# sees another /var/lib/kubelet and does not count.
other_kubelet() {
	local pid ours= mnt
	[[ -f ${RUN}/kubelet.pid ]] && ours=$(cat "${RUN}/kubelet.pid")
	mnt=$(readlink /proc/self/ns/mnt)
	for pid in $(pgrep -x kubelet || true); do
		[[ ${pid} != "${ours}" ]] || continue
		[[ $(readlink "/proc/${pid}/ns/mnt" 2>/dev/null) == "${mnt}" ]] && return 0
	done
	return 1
}

preflight() {
	[[ $(id -u) == 0 ]] || die "must run as root (kubelet, containerd and mknod need it)"
	# What to do next, for both refusals: a kubelet of an earlier demo or
	# e2e node made with another E2E_WORK is torn down there; a real node's
	# is not ours to touch.
	local earlier="If an earlier make demo or make e2e-up with another E2E_WORK made it, tear that one down: E2E_WORK=<that dir> make demo-down."
	if other_kubelet; then
		die "another kubelet is running on this machine; refusing to touch ${KUBELET_ROOT}.
  This machine is a Kubernetes node: run the local node on a clean machine or VM.
  ${earlier}"
	fi
	if [[ -e ${KUBELET_ROOT} && ! -f ${MARKER} ]]; then
		die "${KUBELET_ROOT} exists and was not made by cluster.sh up (no ${MARKER}); refusing to use or remove it.
  This machine has or had a kubelet of its own (kubeadm, k3s, a distribution's package): run the local node on a clean machine or VM.
  ${earlier}
  Only if no kubelet will use ${KUBELET_ROOT} again (its service stopped and removed, nothing needs its pods' state), remove it yourself and run this again."
	fi
	local missing=() c
	for c in openssl ip curl setsid mount umount; do
		command -v "${c}" >/dev/null || missing+=("${c}")
	done
	[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
	# The test image is /bin/busybox alone: it must be the static build.
	if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then
		missing+=(busybox-static)
	fi
	[[ ${#missing[@]} -eq 0 ]] || die "missing: ${missing[*]} (apt-get install -y libseccomp-dev pkg-config containernetworking-plugins busybox-static curl iproute2 openssl)"
	feature_gates_yaml "" >/dev/null
}

# cert NAME CN O SAN: a key and a certificate signed by the cluster CA.
cert() {
	local name=$1 cn=$2 org=$3 san=$4 subj="/CN=$2"
	[[ -n ${org} ]] && subj="/O=${org}/CN=${cn}"
	openssl req -new -newkey rsa:2048 -nodes -keyout "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [[ -n ${san} ]]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=${san}"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"${PKI}/${name}.ext"
	openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" -CAcreateserial \
		-days 30 -sha256 -extfile "${PKI}/${name}.ext" -out "${PKI}/${name}.crt" 2>/dev/null
}

kubeconfig() {
	local name=$1 user=$2
	cat >"${E2E_WORK}/${name}.kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:${API_PORT}
    certificate-authority: ${PKI}/ca.crt
users:
- name: ${user}
  user:
    client-certificate: ${PKI}/${user}.crt
    client-key: ${PKI}/${user}.key
contexts:
- name: e2e
  context: {cluster: e2e, user: ${user}}
current-context: e2e
EOK
}

pki() {
	local ip=$1
	mkdir -p "${PKI}"
	openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "${PKI}/ca.key" -subj "/CN=cdi-e2e-ca" \
		-days 30 -sha256 -out "${PKI}/ca.crt" 2>/dev/null
	cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:${SERVICE_IP},IP:${ip},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin admin system:masters ""
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
	cert kubelet "system:node:${NODE_NAME}" system:nodes ""
	cert kubelet-serving "system:node:${NODE_NAME}" system:nodes "IP:${ip},IP:127.0.0.1,DNS:${NODE_NAME}"
	openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
	openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig kubelet kubelet
}

cni() {
	mkdir -p "$(dirname "${CNI_CONF}")"
	cat >"${CNI_CONF}.tmp" <<EOC
{"cniVersion":"1.0.0","name":"e2e","plugins":[
 {"type":"bridge","bridge":"${BRIDGE}","isGateway":true,"ipMasq":false,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"${POD_CIDR}"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"loopback"}]}
EOC
	mv -f "${CNI_CONF}.tmp" "${CNI_CONF}"
}

containerd_up() {
	mkdir -p "${CTRD}"
	cat >"${CTRD}/config.toml" <<EOC
version = 3
root = "${CTRD}/root"
state = "${CTRD}/state"
[grpc]
  address = "${SOCK}"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "${PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  # CAP_SYS_RESOURCE may be missing (as on our CI machines): lowering a
  # sandbox's oom_score_adj would fail every pod.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  # Container annotations (such as those from a device plugin's Allocate)
  # reach the OCI spec only when passed through here.
  container_annotations = ["e2e.cdi.dev/*", "example.com/*", "cdi.k8s.io/*"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "${BIN}/runc"
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$(dirname "${CNI_CONF}")"
EOC
	start containerd env PATH="${BIN}:${PATH}" "${BIN}/containerd" --config "${CTRD}/config.toml"
	wait_for containerd 60 "${BIN}/ctr" -a "${SOCK}" version
}

images() {
	local img=${E2E_WORK}/images applets=() a
	mkdir -p "${img}"
	(cd "${REPO}" && CGO_ENABLED=0 go build -trimpath -o "${img}/mkimage" ./e2e/cmd/mkimage)
	(cd "${REPO}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=e2e" -o "${img}/" ./cmd/cdi-device-plugin ./cmd/cdi-dra-driver ./cmd/cdi-dra-controller)
	for a in $(/bin/busybox --list); do
		[[ ${a} == busybox ]] || applets+=(-symlink "/bin/${a}=busybox")
	done
	"${img}/mkimage" -o "${img}/busybox.tar" -tag "${TEST_IMAGE}" -file /bin/busybox=/bin/busybox "${applets[@]}" \
		-env PATH=/bin -cmd /bin/sh
	# Any process that waits forever serves as the pod sandbox.
	"${img}/mkimage" -o "${img}/pause.tar" -tag "${PAUSE_IMAGE}" -file /bin/busybox=/bin/busybox \
		-entrypoint /bin/busybox -cmd sh -cmd -c -cmd "trap 'exit 0' TERM INT; while :; do /bin/busybox sleep 3600 & wait; done"
	# The plugin image holds what the Dockerfile's does: the static binaries
	# at /cdi-device-plugin (the entrypoint), /cdi-dra-driver and
	# /cdi-dra-controller, run as root (the controller's Deployment names a
	# non-root user).
	"${img}/mkimage" -o "${img}/plugin.tar" -tag "${PLUGIN_IMAGE}" -file /cdi-device-plugin="${img}/cdi-device-plugin" \
		-file /cdi-dra-driver="${img}/cdi-dra-driver" -file /cdi-dra-controller="${img}/cdi-dra-controller" \
		-entrypoint /cdi-device-plugin -user 0:0
	for a in busybox pause plugin; do
		"${BIN}/ctr" -a "${SOCK}" -n k8s.io images import "${img}/${a}.tar" >/dev/null
	done
	"${BIN}/ctr" -a "${SOCK}" -n k8s.io images tag --force "${PLUGIN_IMAGE}" "${PLUGIN_IMAGE_NEXT}" >/dev/null
}

control_plane() {
	local ip=$1 controllers
	controllers=$(kcm_controllers "${BIN}/kube-controller-manager") || exit 1
	start etcd "${BIN}/etcd" --name e2e --data-dir "${E2E_WORK}/etcd" \
		--listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
		--listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
		--initial-cluster "e2e=http://127.0.0.1:${ETCD_PEER_PORT}" --listen-metrics-urls "" --log-level warn
	wait_for etcd 60 curl -fsS "http://127.0.0.1:${ETCD_PORT}/health"
	start kube-apiserver "${BIN}/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
		--secure-port "${API_PORT}" --advertise-address "${ip}" \
		--tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
		--client-ca-file "${PKI}/ca.crt" \
		--kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt" --kubelet-client-key "${PKI}/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "${PKI}/ca.crt" --kubelet-preferred-address-types InternalIP \
		--service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range "${SERVICE_CIDR}" --authorization-mode Node,RBAC --allow-privileged=true \
		--enable-admission-plugins NodeRestriction --feature-gates "${FEATURE_GATES}"
	wait_for kube-apiserver 120 "${BIN}/kubectl" --kubeconfig "${E2E_WORK}/admin.kubeconfig" get --raw /readyz
	start kube-controller-manager "${BIN}/kube-controller-manager" \
		--kubeconfig "${E2E_WORK}/admin.kubeconfig" --bind-address 127.0.0.1 \
		--service-account-private-key-file "${PKI}/sa.key" --root-ca-file "${PKI}/ca.crt" \
		--cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
		--leader-elect=false --controllers "${controllers}" \
		--feature-gates "${FEATURE_GATES}"
	start kube-scheduler "${BIN}/kube-scheduler" --kubeconfig "${E2E_WORK}/admin.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --feature-gates "${FEATURE_GATES}"
}

cgroups() {
	local h
	for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[[ -d ${h} ]] || continue
		# cgroup v2 (unified at the top) or a v1 hierarchy.
		if [[ -f ${h}cgroup.procs ]]; then
			mkdir -p "${h}${CGROUP_ROOT#/}"
		fi
	done
}

kubelet_up() {
	local ip gates
	ip=$(node_ip)
	# FEATURE_GATES (e2e/versions.env), as the control plane has them.
	gates=$(feature_gates_yaml "  ") || exit 1
	mkdir -p "${KUBELET_ROOT}" "${E2E_WORK}/kubelet"
	cat >"${E2E_WORK}/kubelet/config.yaml" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://${SOCK}
cgroupDriver: cgroupfs
cgroupRoot: ${CGROUP_ROOT}
failSwapOn: false
failCgroupV1: false
tlsCertFile: ${PKI}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI}/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
nodeStatusUpdateFrequency: 4s
resolvConf: /etc/resolv.conf
featureGates:
${gates}
EOC
	start kubelet "${BIN}/kubelet" --config "${E2E_WORK}/kubelet/config.yaml" \
		--kubeconfig "${E2E_WORK}/kubelet.kubeconfig" --root-dir "${KUBELET_ROOT}" \
		--hostname-override "${NODE_NAME}" --node-ip "${ip}" --v 2
}

node_ready() {
	"${BIN}/kubectl" --kubeconfig "${E2E_WORK}/admin.kubeconfig" get node "${NODE_NAME}" \
		-o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

print_env() {
	cat <<EOV
export KUBECONFIG=${E2E_WORK}/admin.kubeconfig
export KUBECTL=${BIN}/kubectl
export PATH=${BIN}:\${PATH}
export E2E_PLUGIN_IMAGE=${PLUGIN_IMAGE}
export E2E_PLUGIN_IMAGE_NEXT=${PLUGIN_IMAGE_NEXT}
export E2E_TEST_IMAGE=${TEST_IMAGE}
export E2E_NODE_SHELL=
export E2E_NODE_ROOT=/
export E2E_RUNTIME_STATE=${CTRD}/state
export E2E_RESTART_KUBELET='${REPO}/e2e/local/cluster.sh restart-kubelet'
export E2E_PLUGIN_HOST='${REPO}/e2e/local/cluster.sh plugin-host'
export E2E_REBOOT='${REPO}/e2e/local/cluster.sh simulate-reboot'
# Where pods reach the API server: this node runs no kube-proxy, so the
# kubernetes Service does not route (deploy.sh API_SERVER_HOST/PORT).
export E2E_API_SERVER_HOST=$(node_ip)
export E2E_API_SERVER_PORT=${API_PORT}
EOV
}

up() {
	preflight
	local t0=${SECONDS} ip
	down quiet
	mkdir -p "${E2E_WORK}"
	printf 'made by cluster.sh up, pid %s, %s\n' "$$" "$(date -u +%FT%TZ)" >"${MARKER}"
	rm -rf "${LOGS}"
	mkdir -p "${RUN}" "${LOGS}"
	binaries
	log "binaries ready ($((SECONDS - t0)) s)"
	ip=$(node_ip)
	pki "${ip}"
	cni
	containerd_up
	images
	log "containerd up, images imported ($((SECONDS - t0)) s)"
	control_plane "${ip}"
	cgroups
	kubelet_up
	wait_for "node ${NODE_NAME} Ready" 180 node_ready
	alive etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet
	print_env >"${E2E_WORK}/env"
	log "node ${NODE_NAME} Ready after $((SECONDS - t0)) s; variables for the suite: ${E2E_WORK}/env"
}

restart_kubelet() {
	running kubelet || die "the kubelet is not running"
	stop kubelet
	kubelet_up
}

# plugin_host start VAR=VALUE... | stop: see the usage at the top.
plugin_host() {
	local kv
	[[ -f ${MARKER} ]] || die "the node is not up"
	case ${1:-} in
	start)
		shift
		stop plugin-host
		{
			cat "${UNIT_ENV}"
			echo "# e2e: plugin-host start"
		} >"${E2E_WORK}/plugin-host.env"
		for kv in "$@"; do
			[[ ${kv} =~ ^[A-Z_][A-Z0-9_]*= ]] || die "plugin-host start: ${kv}: want VAR=VALUE"
			printf '%s\n' "${kv}" >>"${E2E_WORK}/plugin-host.env"
		done
		plugin_host_up
		;;
	stop) stop plugin-host ;;
	*) die "usage: cluster.sh plugin-host start VAR=VALUE... | stop" ;;
	esac
}

# envfile_vars FILE: the assignments of a systemd EnvironmentFile, one
# VAR=VALUE a line: blank lines and #/; comments skipped, whitespace around
# the name and the value dropped, one pair of enclosing quotes removed.
envfile_vars() {
	local line k v
	while IFS= read -r line || [[ -n ${line} ]]; do
		line=${line#"${line%%[![:space:]]*}"}
		[[ -z ${line} || ${line} == '#'* || ${line} == ';'* ]] && continue
		[[ ${line} =~ ^([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*=[[:space:]]*(.*)$ ]] || die "$1: not VAR=VALUE: ${line}"
		k=${BASH_REMATCH[1]} v=${BASH_REMATCH[2]}
		v=${v%"${v##*[![:space:]]}"}
		if [[ ${v} =~ ^\"(.*)\"$ || ${v} =~ ^\'(.*)\'$ ]]; then
			v=${BASH_REMATCH[1]}
		fi
		printf '%s=%s\n' "${k}" "${v}"
	done <"$1"
}

# unit_values KEY: the values of KEY= in the unit, one a line.
unit_values() { sed -n "s/^$1=//p" "${UNIT}"; }

# unit_command ENVFILE: the command systemd would run for the unit with
# ENVFILE as its EnvironmentFile, one word a line: a clean environment
# (systemd's PATH, the unit's Environment=, then the file, which overrides
# them), the unit's capability bounding set and NoNewPrivileges (setpriv),
# and its ExecStart with our build of the binary in place of the installed
# one. %H (the host name) is the only specifier the unit uses.
unit_command() {
	local envfile=$1 exec caps=() c bounding=-all
	exec=$(unit_values ExecStart)
	[[ ${exec} == /usr/local/bin/cdi-device-plugin* ]] || die "${UNIT}: ExecStart=${exec}: expected /usr/local/bin/cdi-device-plugin"
	read -r -a caps <<<"$(unit_values CapabilityBoundingSet)"
	for c in "${caps[@]}"; do
		c=${c#CAP_}
		bounding+=",+${c,,}"
	done
	printf '%s\n' env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	unit_values Environment | sed "s/%H/$(hostname)/g"
	envfile_vars "${envfile}"
	printf '%s\n' setpriv --bounding-set "${bounding}" --inh-caps -all
	[[ $(unit_values NoNewPrivileges) == yes ]] && echo --no-new-privs
	# shellcheck disable=SC2086 # ExecStart's words
	printf '%s\n' "${E2E_WORK}/images/cdi-device-plugin" ${exec#/usr/local/bin/cdi-device-plugin}
}

plugin_host_up() {
	local cmd=()
	mapfile -t cmd < <(unit_command "${E2E_WORK}/plugin-host.env")
	[[ ${#cmd[@]} -gt 0 ]] || die "no command for the host plugin"
	start plugin-host "${cmd[@]}"
	sleep 0.2
	alive plugin-host
}

# remove_sim_nodes: the simulated device nodes that the CDI specs name (a
# reboot empties /dev, a tmpfs; real nodes come back with their drivers).
remove_sim_nodes() {
	local spec p
	for spec in /var/run/cdi/*.json; do
		[[ -f ${spec} && ! -L ${spec} ]] || continue
		# A spec may name no node below /dev (a DRA claim's spec): grep
		# finds nothing, which is no failure here.
		{ grep -Eo '"hostPath": ?"/dev/[^"]*"' "${spec}" || true; } | sed 's/.*"\([^"]*\)"$/\1/' | while read -r p; do
			if sim_node "${p}"; then rm -f -- "${p}"; fi
		done
	done
}

simulate_reboot() {
	local host_plugin='' t0=${SECONDS}
	running kubelet || die "the kubelet is not running"
	running plugin-host && host_plugin=1
	log "simulated reboot: stopping everything"
	stop_node_processes
	# What does not survive a reboot.
	drop_node_runtime
	rm -rf "${CTRD}/state"
	remove_sim_nodes
	find /var/run/cdi -mindepth 1 -delete 2>/dev/null || true
	log "down after $((SECONDS - t0)) s; starting ${host_plugin:+the host plugin, }containerd, then the kubelet"
	cgroups
	if [[ -n ${host_plugin} ]]; then
		plugin_host_up
	fi
	containerd_up
	kubelet_up
	log "kubelet started again $((SECONDS - t0)) s after the simulated reboot began"
}

# Processes in the pods' cgroups, which the shims may leave behind.
kill_pod_processes() {
	local pids
	pids=$(find /sys/fs/cgroup -path "*${CGROUP_ROOT}/*" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
	# shellcheck disable=SC2086 # one pid per word
	[[ -z ${pids} ]] || kill -KILL ${pids} 2>/dev/null || true
}

unmount_under() {
	local dir=$1 m
	[[ -e ${dir} ]] || return 0
	# Deepest first.
	awk -v d="${dir}" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
		while read -r m; do
			umount -l "${m}" 2>/dev/null || true
		done
}

# stop_node_processes: the kubelet, the pods' processes, containerd and its
# shims, the host plugin.
stop_node_processes() {
	stop kubelet
	kill_pod_processes
	stop containerd
	# Shims of our containerd (they outlive it by design).
	pkill -KILL -f -- "containerd-shim-runc-v2.* -address ${SOCK}" 2>/dev/null || true
	kill_pod_processes
	stop plugin-host
}

# drop_node_runtime: the pods' mounts, network namespaces, the bridge and
# the cgroups (what a reboot loses, and down removes).
drop_node_runtime() {
	unmount_under "${KUBELET_ROOT}"
	unmount_under "${CTRD}"
	remove_netns
	ip link delete "${BRIDGE}" 2>/dev/null || true
	remove_cgroups
}

remove_netns() {
	local ns
	for ns in /var/run/netns/cni-*; do
		[[ -e ${ns} ]] || continue
		umount "${ns}" 2>/dev/null || true
		rm -f "${ns}"
	done
}

remove_cgroups() {
	local h
	for h in /sys/fs/cgroup/*/"${CGROUP_ROOT#/}" /sys/fs/cgroup/"${CGROUP_ROOT#/}"; do
		[[ -d ${h} ]] || continue
		find "${h}" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
}

# sim_node PATH: PATH is a simulated device node as the suite and the demo
# make them (a character device 1:3, an alias of /dev/null), not a real one.
sim_node() {
	[[ $1 == /dev/* && $1 != /dev/null && -c $1 && ! -L $1 ]] && [[ $(stat -c '%t:%T' -- "$1") == 1:3 ]]
}

# The plugins the suite and the demo deploy keep their CDI specs, device
# nodes and device state on exit (by design); remove those of our plugin
# names (owner <namespace>/<plugin>): their simulated /dev nodes and the
# state directories their specs point at. Real device nodes are never
# removed.
sweep_plugin_leftovers() {
	local spec p
	for spec in /var/run/cdi/*.json; do
		[[ -f ${spec} && ! -L ${spec} ]] || continue
		grep -Eq '"cdi-device-plugin/owner": ?"([a-z0-9-]+/)?(cdi-e2e|cdi-e2e-bad|cdi-e2e-host|demo)"' "${spec}" || continue
		grep -Eo '"hostPath": ?"[^"]*"' "${spec}" | sed 's/.*"\([^"]*\)"$/\1/' | while read -r p; do
			case ${p} in
			/dev/*) if sim_node "${p}"; then rm -f -- "${p}"; fi ;;
			/var/lib/cdi-device-plugin/devices/*)
				# The device's state and its lock file (<state-dir>/locks/<device>.lock,
				# which the steps of every instance lock).
				rm -rf -- "${p}" "/var/lib/cdi-device-plugin/locks/${p##*/}.lock"
				;;
			esac
		done
		rm -f -- "${spec}"
	done
	# The DRA driver's per-claim specs (<vendor>-claim_<uid>.json, with the
	# cdi-device-plugin/claim annotation) of claims still prepared when the
	# node goes down (make demo MODE=dra, docs/dra.md): written since up,
	# as the checkpoint below.
	for spec in /var/run/cdi/*-claim_*.json; do
		[[ -f ${spec} && ! -L ${spec} && ${spec} -nt ${MARKER} ]] || continue
		if grep -q '"cdi-device-plugin/claim"' "${spec}"; then rm -f -- "${spec}"; fi
	done
	# The DRA driver's claim checkpoint (<state-dir>/dra, the state dir the
	# suite and the demo deploy with): its claims were prepared for this
	# node's kubelet, whose state down removes. Only one written since up
	# (newer than its marker); an older one is left alone.
	local dra=/var/lib/cdi-device-plugin/dra
	if [[ -f ${dra}/checkpoint.json && ! -L ${dra}/checkpoint.json && ${dra}/checkpoint.json -nt ${MARKER} ]]; then
		rm -f -- "${dra}/checkpoint.json" "${dra}"/.checkpoint.json.tmp-*
	fi
	# The busybox that the exec steps of the demo's and the suite's
	# resources prepared before binding run (e2e/local/demo.sh, scenario
	# D10), put there since up.
	local bin=/var/lib/cdi-device-plugin/e2e-bin
	if [[ -d ${bin} && ! -L ${bin} && ${bin} -nt ${MARKER} ]]; then
		rm -rf -- "${bin}"
	fi
	rmdir "${dra}" /var/lib/cdi-device-plugin/devices /var/lib/cdi-device-plugin/locks /var/lib/cdi-device-plugin 2>/dev/null || true
	# The CDI specs of the DRA driver's device metadata
	# (<driver>_metadata_<uid>_<request>.json) of claims still prepared:
	# they mount files below the kubelet's plugins directory, which down
	# removes. Written since up, as the claim specs above.
	remove_metadata_specs /var/run/cdi "${KUBELET_ROOT}/plugins" "${MARKER}"
}

down() {
	local quiet=${1:-}
	if [[ ! -f ${MARKER} ]]; then
		[[ -n ${quiet} ]] && return 0
		die "nothing here was made by cluster.sh up (no ${MARKER}); refusing to stop or remove anything"
	fi
	if other_kubelet; then
		die "a kubelet that cluster.sh did not start is running; refusing to touch ${KUBELET_ROOT}"
	fi
	[[ -n ${quiet} ]] || log "stopping"
	mkdir -p "${RUN}"
	stop_node_processes
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	stop etcd
	drop_node_runtime
	sweep_plugin_leftovers
	rm -rf "${KUBELET_ROOT}" /var/log/pods /var/log/containers /var/lib/cni/networks/e2e "${CNI_CONF}" \
		"${E2E_WORK}/etcd" "${CTRD}" "${PKI}" "${E2E_WORK}/env" "${E2E_WORK}/plugin-host.env"
	rm -f "${MARKER}"
	[[ -n ${quiet} ]] || log "stopped and cleaned up"
}

logs() {
	local n=${1:-200} f
	for f in "${LOGS}"/*.log; do
		[[ -f ${f} ]] || continue
		printf '\n===== %s (last %s lines) =====\n' "${f}" "${n}"
		tail -n "${n}" "${f}"
	done
}

case ${1:-} in
up) up ;;
check) preflight ;;
down) down ;;
restart-kubelet) restart_kubelet ;;
plugin-host)
	shift
	plugin_host "$@"
	;;
simulate-reboot) simulate_reboot ;;
unit-command) unit_command "${2:?usage: cluster.sh unit-command ENVFILE}" ;;
env)
	[[ -f ${E2E_WORK}/env ]] || die "not up"
	cat "${E2E_WORK}/env"
	;;
logs) logs "${2:-200}" ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
