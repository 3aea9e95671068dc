#!/usr/bin/env bash
# make demo: bring the local node up, deploy the plugin with 4 simulated
# devices, run a pod that asks for 2 and print what it sees. The node stays
# up; "make demo-down" (e2e/local/cluster.sh down) removes it, with the
# plugin's spec, device nodes and state and the DRA driver's claim
# checkpoint. On a machine that has a kubelet of its own, cluster.sh up
# refuses and says what to do (README.md, "Quick start").
set -euo pipefail
LOG_TAG=demo
# shellcheck source=e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
cd "${REPO}"
E2E_WORK=${E2E_WORK:-/var/lib/cdi-device-plugin-e2e}
export E2E_WORK

# Go from the official tarball, where .ci/run expects it.
command -v go >/dev/null || export PATH=/usr/local/go/bin:${HOME}/go/bin:${PATH}
# A fresh Debian machine: install what is missing first (apt-get).
e2e/local/deps.sh
e2e/local/cluster.sh up
# shellcheck disable=SC1091
source "${E2E_WORK}/env"
k() { "${KUBECTL}" "$@"; }

NAMESPACE=demo PLUGIN_NAME=demo RESOURCE_NAME=example.com/sim NUMBER_DEVICES=4 \
	DEVICE_ID_PREFIX=sim DEVICE_FILE_PREFIX=sim ENV_PREFIX=SIM IMAGE="${E2E_PLUGIN_IMAGE}" \
	deploy/deploy.sh apply
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
cat <<EOT

The node stays up. Try:
  source ${E2E_WORK}/env
  kubectl -n demo get pods; kubectl -n demo logs ds/cdi-device-plugin
Tear it down with:  make demo-down   (e2e/local/cluster.sh down: the node, the plugin's
  spec, device nodes and state, the DRA driver's claim checkpoint)
EOT
