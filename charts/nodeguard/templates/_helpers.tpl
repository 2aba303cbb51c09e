{{- define "nodeguard.fullname" -}}
{{- default "nodeguard" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeguard.selectorLabels" -}}
app.kubernetes.io/name: nodeguard
{{- end -}}

{{- define "nodeguard.labels" -}}
{{ include "nodeguard.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "nodeguard.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
