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
