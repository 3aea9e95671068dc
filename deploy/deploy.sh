#!/usr/bin/env bash
# Render, apply or delete the cdi-device-plugin DaemonSet.
#
#   deploy/deploy.sh render|apply|delete
#
# Builds a throw-away kustomize overlay on top of deploy/base from environment
# variables (see deploy/README.md):
#
#   NAMESPACE       target namespace (default: $PLUGIN_NAME if set, else
#                   simple-device-plugin)
#   IMAGE           plugin image (default: cdi-device-plugin:latest)
#   PLUGIN_NAME RESOURCE_NAME NUMBER_DEVICES DEVICE_ID_PREFIX ANNOTATION_PREFIX
#   ENV_PREFIX DEVICE_FILE_PREFIX DEVICE_LIST_STRATEGY LOG_LEVEL LOG_FORMAT
#   PRESTART_STEPS PRESTART_BUDGET SYS_ROOT PROC_ROOT
#                   passed to the plugin's container env only when set (an
#                   explicitly empty value is passed through as ""); when unset
#                   the binary's default applies.
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
# Side by side: every deployment is one Namespace plus one DaemonSet named
# cdi-device-plugin, so two plugins need two namespaces. To make that the
# default, NAMESPACE falls back to PLUGIN_NAME when PLUGIN_NAME is set:
#   PLUGIN_NAME=fpga RESOURCE_NAME=example.com/fpga deploy/deploy.sh apply
# lands in namespace "fpga" and leaves a default deployment alone, and
# "delete" with the same variables removes only that one.
set -euo pipefail

usage() {
	cat <<'EOF'
usage: deploy/deploy.sh render|apply|delete

  render   print the manifests (kubectl kustomize, or kustomize build)
  apply    kubectl apply the rendered manifests
  delete   kubectl delete --ignore-not-found the rendered manifests

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

# write_overlay DIR: write kustomization.yaml (and the env patch) into DIR.
write_overlay() {
	local dir=$1 image name tag='' digest='' var env=''

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

	{
		printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization'
		quote "${NAMESPACE}"
		printf 'namespace: %s\n' "${REPLY}"
		relpath "${dir}" "${BASE_DIR}"
		quote "${REPLY}"
		printf 'resources:\n  - %s\n' "${REPLY}"
		quote "${name}"
		printf 'images:\n  - name: cdi-device-plugin\n    newName: %s\n' "${REPLY}"
		if [[ -n ${digest} ]]; then
			quote "${digest}"
			printf '    digest: %s\n' "${REPLY}"
		elif [[ -n ${tag} ]]; then
			quote "${tag}"
			printf '    newTag: %s\n' "${REPLY}"
		fi
	} >"${dir}/kustomization.yaml"

	for var in "${ENV_VARS[@]}"; do
		# Set, even to "" (${!var+x} rather than [[ -v ]], for bash 3.2).
		if [[ -n ${!var+x} ]]; then
			quote "${!var}"
			env+="            - name: ${var}"$'\n'
			env+="              value: ${REPLY}"$'\n'
		fi
	done
	if [[ -n ${PLUGIN_CONFIG:-} ]]; then
		[[ -f ${PLUGIN_CONFIG} && -r ${PLUGIN_CONFIG} ]] || die "PLUGIN_CONFIG: not a readable file: $(printf '%q' "${PLUGIN_CONFIG}")"
		cp -- "${PLUGIN_CONFIG}" "${dir}/config.yaml"
		printf '%s\n' \
			'configMapGenerator:' \
			'  - name: cdi-device-plugin-config' \
			'    files:' \
			'      - config.yaml' >>"${dir}/kustomization.yaml"
		env+="            - name: CONFIG_FILE"$'\n'
		env+="              value: /etc/cdi-device-plugin/config.yaml"$'\n'
	fi
	[[ -n ${env} ]] || return 0

	# Strategic merge patch: env entries merge by name with the base's list.
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
		printf '%s' "${env}"
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
	} >"${dir}/env-patch.yaml"
	# The target selects the DaemonSet whatever namespace the base gives it.
	printf '%s\n' \
		'patches:' \
		'  - path: env-patch.yaml' \
		'    target:' \
		'      group: apps' \
		'      kind: DaemonSet' \
		'      name: cdi-device-plugin' >>"${dir}/kustomization.yaml"
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
	NAMESPACE=${NAMESPACE:-${PLUGIN_NAME:-simple-device-plugin}}
	if [[ ! ${NAMESPACE} =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ || ${#NAMESPACE} -gt 63 ]]; then
		die "invalid namespace '${NAMESPACE}' (a DNS-1123 label: lower-case alphanumerics and '-', at most 63 characters); set NAMESPACE"
	fi

	local script_dir
	script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
	BASE_DIR=${script_dir}/base
	[[ -f ${BASE_DIR}/kustomization.yaml ]] || die "base not found: ${BASE_DIR}"

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
