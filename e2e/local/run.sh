#!/usr/bin/env bash
# make e2e: bring the local node up (e2e/local/cluster.sh), run the e2e suite
# against it, tear it down, also when something fails. On failure every
# component's log (kubelet, containerd, apiserver, ...) is printed and copied
# with the suite's artifacts to E2E_ARTIFACTS (default _artifacts/local).
set -euo pipefail
LOG_TAG=e2e
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
cd "${REPO}"
export E2E_ARTIFACTS=${E2E_ARTIFACTS:-${REPO}/_artifacts/local}
E2E_WORK=${E2E_WORK:-/var/lib/cdi-device-plugin-e2e}
export E2E_WORK
cluster=e2e/local/cluster.sh

status=0
# Runs from the EXIT trap.
# shellcheck disable=SC2317
finish() {
	if [[ ${status} != 0 ]]; then
		mkdir -p "${E2E_ARTIFACTS}"
		cp -r "${E2E_WORK}/logs" "${E2E_ARTIFACTS}/node-logs" 2>/dev/null || true
		cp -r /var/log/pods "${E2E_ARTIFACTS}/pod-logs" 2>/dev/null || true
		echo "==== e2e failed (status ${status}); component logs follow, all saved in ${E2E_ARTIFACTS} ====" >&2
		"${cluster}" logs 150 >&2 || true
		local f
		for f in /var/log/pods/cdi-e2e*/*/*.log; do
			[[ -f ${f} ]] || continue
			printf '\n===== pod log %s (last 100 lines) =====\n' "${f}" >&2
			tail -n 100 "${f}" >&2
		done
	fi
	if [[ -z ${E2E_KEEP:-} ]]; then
		"${cluster}" down || true
	else
		echo "E2E_KEEP is set: the node stays up; tear it down with: ${cluster} down" >&2
	fi
}
trap 'status=$?; finish; exit "${status}"' EXIT
trap 'exit 130' INT TERM

start=${SECONDS}
"${cluster}" up
up=$((SECONDS - start))
# shellcheck disable=SC1091
source "${E2E_WORK}/env"
run_suite "${E2E_WORK}/logs/suite.log" || status=$?
log "node up in ${up} s, suite and node in $((SECONDS - start)) s, status ${status}"
exit "${status}"
