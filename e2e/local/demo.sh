#!/usr/bin/env bash
# make demo: bring the local node up, deploy the plugin with 4 simulated
# devices, run a pod that asks for 2 and print what it sees.
#
# make demo MODE=dra: bring the local node up and deploy the demo's
# resources (e2e/local/demo-dra.yaml: example.com/sim, 4 devices,
# example.com/shared, 1 device with replicas: 2, and example.com/fpga, 2
# devices prepared before binding) with deploy.sh MODE=per-node, the node
# labelled cdi-device-plugin/mode=dra: the DRA driver serves them, its
# DeviceClasses sim.example.com, shared.example.com and fpga.example.com,
# and its controller (one Deployment) labels the claims to prepare before
# binding; relabelled device-plugin, the device plugin does. docs/dra.md
# walks through it.
#
# The node stays up; "make demo-down" (e2e/local/cluster.sh down) removes
# it, with the plugin's spec, device nodes and state and the DRA driver's
# claim checkpoint and claims' specs. On a machine that has a kubelet of
# its own, cluster.sh up refuses and says what to do (README.md, "Quick
# start").
set -euo pipefail
LOG_TAG=demo
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
cd "${REPO}"
E2E_WORK=${E2E_WORK:-/var/lib/cdi-device-plugin-e2e}
export E2E_WORK

# MODE is checked before anything is installed or started.
MODE=${MODE:-device-plugin}
case ${MODE} in
device-plugin | dra) ;;
*) die "unknown MODE '${MODE}': make demo runs MODE=device-plugin (the default) or MODE=dra (docs/dra.md)" ;;
esac

# demo_deploy ACTION: deploy/deploy.sh ACTION (render, apply) with the
# demo's settings for MODE. MODE=dra: both DaemonSets (deploy.sh
# MODE=per-node, each on the nodes labelled for it) with the resources of
# e2e/local/demo-dra.yaml, each with a DeviceClass, as the e2e DRA
# scenarios deploy the driver.
demo_deploy() {
	if [[ ${MODE} == dra ]]; then
		MODE=per-node NAMESPACE=demo PLUGIN_CONFIG=e2e/local/demo-dra.yaml \
			DRA_RESOURCES=example.com/sim,example.com/shared,example.com/fpga IMAGE="${E2E_PLUGIN_IMAGE:-}" \
			API_SERVER_HOST="${E2E_API_SERVER_HOST:-}" API_SERVER_PORT="${E2E_API_SERVER_PORT:-}" \
			deploy/deploy.sh "$1"
	else
		# FAULT_CONTROL: the fault control socket, for the recipe printed
		# at the end (docs/simulation.md).
		NAMESPACE=demo PLUGIN_NAME=demo RESOURCE_NAME=example.com/sim NUMBER_DEVICES=4 \
			DEVICE_ID_PREFIX=sim DEVICE_FILE_PREFIX=sim ENV_PREFIX=SIM IMAGE="${E2E_PLUGIN_IMAGE:-}" \
			FAULT_CONTROL=true deploy/deploy.sh "$1"
	fi
}

# e2e/local/demo.sh render: print what the demo of MODE deploys, and
# start nothing (deploy/dra_doc_test.go checks docs/dra.md against it).
case ${1:-} in
"") ;;
render)
	demo_deploy render
	exit 0
	;;
*) die "usage: [MODE=device-plugin|dra] e2e/local/demo.sh [render]" ;;
esac

