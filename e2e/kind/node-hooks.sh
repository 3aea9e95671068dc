#!/usr/bin/env bash
# The suite's host-mode hooks on a kind node (run.sh hands them to the suite
# as E2E_PLUGIN_HOST and E2E_REBOOT):
#
#   e2e/kind/node-hooks.sh ENGINE NODE plugin-host start VAR=VALUE...
#   e2e/kind/node-hooks.sh ENGINE NODE plugin-host stop
#   e2e/kind/node-hooks.sh ENGINE NODE simulate-reboot
#
# The node is the kind node container; "the host" of the kubelet is that
# container, so the host plugin runs in it: /usr/local/bin/cdi-device-plugin-e2e
# (run.sh copies the binary built here into the node) as the transient systemd
# unit cdi-e2e-plugin-host, with only the given variables in its environment
# (kept in /etc/cdi-e2e/plugin-host.env for the reboot).
#
# simulate-reboot does in the node what e2e/local/cluster.sh simulate-reboot
# does on this machine: the kubelet, every pod's processes, containerd and its
# shims and the host plugin stop at once; the pods' mounts, network
# namespaces and the CNI bridge, containerd's state (/run/containerd), the CDI
# specs in /var/run/cdi and the simulated device nodes they name are gone;
# then the host plugin (when it ran), containerd and the kubelet start again,
# in that order. The node container itself is not restarted: the scenario
# then checks the same thing as on the local node (and does not depend on the
# node getting its address back, which its certificates and etcd name).
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"

[[ $# -ge 3 ]] || die "usage: node-hooks.sh ENGINE NODE plugin-host start VAR=VALUE... | plugin-host stop | simulate-reboot"
engine=$1 node=$2
shift 2
[[ ${engine} == podman || ${engine} == docker ]] || die "ENGINE: podman or docker, not '${engine}'"

# in_node SCRIPT [ARG...]: run a bash script in the node as root.
in_node() {
	local script=$1
	shift
	"${engine}" exec -i "${node}" bash -euo pipefail -c "${script}" node-hooks "$@"
}

# Shell functions the node-side scripts share.
# shellcheck disable=SC2016 # expanded in the node
common='
unit=cdi-e2e-plugin-host
env_file=/etc/cdi-e2e/plugin-host.env
plugin_up() {
	systemctl reset-failed "${unit}" 2>/dev/null || true
	systemd-run --quiet --unit "${unit}" --collect -p EnvironmentFile="${env_file}" \
		/usr/local/bin/cdi-device-plugin-e2e
	sleep 0.2
	systemctl is-active --quiet "${unit}" || { journalctl -u "${unit}" --no-pager | tail -n 20 >&2; exit 1; }
}
plugin_down() {
	systemctl stop "${unit}" 2>/dev/null || true
}
'

case ${1:-} in
plugin-host)
	case ${2:-} in
	start)
		shift 2
		for kv in "$@"; do
			[[ ${kv} =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]] || die "plugin-host start: ${kv}: want VAR=VALUE"
		done
		# shellcheck disable=SC2016 # expanded in the node
		in_node "${common}"'
[[ -x /usr/local/bin/cdi-device-plugin-e2e ]] || { echo "no /usr/local/bin/cdi-device-plugin-e2e in the node" >&2; exit 1; }
plugin_down
mkdir -p "${env_file%/*}"
printf "%s\n" "$@" >"${env_file}"
plugin_up' "$@"
		;;
	stop)
		# shellcheck disable=SC2016 # expanded in the node
		in_node "${common}"'plugin_down; rm -f "${env_file}"'
		;;
	*) die "usage: node-hooks.sh ENGINE NODE plugin-host start VAR=VALUE... | stop" ;;
	esac
	;;
simulate-reboot)
	# shellcheck disable=SC2016 # expanded in the node
	in_node "${common}"'
t0=${SECONDS}
host_plugin=""
if systemctl is-active --quiet "${unit}"; then host_plugin=1; fi
systemctl is-active --quiet kubelet || { echo "the kubelet is not running" >&2; exit 1; }
# Kill every process of the cgroups whose path contains $1.
kill_cgroup() {
	local pids
	pids=$(find /sys/fs/cgroup -path "*$1*" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | grep -vx 0 || true)
	# shellcheck disable=SC2086
	[[ -z ${pids} ]] || kill -KILL ${pids} 2>/dev/null || true
}
# Unmount everything under $1, deepest first.
unmount_under() {
	awk -v d="$1" '"'"'$5 == d || index($5, d "/") == 1 { print $5 }'"'"' /proc/self/mountinfo | sort -r |
		while read -r m; do umount -l "${m}" 2>/dev/null || true; done
}
echo "simulated reboot: stopping everything" >&2
systemctl stop kubelet
kill_cgroup kubepods
# containerd.service has KillMode=process: its shims outlive it.
systemctl stop containerd
kill_cgroup system.slice/containerd.service
kill_cgroup kubepods
plugin_down
# A reboot loses the cgroups of the pods. Here systemd would keep their
# scopes "running" although empty (systemd in a container on cgroup v1 is not
# told when a cgroup empties), and the cAdvisor of the new kubelet then spends
# about 3 s on each before the kubelet syncs any pod, those of the control
# plane included: minutes. Stopping the slice of the pods removes them.
systemctl stop kubelet-kubepods.slice 2>/dev/null || true
find /sys/fs/cgroup -depth -mindepth 2 -type d -path "*kubepods*" -exec rmdir {} + 2>/dev/null || true
# What does not survive a reboot.
unmount_under /var/lib/kubelet/pods
unmount_under /run/containerd
for ns in /run/netns/cni-*; do
	[[ -e ${ns} ]] || continue
	umount "${ns}" 2>/dev/null || true
	rm -f "${ns}"
done
ip link delete cni0 2>/dev/null || true
rm -rf /run/containerd
for spec in /var/run/cdi/*.json; do
	[[ -f ${spec} && ! -L ${spec} ]] || continue
	# A spec may name no node below /dev (the spec of a DRA claim).
	{ grep -Eo "\"hostPath\": ?\"/dev/[^\"]*\"" "${spec}" || true; } | sed "s/.*\"\([^\"]*\)\"$/\1/" | while read -r p; do
		# Only simulated nodes (character devices 1:3, aliases of /dev/null).
		if [[ ${p} != /dev/null && -c ${p} && ! -L ${p} && $(stat -c %t:%T -- "${p}") == 1:3 ]]; then rm -f -- "${p}"; fi
	done
done
find /var/run/cdi -mindepth 1 -delete 2>/dev/null || true
echo "down after $((SECONDS - t0)) s; starting ${host_plugin:+the host plugin, }containerd, then the kubelet" >&2
if [[ -n ${host_plugin} ]]; then plugin_up; fi
systemctl start containerd
systemctl start kubelet
echo "kubelet started again $((SECONDS - t0)) s after the simulated reboot began" >&2'
	;;
*) die "usage: node-hooks.sh ENGINE NODE plugin-host start VAR=VALUE... | plugin-host stop | simulate-reboot" ;;
esac
