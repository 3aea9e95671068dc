#!/usr/bin/env bash
# Render, apply or delete the cdi-device-plugin DaemonSet, the DRA driver, or
# both (MODE).
#
#   deploy/deploy.sh render|apply|delete
#
# Builds a throw-away kustomize overlay on top of deploy/base (and, for the
# DRA driver, the components in deploy/components) from environment
# variables (see deploy/README.md):
#
#   MODE            device-plugin (default): the device plugin's DaemonSet;
#                   dra: the DRA driver's DaemonSet, its ServiceAccount,
#                   ClusterRole and binding, admission policy, one
#                   DeviceClass per resource, and its controller's
#                   Deployment (one pod in the cluster: prepareBeforeBind)
#                   with its own ServiceAccount, ClusterRole and binding;
#                   per-node: both DaemonSets, on the nodes labelled
#                   cdi-device-plugin/mode=device-plugin and
#                   cdi-device-plugin/mode=dra respectively, and what dra
#                   adds
#   NAMESPACE       target namespace (default: $PLUGIN_NAME if set, else
#                   simple-device-plugin)
#   IMAGE           plugin image (default: cdi-device-plugin:latest); the DRA
#                   driver runs its second binary, /cdi-dra-driver, and
#                   its controller the third, /cdi-dra-controller
#   PLUGIN_NAME RESOURCE_NAME NUMBER_DEVICES DEVICE_ID_PREFIX ANNOTATION_PREFIX
#   ENV_PREFIX DEVICE_FILE_PREFIX DEVICE_LIST_STRATEGY LOG_LEVEL LOG_FORMAT
#   PRESTART_STEPS PRESTART_BUDGET FIRMWARE_IMAGE FIRMWARE_SHA256 SYS_ROOT
#   PROC_ROOT
#                   passed to the plugin's (and the driver's) container env
#                   only when set (an explicitly empty value is passed
#                   through as ""); when unset the binary's default applies.
#   DEV_ROOT        replaces the DaemonSet's /dev as the dev root; it must be
#                   below /dev (the host's /dev is what the pod mounts)
#   PLUGIN_CONFIG   path of a YAML configuration file (docs/configuration.md); when
#                   set it is shipped as the ConfigMap cdi-device-plugin-config
#                   (name suffixed with a content hash, so a change rolls the
#                   DaemonSet) and the plugin runs with CONFIG_FILE pointing
#                   at it. The env-mode resource variables above are then
#                   ignored by the plugin.
#   KUBECTL         kubectl binary (default: kubectl)
#   KUSTOMIZE       kustomize binary, used by render only when kubectl is
#                   missing (default: kustomize)
#
# MODE dra and per-node only:
#   DRA_RESOURCES   comma-separated resource names that get a DeviceClass
#                   (default: RESOURCE_NAME, else the binary's default
#                   example.com/simple-device; required with PLUGIN_CONFIG:
#                   the names of its resources)
#   DRIVER_NAME     the driver's name (default: <class>.<domain> of the first
#                   of DRA_RESOURCES: sim.example.com for example.com/sim);
#                   its controller gets it too
#   DRA_EXTENDED_RESOURCE
#                   true (default): each DeviceClass has extendedResourceName,
#                   so pods asking for the extended resource are served
#                   through DRA; false: claims only
#   API_SERVER_HOST API_SERVER_PORT
#                   where the driver and its controller reach the API
#                   server, when pods cannot reach the kubernetes Service (a
#                   cluster without kube-proxy); set as their
#                   KUBERNETES_SERVICE_HOST/PORT
#   DEVICE_STATUS DEVICE_METADATA STALE_CLAIM_GRACE
#                   passed to the driver's container env alone, as the
#                   plugin settings above (docs/configuration.md)
#
# Side by side: every deployment is one Namespace plus one DaemonSet named
# cdi-device-plugin, so two plugins need two namespaces. To make that the
# default, NAMESPACE falls back to PLUGIN_NAME when PLUGIN_NAME is set:
#   PLUGIN_NAME=fpga RESOURCE_NAME=example.com/fpga deploy/deploy.sh apply
# lands in namespace "fpga" and leaves a default deployment alone, and
# "delete" with the same variables removes only that one. The DRA driver's
# cluster-wide objects (ClusterRole, ClusterRoleBinding, the admission
# policy and its binding) are named cdi-dra-driver-<namespace> for the same
# reason, its controller's cdi-dra-controller-<namespace>.
set -euo pipefail