# demo_dra: the node labelled dra, the DRA driver serving the demo's
# resources; the device plugin waits for nodes labelled device-plugin.
demo_dra() {
	# The busybox of example.com/fpga's exec step, where the driver's
	# container sees the node's /var/lib/cdi-device-plugin.
	install -D -m 0755 /bin/busybox /var/lib/cdi-device-plugin/e2e-bin/busybox
	k label node --all cdi-device-plugin/mode=dra --overwrite
	demo_deploy apply
	k -n demo rollout status ds/cdi-dra-driver --timeout=180s
	k -n demo rollout status deploy/cdi-dra-controller --timeout=180s
	echo "waiting for the driver to publish the 4 devices of example.com/sim ..."
	local n=0
	for _ in $(seq 60); do
		n=$(k get resourceslices -o json | grep -c '"string": "example.com/sim"' || true)
		[[ ${n} -ge 4 ]] && break
		sleep 1
	done
	[[ ${n} -ge 4 ]] || die "the driver published ${n} devices of example.com/sim, want 4: kubectl -n demo logs ds/cdi-dra-driver"
	k get deviceclasses
	k get resourceslices
	cat <<EOT

The node stays up, its devices served through DRA. Walk through it:
docs/dra.md (claims, limits-only pods, a shared device, moving the node
to the device plugin and back, preparing before binding). Start with:
  source ${E2E_WORK}/env
  kubectl get resourceslices -o yaml
Tear it down with:  make demo-down   (e2e/local/cluster.sh down: the node, the
  specs, device nodes and state, the DRA driver's claim checkpoint and the
  claim and device-metadata specs of claims still prepared)
EOT
}

# Go from the official tarball, where .ci/run expects it.
command -v go >/dev/null || export PATH=/usr/local/go/bin:${HOME}/go/bin:${PATH}
# A fresh Debian machine: install what is missing first (apt-get).
e2e/local/deps.sh
e2e/local/cluster.sh up
# shellcheck disable=SC1091
source "${E2E_WORK}/env"
k() { "${KUBECTL}" "$@"; }

if [[ ${MODE} == dra ]]; then
	demo_dra
	exit 0
fi

demo_deploy apply
echo "waiting for the node to advertise example.com/sim ..."
for _ in $(seq 120); do
	n=$(k get node -o 'jsonpath={.items[0].status.allocatable.example\.com/sim}' 2>/dev/null || true)
	[[ ${n:-0} -ge 2 ]] && break
	sleep 1
done
k get node -o 'custom-columns=NODE:.metadata.name,CAPACITY:.status.capacity.example\.com/sim,ALLOCATABLE:.status.allocatable.example\.com/sim'

k apply -f - <<EOP
apiVersion: v1
kind: Pod
metadata:
  name: demo
  namespace: demo
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: demo
      image: ${E2E_TEST_IMAGE}
      imagePullPolicy: IfNotPresent
      command: ["sh", "-c", "sleep 1000000"]
      resources:
        limits:
          example.com/sim: 2
EOP
k -n demo wait --for=condition=Ready pod/demo --timeout=180s
echo
echo "==== inside pod demo ===="
# shellcheck disable=SC2016 # expanded in the pod
k -n demo exec demo -- sh -c '
echo "# device nodes of the resource (ls -l /dev/sim-*)"; ls -l /dev/sim-*
echo; echo "# env from Allocate and the CDI spec"; env | grep ^SIM_ | sort
echo; echo "# device state, mounted read-only from the plugin"
for f in /run/cdi-device-plugin/*/state.json; do echo "$f:"; cat "$f"; echo; done'
echo
echo "==== on the node ===="
echo "CDI spec: $(ls /var/run/cdi/k8s.example.com-sim.json)"
node=$(k get node -o 'jsonpath={.items[0].metadata.name}')
cat <<EOT

Make a device fail on purpose (docs/simulation.md), then watch kubectl -n demo get pod demo -o yaml:
  curl --unix-socket /var/lib/cdi-device-plugin/cdi-device-plugin-faults.sock -X POST http://localhost/faults -d '{"device": "sim-${node}-0", "fault": {"kind": "unhealthy", "reason": "demo"}}'

The node stays up. Try:
  source ${E2E_WORK}/env
  kubectl -n demo get pods; kubectl -n demo logs ds/cdi-device-plugin
Tear it down with:  make demo-down   (e2e/local/cluster.sh down: the node, the plugin's
  spec, device nodes and state, the DRA driver's claim checkpoint)
EOT
