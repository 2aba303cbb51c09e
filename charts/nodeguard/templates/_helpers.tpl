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

{{/*
nodeguard.managedNodes is the one place that says which nodes nodeguard
manages: it renders both --node-selector and the webhooks' objectSelector.
Values of the replaced nodeguard.nodeSelector and webhook.objectSelector
fail the install instead of being silently ignored.
*/}}
{{- define "nodeguard.managedNodes" -}}
{{- if .Values.nodeguard.nodeSelector }}
{{- fail "nodeguard.nodeSelector was replaced by nodeguard.managedNodes, a label selector ({matchLabels: {...}, matchExpressions: [...]}) that scopes both nodeguard and its webhooks" }}
{{- end }}
{{- if (.Values.webhook).objectSelector }}
{{- fail "webhook.objectSelector was replaced by nodeguard.managedNodes, which sets the webhooks' objectSelector and nodeguard's --node-selector" }}
{{- end }}
{{- $sel := .Values.nodeguard.managedNodes | default dict -}}
{{- range $k, $_ := $sel }}
{{- if not (has $k (list "matchLabels" "matchExpressions")) }}
{{- fail (printf "nodeguard.managedNodes.%s: a label selector has only matchLabels and matchExpressions" $k) }}
{{- end }}
{{- end }}
{{- toJson $sel -}}
{{- end -}}

{{/* --node-selector's value (the labels.Parse syntax) for nodeguard.managedNodes; empty for every node. */}}
{{- define "nodeguard.managedNodesFlag" -}}
{{- $sel := include "nodeguard.managedNodes" . | fromJson -}}
{{- $terms := list -}}
{{- range $key, $value := $sel.matchLabels }}
{{- if not (kindIs "string" $value) }}
{{- fail (printf "nodeguard.managedNodes.matchLabels.%s: quote the value (%v), label values are strings" $key $value) }}
{{- end }}
{{- $terms = append $terms (printf "%s=%s" $key $value) }}
{{- end }}
{{- range $sel.matchExpressions }}
{{- if eq .operator "In" }}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq .operator "NotIn" }}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq .operator "Exists" }}
{{- $terms = append $terms .key }}
{{- else if eq .operator "DoesNotExist" }}
{{- $terms = append $terms (printf "!%s" .key) }}
{{- else }}
{{- fail (printf "nodeguard.managedNodes.matchExpressions: operator %v is not In, NotIn, Exists or DoesNotExist" .operator) }}
{{- end }}
{{- end }}
{{- join "," $terms -}}
{{- end -}}

{{/* The webhooks' objectSelector for nodeguard.managedNodes; nothing for every node. */}}
{{- define "nodeguard.webhookObjectSelector" -}}
{{- $sel := include "nodeguard.managedNodes" . | fromJson -}}
{{- if $sel }}
objectSelector:
  {{- toYaml $sel | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
nodeguard's --delete-admission-timeout: 1s below webhook.timeoutSeconds, the
timeoutSeconds of its DELETE and eviction webhooks, so that nodeguard always answers (at
worst "retry") before the API server gives up on it.
*/}}
{{- define "nodeguard.deleteAdmissionTimeout" -}}
{{- printf "%ds" (sub (int .Values.webhook.timeoutSeconds) 1) -}}
{{- end -}}