usage() {
	cat <<'EOF'
usage: deploy/deploy.sh render|apply|delete

  render   print the manifests (kubectl kustomize, or kustomize build)
  apply    kubectl apply the rendered manifests
  delete   kubectl delete --ignore-not-found the rendered manifests

MODE=device-plugin (default), dra or per-node picks what is deployed.
Configured through environment variables; see deploy/README.md.
EOF
}

die() {
	printf 'deploy.sh: %s\n' "$*" >&2
	exit 1
}

# Variables copied into the container env when set in the caller's environment.
ENV_VARS=(
	PLUGIN_NAME
	RESOURCE_NAME
	NUMBER_DEVICES
	DEVICE_ID_PREFIX
	ANNOTATION_PREFIX
	ENV_PREFIX
	DEVICE_FILE_PREFIX
	DEVICE_LIST_STRATEGY
	LOG_LEVEL
	LOG_FORMAT
	PRESTART_STEPS
	PRESTART_BUDGET
	FIRMWARE_IMAGE
	FIRMWARE_SHA256
	SYS_ROOT
	PROC_ROOT
	DEV_ROOT
	FAULT_CONTROL
)

# The DRA driver's own variables, copied into its container's env alone
# (the device plugin does not read them) when set, as ENV_VARS.
DRIVER_VARS=(
	DEVICE_STATUS
	DEVICE_METADATA
	STALE_CLAIM_GRACE
)

