{{- define "cdi-device-plugin.labels" -}}
app.kubernetes.io/name: cdi-device-plugin
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cdi-device-plugin.selector" -}}
app.kubernetes.io/name: cdi-device-plugin
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The image of both DaemonSets: image.tag, else the chart's appVersion. */}}
{{- define "cdi-device-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The mode, checked: device-plugin, dra or per-node. */}}
{{- define "cdi-device-plugin.mode" -}}
{{- $m := .Values.mode | default "device-plugin" -}}
{{- if not (has $m (list "device-plugin" "dra" "per-node")) -}}
{{- fail (printf "mode must be device-plugin, dra or per-node, not %q" $m) -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/*
The resources served through DRA, as a JSON list: dra.resourceNames, else
the names of the config file's resources, those without replicas above 1
first (the first names the driver, as the binaries' default does; one with
replicas is published as shared devices), else env.RESOURCE_NAME, else the
binary's default.
*/}}
{{- define "cdi-device-plugin.draResources" -}}
{{- $dnsSubdomain := "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" -}}
{{- $names := list -}}
{{- if .Values.dra.resourceNames -}}
{{- $names = .Values.dra.resourceNames -}}
{{- else if .Values.config -}}
{{- $cfg := fromYaml .Values.config -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "config is not YAML: %s" (get $cfg "Error")) -}}
{{- end -}}
{{- $shared := list -}}
{{- range $cfg.resources -}}
{{- if le (int (.replicas | default 1)) 1 -}}
{{- $names = append $names .name -}}
{{- else -}}
{{- $shared = append $shared .name -}}
{{- end -}}
{{- end -}}
{{- $names = concat $names $shared -}}
{{- if not $names -}}
{{- fail "no resource to serve through DRA: the config lists none; set dra.resourceNames" -}}
{{- end -}}
{{- else -}}
{{- $names = list (.Values.env.RESOURCE_NAME | default "example.com/simple-device") -}}
{{- end -}}
{{- range $names -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" .) -}}
{{- fail (printf "%q is not a resource name (<domain>/<name>)" .) -}}
{{- end -}}
{{- $class := include "cdi-device-plugin.className" . -}}
{{- if not (regexMatch $dnsSubdomain $class) -}}
{{- fail (printf "the DeviceClass of %q would be named %q, which is not a DNS subdomain (lower-case alphanumerics, '-' and '.')" . $class) -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* <class>.<domain> of the resource given: its DeviceClass's name. */}}
{{- define "cdi-device-plugin.className" -}}
{{- $p := splitList "/" . -}}
{{- printf "%s.%s" (index $p 1) (index $p 0) -}}
{{- end -}}

{{/* The driver's name: dra.driverName, else the first resource's class name. */}}
{{- define "cdi-device-plugin.driverName" -}}
{{- $d := .Values.dra.driverName -}}
{{- if not $d -}}
{{- $d = include "cdi-device-plugin.className" (first (include "cdi-device-plugin.draResources" . | fromJsonArray)) -}}
{{- end -}}
{{- if or (gt (len $d) 63) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $d)) -}}
{{- fail (printf "invalid driver name %q (a DNS subdomain of at most 63 characters); set dra.driverName" $d) -}}
{{- end -}}
{{- $d -}}
{{- end -}}

{{/* The DRA driver's ServiceAccount. */}}
{{- define "cdi-device-plugin.draServiceAccount" -}}
{{- printf "%s-dra-driver" .Release.Name -}}
{{- end -}}

{{/* The DRA driver's cluster-wide objects: one set per release. */}}
{{- define "cdi-device-plugin.draClusterName" -}}
{{- printf "%s-dra-driver-%s" .Release.Name .Release.Namespace -}}
{{- end -}}

{{- define "cdi-device-plugin.draLabels" -}}
app.kubernetes.io/name: cdi-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cdi-device-plugin.draSelector" -}}
app.kubernetes.io/name: cdi-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The DRA controller's ServiceAccount. */}}
{{- define "cdi-device-plugin.controllerServiceAccount" -}}
{{- printf "%s-dra-controller" .Release.Name -}}
{{- end -}}

{{/* The DRA controller's cluster-wide objects: one set per release. */}}
{{- define "cdi-device-plugin.controllerClusterName" -}}
{{- printf "%s-dra-controller-%s" .Release.Name .Release.Namespace -}}
{{- end -}}

{{- define "cdi-device-plugin.controllerLabels" -}}
app.kubernetes.io/name: cdi-dra-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cdi-device-plugin.controllerSelector" -}}
app.kubernetes.io/name: cdi-dra-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
