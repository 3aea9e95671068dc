#!/bin/sh
# The host installer's container: installs or upgrades the host service
# (deploy/systemd) on its node from the files of this image, starts it,
# and then waits, so that the DaemonSet's rollout is the cluster's rollout
# of the host service. It does nothing else: the plugin runs under systemd,
# not in this pod, so it comes up before the kubelet after a reboot.
#
#   HOST_ROOT  the node's root file system, mounted here (default /host)
#   SRC_DIR    this image's files (default /opt/cdi-device-plugin)
#   BINDIR     where the binary goes on the node (default /usr/local/bin)
#   UNITDIR    where the unit goes on the node (default /etc/systemd/system)
#   ENV_FILE   the unit's environment file on the node (default /etc/default/cdi-device-plugin)
#   CONFIG_ENV an environment file to install as ENV_FILE, replacing the
#              node's (a ConfigMap, default /config/cdi-device-plugin.env);
#              without it the shipped example is installed only where none is
#   SYSTEMCTL  the node's systemctl (default: chroot HOST_ROOT systemctl)
#   ONCE       non-empty: exit after installing (tests)
set -eu
HOST_ROOT=${HOST_ROOT:-/host}
SRC_DIR=${SRC_DIR:-/opt/cdi-device-plugin}
BINDIR=${BINDIR:-/usr/local/bin}
UNITDIR=${UNITDIR:-/etc/systemd/system}
ENV_FILE=${ENV_FILE:-/etc/default/cdi-device-plugin}
CONFIG_ENV=${CONFIG_ENV:-/config/cdi-device-plugin.env}
SYSTEMCTL=${SYSTEMCTL:-chroot ${HOST_ROOT} systemctl}
UNIT=cdi-device-plugin.service

log() { echo "host-installer: $*"; }

changed=
# put SRC DST MODE: DST on the node becomes SRC with MODE, replaced
# atomically, only when it differs.
put() {
	if [ -f "$2" ] && cmp -s "$1" "$2"; then
		return 0
	fi
	mkdir -p "$(dirname "$2")"
	cp "$1" "$2.new.$$"
	chmod "$3" "$2.new.$$"
	mv -f "$2.new.$$" "$2"
	changed=1
	log "installed ${2#"${HOST_ROOT}"}"
}

[ -d "${HOST_ROOT}/etc" ] || { log "no node root file system at ${HOST_ROOT}"; exit 1; }
tmp=$(mktemp)
trap 'rm -f "${tmp}"' EXIT
put "${SRC_DIR}/cdi-device-plugin" "${HOST_ROOT}${BINDIR}/cdi-device-plugin" 0755
sed -e "s|/usr/local/bin/cdi-device-plugin|${BINDIR}/cdi-device-plugin|" \
	-e "s|/etc/default/cdi-device-plugin|${ENV_FILE}|" "${SRC_DIR}/${UNIT}" >"${tmp}"
put "${tmp}" "${HOST_ROOT}${UNITDIR}/${UNIT}" 0644
rm -f "${tmp}"
if [ -f "${CONFIG_ENV}" ]; then
	put "${CONFIG_ENV}" "${HOST_ROOT}${ENV_FILE}" 0644
elif [ ! -e "${HOST_ROOT}${ENV_FILE}" ]; then
	put "${SRC_DIR}/cdi-device-plugin.env" "${HOST_ROOT}${ENV_FILE}" 0644
fi

${SYSTEMCTL} daemon-reload
${SYSTEMCTL} enable "${UNIT}"
if [ -n "${changed}" ]; then
	# Safe while pods hold devices: specs and nodes stay, the kubelet
	# keeps its allocations, the new process registers again.
	${SYSTEMCTL} restart "${UNIT}"
else
	${SYSTEMCTL} start "${UNIT}"
fi
${SYSTEMCTL} is-active "${UNIT}"
log "${UNIT} is active ($("${HOST_ROOT}${BINDIR}/cdi-device-plugin" --version 2>&1 || true))"

[ -z "${ONCE:-}" ] || exit 0
trap 'exit 0' TERM INT
while :; do
	sleep 3600 &
	wait $! || true
done