# quote VALUE: set REPLY to VALUE as a double-quoted YAML (= JSON) string, so
# that "8", "true", "" or "a: b" all stay strings. (Sets a variable instead of
# printing, so that die is not swallowed by a command substitution.)
quote() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\n'/\\n}
	s=${s//$'\r'/\\r}
	s=${s//$'\t'/\\t}
	if [[ ${s} == *[[:cntrl:]]* ]]; then
		die "value contains a control character: $(printf '%q' "$1")"
	fi
	REPLY="\"${s}\""
}

# env_entries NAME...: set REPLY to the container env entries (of a
# DaemonSet patch) of the variables named that are set in the environment,
# even to "".
env_entries() {
	local var out=''
	for var in "$@"; do
		# Set, even to "" (${!var+x} rather than [[ -v ]], for bash 3.2).
		if [[ -n ${!var+x} ]]; then
			quote "${!var}"
			out+="            - name: ${var}"$'\n'
			out+="              value: ${REPLY}"$'\n'
		fi
	done
	REPLY=${out}
}

# relpath FROM TO: set REPLY to the path of TO relative to the directory FROM
# (both absolute and free of symlinks); kustomize refuses absolute paths to a
# base.
relpath() {
	local common=$1 to=$2 up=''
	while [[ ${to} != "${common}" && ${to} != "${common}"/* ]]; do
		common=${common%/*}
		up+='../'
	done
	if [[ ${to} == "${common}" ]]; then
		REPLY=${up:-.}
	else
		REPLY=${up}${to#"${common}"/}
	fi
}

# The default resource of the binary and the driver that serves it: what
# deploy/components/dra-driver and dra-deviceclass are written for.
DEFAULT_RESOURCE=example.com/simple-device
DEFAULT_DRIVER=simple-device.example.com
KUBELET_PLUGINS_DIR=/var/lib/kubelet/plugins
DNS_SUBDOMAIN='^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'

# dra_settings: check the DRA variables and set DRA_NAMES (the resources
# that get a DeviceClass), CLASSES (their DeviceClass names, <class>.<domain>)
# and DRIVER (the driver's name).
dra_settings() {
	local list r class
	if [[ -n ${DRA_RESOURCES:-} ]]; then
		list=${DRA_RESOURCES}
	elif [[ -n ${PLUGIN_CONFIG:-} ]]; then
		die "MODE=${MODE} with PLUGIN_CONFIG: set DRA_RESOURCES to the names of the resources the file configures (comma-separated; each gets a DeviceClass)"
	else
		list=${RESOURCE_NAME:-${DEFAULT_RESOURCE}}
	fi
	DRA_NAMES=()
	CLASSES=()
	IFS=, read -r -a DRA_NAMES <<<"${list}"
	for r in "${DRA_NAMES[@]}"; do
		# <domain>/<name> as the plugin accepts it (docs/configuration.md);
		# nothing that could leave the CEL string below.
		[[ ${r} =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$ ]] ||
			die "resource '${r}' (DRA_RESOURCES, else RESOURCE_NAME) is not a resource name (<domain>/<name>)"
		class=${r#*/}.${r%%/*}
		[[ ${class} =~ ${DNS_SUBDOMAIN} && ${#class} -le 253 ]] ||
			die "the DeviceClass of resource '${r}' would be named '${class}', which is not a DNS subdomain (lower-case alphanumerics, '-' and '.')"
		[[ " ${CLASSES[*]} " != *" ${class} "* ]] || die "DRA_RESOURCES: '${r}' is listed twice"
		CLASSES+=("${class}")
	done
	((${#CLASSES[@]} > 0)) || die "DRA_RESOURCES is empty"
	DRIVER=${DRIVER_NAME:-${CLASSES[0]}}
	[[ ${DRIVER} =~ ${DNS_SUBDOMAIN} && ${#DRIVER} -le 63 ]] ||
		die "invalid driver name '${DRIVER}' (a DNS subdomain of at most 63 characters); set DRIVER_NAME"
	case ${DRA_EXTENDED_RESOURCE:-true} in
	true | false) ;;
	*) die "DRA_EXTENDED_RESOURCE must be true or false, not '${DRA_EXTENDED_RESOURCE}'" ;;
	esac
}

# write_device_classes FILE: one DeviceClass per resource of DRA_NAMES.
write_device_classes() {
	local i r d
	quote "${DRIVER}"
	d=${REPLY}
	for i in "${!DRA_NAMES[@]}"; do
		r=${DRA_NAMES[i]}
		printf '%s\n' '---' 'apiVersion: resource.k8s.io/v1' 'kind: DeviceClass' 'metadata:'
		printf '  name: %s\n' "${CLASSES[i]}"
		printf '%s\n' '  labels:' '    app.kubernetes.io/name: cdi-dra-driver' 'spec:' '  selectors:' '    - cel:'
		quote "device.driver == ${d} && device.attributes[${d}].resource == \"${r}\""
		printf '        expression: %s\n' "${REPLY}"
		if [[ ${DRA_EXTENDED_RESOURCE:-true} == true ]]; then
			printf '  extendedResourceName: %s\n' "${r}"
		fi
	done >"$1"
}

# write_overlay DIR: write kustomization.yaml (and the patches) into DIR;
# for the DRA modes, the namespaced objects go into DIR/namespaced and DIR
# adds the cluster-scoped ones, which must not get a namespace.
write_overlay() {
	local dir=$1 ns_dir image name tag='' digest='' env='' dra_env='' api_env='' patches=''

	image=${IMAGE:-cdi-device-plugin:latest}
	name=${image}
	if [[ ${name} == *@* ]]; then
		digest=${name#*@}
		name=${name%%@*}
	fi
	# A tag is what follows the last ':' unless that ':' belongs to a
	# registry host:port (then a '/' follows it).
	if [[ ${name} == *:* && ${name##*:} != */* ]]; then
		tag=${name##*:}
		name=${name%:*}
	fi
	[[ -n ${name} ]] || die "IMAGE has no name: $(printf '%q' "${image}")"

	ns_dir=${dir}
	if [[ ${MODE} != device-plugin ]]; then
		dra_settings
		ns_dir=${dir}/namespaced
		mkdir "${ns_dir}"
	fi

	{
		printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization'
		quote "${NAMESPACE}"
		printf 'namespace: %s\n' "${REPLY}"
		relpath "${ns_dir}" "${BASE_DIR}"
		quote "${REPLY}"
		printf 'resources:\n  - %s\n' "${REPLY}"
		if [[ ${MODE} != device-plugin ]]; then
			printf 'components:\n'
			relpath "${ns_dir}" "${COMPONENTS_DIR}"
			printf '  - %s/%s\n' "${REPLY}" dra-driver
			printf '  - %s/%s\n' "${REPLY}" dra-controller
			if [[ ${MODE} == dra ]]; then
				printf '  - %s/%s\n' "${REPLY}" dra-only
			else
				printf '  - %s/%s\n' "${REPLY}" per-node
			fi
		fi
		quote "${name}"
		printf 'images:\n  - name: cdi-device-plugin\n    newName: %s\n' "${REPLY}"
		if [[ -n ${digest} ]]; then
			quote "${digest}"
			printf '    digest: %s\n' "${REPLY}"
		elif [[ -n ${tag} ]]; then
			quote "${tag}"
			printf '    newTag: %s\n' "${REPLY}"
		fi
	} >"${ns_dir}/kustomization.yaml"

	env_entries "${ENV_VARS[@]}"
	env=${REPLY}
	if [[ -n ${PLUGIN_CONFIG:-} ]]; then
		[[ -f ${PLUGIN_CONFIG} && -r ${PLUGIN_CONFIG} ]] || die "PLUGIN_CONFIG: not a readable file: $(printf '%q' "${PLUGIN_CONFIG}")"
		cp -- "${PLUGIN_CONFIG}" "${ns_dir}/config.yaml"
		printf '%s\n' \
			'configMapGenerator:' \
			'  - name: cdi-device-plugin-config' \
			'    files:' \
			'      - config.yaml' >>"${ns_dir}/kustomization.yaml"
		env+="            - name: CONFIG_FILE"$'\n'
		env+="              value: /etc/cdi-device-plugin/config.yaml"$'\n'
	fi

	# The device plugin's claim guard knows the DRA driver's claims by the
	# driver's name: per-node, the driver's; with MODE=device-plugin, the
	# one given (a node switched back from a driver of another name).
	plugin_env=${env}
	if [[ ${MODE} == per-node || (${MODE} == device-plugin && -n ${DRIVER_NAME:-}) ]]; then
		quote "${DRIVER:-${DRIVER_NAME}}"
		plugin_env+="            - name: DRIVER_NAME"$'\n'
		plugin_env+="              value: ${REPLY}"$'\n'
	fi

	# Strategic merge patches: env entries merge by name with the base's
	# list, volumes by name, mounts by path.
	if [[ ${MODE} != dra && -n ${plugin_env} ]]; then
		{
			printf '%s\n' \
				'apiVersion: apps/v1' \
				'kind: DaemonSet' \
				'metadata:' \
				'  name: cdi-device-plugin' \
				'spec:' \
				'  template:' \
				'    spec:' \
				'      containers:' \
				'        - name: cdi-device-plugin' \
				'          env:'
			printf '%s' "${plugin_env}"
			if [[ -n ${PLUGIN_CONFIG:-} ]]; then
				printf '%s\n' \
					'          volumeMounts:' \
					'            - name: config' \
					'              mountPath: /etc/cdi-device-plugin' \
					'              readOnly: true' \
					'      volumes:' \
					'        - name: config' \
					'          configMap:' \
					'            name: cdi-device-plugin-config'
			fi
		} >"${ns_dir}/env-patch.yaml"
		# The target selects the DaemonSet whatever namespace the base gives it.
		patches+="$(printf '%s\n' \
			'  - path: env-patch.yaml' \
			'    target:' \
			'      group: apps' \
			'      kind: DaemonSet' \
			'      name: cdi-device-plugin')"$'\n'
	fi
	if [[ ${MODE} != device-plugin ]]; then
		env_entries "${DRIVER_VARS[@]}"
		dra_env=${env}${REPLY}
		# What the driver and its controller both get: the driver's name
		# and where the API server is.
		quote "${DRIVER}"
		api_env="            - name: DRIVER_NAME"$'\n'
		api_env+="              value: ${REPLY}"$'\n'
		if [[ -n ${API_SERVER_HOST:-}${API_SERVER_PORT:-} ]]; then
			[[ -n ${API_SERVER_HOST:-} && ${API_SERVER_PORT:-} =~ ^[0-9]+$ ]] ||
				die "API_SERVER_HOST and API_SERVER_PORT go together (a host and a port number)"
			quote "${API_SERVER_HOST}"
			api_env+="            - name: KUBERNETES_SERVICE_HOST"$'\n'
			api_env+="              value: ${REPLY}"$'\n'
			quote "${API_SERVER_PORT}"
			api_env+="            - name: KUBERNETES_SERVICE_PORT"$'\n'
			api_env+="              value: ${REPLY}"$'\n'
		fi
		dra_env+=${api_env}
		{
			printf '%s\n' \
				'apiVersion: apps/v1' \
				'kind: DaemonSet' \
				'metadata:' \
				'  name: cdi-dra-driver' \
				'spec:' \
				'  template:' \
				'    spec:' \
				'      containers:' \
				'        - name: cdi-dra-driver' \
				'          env:'
			printf '%s' "${dra_env}"
			printf '%s\n' '          volumeMounts:'
			# The driver's own directory below the kubelet's plugins
			# directory (dra.sock), named after the driver.
			if [[ ${DRIVER} != "${DEFAULT_DRIVER}" ]]; then
				printf '%s\n' \
					"            - mountPath: ${KUBELET_PLUGINS_DIR}/${DEFAULT_DRIVER}" \
					"              \$patch: delete"
			fi
			printf '%s\n' \
				'            - name: plugin-dir' \
				"              mountPath: ${KUBELET_PLUGINS_DIR}/${DRIVER}"
			if [[ -n ${PLUGIN_CONFIG:-} ]]; then
				printf '%s\n' \
					'            - name: config' \
					'              mountPath: /etc/cdi-device-plugin' \
					'              readOnly: true'
			fi
			printf '%s\n' \
				'      volumes:' \
				'        - name: plugin-dir' \
				'          hostPath:' \
				"            path: ${KUBELET_PLUGINS_DIR}/${DRIVER}"
			if [[ -n ${PLUGIN_CONFIG:-} ]]; then
				printf '%s\n' \
					'        - name: config' \
					'          configMap:' \
					'            name: cdi-device-plugin-config'
			fi
		} >"${ns_dir}/dra-patch.yaml"
		patches+="$(printf '%s\n' \
			'  - path: dra-patch.yaml' \
			'    target:' \
			'      group: apps' \
			'      kind: DaemonSet' \
			'      name: cdi-dra-driver')"$'\n'
		# The controller: the same name and API server, and, of the
		# settings, the log's alone (it reads no other).
		env_entries LOG_LEVEL LOG_FORMAT
		{
			printf '%s\n' \
				'apiVersion: apps/v1' \
				'kind: Deployment' \
				'metadata:' \
				'  name: cdi-dra-controller' \
				'spec:' \
				'  template:' \
				'    spec:' \
				'      containers:' \
				'        - name: cdi-dra-controller' \
				'          env:'
			printf '%s' "${api_env}${REPLY}"
		} >"${ns_dir}/controller-patch.yaml"
		patches+="$(printf '%s\n' \
			'  - path: controller-patch.yaml' \
			'    target:' \
			'      group: apps' \
			'      kind: Deployment' \
			'      name: cdi-dra-controller')"$'\n'
	fi
	if [[ -n ${patches} ]]; then
		printf 'patches:\n%s' "${patches}" >>"${ns_dir}/kustomization.yaml"
	fi
	[[ ${MODE} != device-plugin ]] || return 0

	# The cluster-scoped objects, outside the namespace transformer: the
	# DeviceClasses, the admission policy, and a suffix that keeps the
	# cluster-wide names of two deployments (two namespaces) apart.
	write_device_classes "${dir}/deviceclasses.yaml"
	quote "-${NAMESPACE}"
	printf '%s\n' \
		'apiVersion: builtin' \
		'kind: PrefixSuffixTransformer' \
		'metadata:' \
		'  name: cluster-wide-names' \
		"suffix: ${REPLY}" \
		'fieldSpecs:' \
		'  - {group: rbac.authorization.k8s.io, kind: ClusterRole, path: metadata/name}' \
		'  - {group: rbac.authorization.k8s.io, kind: ClusterRoleBinding, path: metadata/name}' \
		'  - {group: admissionregistration.k8s.io, kind: ValidatingAdmissionPolicy, path: metadata/name}' \
		'  - {group: admissionregistration.k8s.io, kind: ValidatingAdmissionPolicyBinding, path: metadata/name}' \
		'  - {group: admissionregistration.k8s.io, kind: ValidatingAdmissionPolicyBinding, path: spec/policyName}' \
		>"${dir}/cluster-wide-names.yaml"
	relpath "${dir}" "${COMPONENTS_DIR}"
	printf '%s\n' \
		'apiVersion: kustomize.config.k8s.io/v1beta1' \
		'kind: Kustomization' \
		'resources:' \
		'  - namespaced' \
		'  - deviceclasses.yaml' \
		'components:' \
		"  - ${REPLY}/dra-admission" \
		'transformers:' \
		'  - cluster-wide-names.yaml' >"${dir}/kustomization.yaml"
	# The admission policy knows the driver by the name its DaemonSet gets
	# (DRIVER_NAME above): its variable driver is a CEL string of it; so
	# does the ClusterRole, whose rule on resourceclaims/driver (the status
	# of the claims it prepares) names it. The name is a DNS subdomain
	# (checked above): nothing to escape.
	printf '%s\n' \
		'patches:' \
		'  - target:' \
		'      group: admissionregistration.k8s.io' \
		'      kind: ValidatingAdmissionPolicy' \
		'    patch: |-' \
		'      - op: test' \
		'        path: /spec/variables/3/name' \
		'        value: driver' \
		'      - op: replace' \
		'        path: /spec/variables/3/expression' \
		"        value: '\"${DRIVER}\"'" \
		'  - target:' \
		'      group: rbac.authorization.k8s.io' \
		'      kind: ClusterRole' \
		'      name: cdi-dra-driver' \
		'    patch: |-' \
		'      - op: test' \
		'        path: /rules/4/resources/0' \
		'        value: resourceclaims/driver' \
		'      - op: replace' \
		'        path: /rules/4/resourceNames/0' \
		"        value: ${DRIVER}" >>"${dir}/kustomization.yaml"
}

# render DIR: print the built manifests of the overlay in DIR.
render() {
	local dir=$1
	if command -v "${KUBECTL}" >/dev/null 2>&1; then
		"${KUBECTL}" kustomize "${dir}"
	elif command -v "${KUSTOMIZE}" >/dev/null 2>&1; then
		"${KUSTOMIZE}" build "${dir}"
	else
		die "neither '${KUBECTL}' nor '${KUSTOMIZE}' found in PATH; install kubectl or kustomize (or set KUBECTL / KUSTOMIZE)"
	fi
}

main() {
	if [[ $# -ne 1 ]]; then
		usage >&2
		exit 2
	fi
	local cmd=$1
	case ${cmd} in
	render | apply | delete) ;;
	-h | --help | help)
		usage
		exit 0
		;;
	*)
		usage >&2
		exit 2
		;;
	esac

	KUBECTL=${KUBECTL:-kubectl}
	KUSTOMIZE=${KUSTOMIZE:-kustomize}
	MODE=${MODE:-device-plugin}
	case ${MODE} in
	device-plugin | dra | per-node) ;;
	*) die "MODE must be device-plugin, dra or per-node, not '${MODE}'" ;;
	esac
	NAMESPACE=${NAMESPACE:-${PLUGIN_NAME:-simple-device-plugin}}
	if [[ ! ${NAMESPACE} =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ || ${#NAMESPACE} -gt 63 ]]; then
		die "invalid namespace '${NAMESPACE}' (a DNS-1123 label: lower-case alphanumerics and '-', at most 63 characters); set NAMESPACE"
	fi

	local script_dir
	script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
	BASE_DIR=${script_dir}/base
	[[ -f ${BASE_DIR}/kustomization.yaml ]] || die "base not found: ${BASE_DIR}"
	COMPONENTS_DIR=${script_dir}/components

	TMP_DIR=$(mktemp -d)
	trap 'rm -rf -- "${TMP_DIR}"' EXIT
	# Without symlinks, for relpath (macOS: /var -> /private/var).
	TMP_DIR=$(cd -- "${TMP_DIR}" && pwd -P)

	write_overlay "${TMP_DIR}"

	if [[ ${cmd} == render ]]; then
		render "${TMP_DIR}"
		return
	fi

	command -v "${KUBECTL}" >/dev/null 2>&1 || die "'${KUBECTL}' not found in PATH (needed for ${cmd})"
	# Render completely before calling kubectl, so a failed render never
	# reaches the cluster half-way.
	render "${TMP_DIR}" >"${TMP_DIR}/manifests.yaml"
	case ${cmd} in
	apply) "${KUBECTL}" apply -f - <"${TMP_DIR}/manifests.yaml" ;;
	delete) "${KUBECTL}" delete --ignore-not-found -f - <"${TMP_DIR}/manifests.yaml" ;;
	*) die "unknown command: ${cmd}" ;;
	esac
}

main "$@"
