# shellcheck shell=bash
# e2e/lib.sh: what every script of e2e/ and cmd/dp-bench/peers.sh shares.
# Source it after setting LOG_TAG (the tag of log lines). It sets REPO (the
# repository root), E2E_CACHE (where built components are cached), the
# pinned versions of e2e/versions.env (a variable already set in the
# environment wins), FEATURE_GATES (the versions.env line of K8S_VERSION's
# minor, unless set in the environment), and defines log, die,
# feature_gates_yaml, kcm_controllers, k8s_wrapper, k8s_build and run_suite.

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
E2E_CACHE=${E2E_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/cdi-device-plugin-e2e}
export E2E_CACHE
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

# The versions; the environment wins.
while IFS='=' read -r _name _value; do
	[[ ${_name} =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
	[[ -n ${!_name:-} ]] || printf -v "${_name}" '%s' "${_value}"
done <"${REPO}/e2e/versions.env"
unset _name _value

# FEATURE_GATES: FEATURE_GATES_<major>_<minor> of K8S_VERSION (e2e/versions.env
# has a line per minor), unless the environment sets it. When there is none,
# FEATURE_GATES_MISSING says why and feature_gates_yaml dies with it.
FEATURE_GATES_MISSING=
if [[ -z ${FEATURE_GATES:-} ]]; then
	FEATURE_GATES=
	if [[ ${K8S_VERSION} =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+ ]]; then
		_gates=FEATURE_GATES_${BASH_REMATCH[1]}_${BASH_REMATCH[2]}
		FEATURE_GATES=${!_gates:-}
		[[ -n ${FEATURE_GATES} ]] || FEATURE_GATES_MISSING="e2e/versions.env has no ${_gates} for K8S_VERSION=${K8S_VERSION} (add one with the gates that version needs set, or set FEATURE_GATES)"
		unset _gates
	else
		FEATURE_GATES_MISSING="K8S_VERSION=${K8S_VERSION} is not vMAJOR.MINOR.PATCH: no feature gates for it (set FEATURE_GATES)"
	fi
fi

# feature_gates_yaml INDENT: FEATURE_GATES (Name=true,Other=false) as the
# lines of a YAML map, each indented by INDENT (KubeletConfiguration's and
# kind's featureGates); a malformed entry dies.
feature_gates_yaml() {
	local indent=$1 gate gates
	[[ -z ${FEATURE_GATES_MISSING} ]] || die "${FEATURE_GATES_MISSING}"
	IFS=, read -r -a gates <<<"${FEATURE_GATES}"
	((${#gates[@]} > 0)) || die "FEATURE_GATES is empty"
	for gate in "${gates[@]}"; do
		[[ ${gate} =~ ^[A-Za-z][A-Za-z0-9]*=(true|false)$ ]] || die "FEATURE_GATES: '${gate}' is not Name=true or Name=false"
		printf '%s%s: %s\n' "${indent}" "${gate%%=*}" "${gate#*=}"
	done
}

# kcm_controllers KCM: the --controllers value of the local node's
# kube-controller-manager KCM: every default controller but those a cloud or
# node IPAM needs, each named only when KCM lists it in its --help (1.37
# dropped cloud-node-lifecycle, node-route and service-lb, and refuses to
# disable a controller it does not know).
kcm_controllers() {
	local known c list='*'
	known=$("$1" --help 2>&1 | sed -n 's/^[[:space:]]*All controllers: //p')
	[[ -n ${known} ]] || die "$1 --help lists no controllers (All controllers: ...)"
	for c in node-ipam-controller cloud-node-lifecycle-controller node-route-controller service-lb-controller; do
		[[ ", ${known}," != *", ${c},"* ]] || list+=",-${c}"
	done
	printf '%s' "${list}"
}

# remove_metadata_specs CDI_DIR PLUGINS_DIR SINCE: remove the CDI specs the
# DRA kubelet plugin helper writes for a claim's device metadata
# (<driver>_metadata_<claim UID>_<request>.json), newer than the file SINCE,
# whose every mount is a file below PLUGINS_DIR/<driver>/dra-device-metadata/
# (the kubelet's plugins directory): once that directory is gone they name
# files that are not there. Any other spec is left alone.
remove_metadata_specs() {
	local cdi=$1 plugins=$2 since=$3 spec p n
	for spec in "${cdi}"/*_metadata_*.json; do
		[[ -f ${spec} && ! -L ${spec} && ${spec} -nt ${since} ]] || continue
		n=0
		while read -r p; do
			[[ ${p} == "${plugins}"/*/dra-device-metadata/* ]] || continue 2
			n=$((n + 1))
		done < <(grep -Eo '"hostPath": ?"[^"]*"' "${spec}" | sed 's/.*"\([^"]*\)"$/\1/')
		((n > 0)) && rm -f -- "${spec}"
	done
	return 0
}

# log MSG...: a progress line on stderr, tagged with LOG_TAG and the time.
log() { printf '[%s %s] %s\n' "${LOG_TAG:-${0##*/}}" "$(date +%T)" "$*" >&2; }

# die MSG...: the message on stderr, named after the script; exit 1.
die() {
	printf '%s: %s\n' "${0##*/}" "$*" >&2
	exit 1
}

# k8s_wrapper DIR MODULE TOOLS_GO: make DIR (once; .ready marks it done) a
# Go module named MODULE that requires k8s.io/kubernetes@K8S_VERSION, with
# a replace line per staging module (k8s.io/X => k8s.io/X v0.<minor>.<patch>,
# as k8s.io/kubernetes's own go.mod points them at ./staging), and TOOLS_GO
# as its tools.go (the commands it imports are what "go mod tidy" keeps).
# A ready wrapper whose tools.go differs gets the new one and is tidied.
k8s_wrapper() {
	local dir=$1 module=$2 tools=$3 gomod
	if [[ -f ${dir}/.ready ]] && ! cmp -s <(printf '%s\n' "${tools}") "${dir}/tools.go"; then
		rm -f "${dir}/.ready"
		printf '%s\n' "${tools}" >"${dir}/tools.go"
		(cd "${dir}" && go mod tidy >&2)
		touch "${dir}/.ready"
	fi
	[[ ! -f ${dir}/.ready ]] || return 0
	rm -rf "${dir}"
	mkdir -p "${dir}"
	printf 'module %s\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n' "${module}" "${K8S_VERSION}" >"${dir}/go.mod"
	gomod=$(cd "${dir}" && go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -f ${gomod} ]] || die "go.mod of k8s.io/kubernetes@${K8S_VERSION} not found"
	awk -v v="v0.${K8S_VERSION#v1.}" '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// { print "replace " $1 " => " $1 " " v }' "${gomod}" >>"${dir}/go.mod"
	grep -q '^replace k8s.io/api ' "${dir}/go.mod" || die "no staging replaces found in ${gomod}"
	printf '%s\n' "${tools}" >"${dir}/tools.go"
	(cd "${dir}" && go mod tidy >&2)
	touch "${dir}/.ready"
}

# k8s_build DIR PACKAGE OUT [LDFLAGS]: build PACKAGE of the wrapper in DIR
# into OUT, through a temporary name, so an interrupted build leaves
# nothing half-written.
k8s_build() {
	local dir=$1 pkg=$2 out=$3 ld=${4:--s -w} tmp
	tmp=$(dirname -- "${out}")/.$(basename -- "${out}").tmp
	(cd "${dir}" && CGO_ENABLED=0 go build -trimpath -ldflags "${ld}" -o "${tmp}" "${pkg}")
	mv -f "${tmp}" "${out}"
}

# k8s_version_ldflags: the -X flags that make a command of K8S_VERSION
# report its version, as the Kubernetes release build does.
k8s_version_ldflags() {
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	printf '%s' "-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
	printf '%s' " -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
}

# run_suite LOG [GO TEST ARGS...]: run the e2e suite against the cluster
# the environment describes, its output also in LOG (when not empty);
# returns its status and says how long it took. E2E_RUN, when set, is go
# test's -run pattern: a subset of the suite (make e2e E2E_RUN=...).
run_suite() {
	local logfile=$1 rc=0 t0=${SECONDS} run=()
	shift
	[[ -z ${E2E_RUN:-} ]] || run=(-run "${E2E_RUN}")
	log "running the suite${E2E_RUN:+ (-run ${E2E_RUN})}${E2E_ARTIFACTS:+ (artifacts: ${E2E_ARTIFACTS})}"
	set +e
	(cd -- "${REPO}" && go test -tags e2e -count=1 -timeout "${E2E_TIMEOUT:-30m}" -v ./e2e/ "${run[@]}" "$@") 2>&1 | tee "${logfile:-/dev/null}"
	rc=${PIPESTATUS[0]}
	set -e
	if ((rc == 0)); then
		log "suite passed in $((SECONDS - t0)) s"
	else
		log "suite failed (status ${rc}) after $((SECONDS - t0)) s"
	fi
	return "${rc}"
}
