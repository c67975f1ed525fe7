{{/* The release's base name: <release>-switchyard, or the release name when it already says switchyard. */}}
{{- define "switchyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "switchyard.labels" -}}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the API keys. */}}
{{- define "switchyard.keysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "switchyard.fullname" .)) -}}
{{- end -}}

{{/* The environment variable carrying a key's text: SWITCHYARD_KEY_<NAME>, upper case, - and . as _. */}}
{{- define "switchyard.keyEnv" -}}
{{- printf "SWITCHYARD_KEY_%s" (. | upper | replace "-" "_" | replace "." "_") -}}
{{- end -}}

{{/* The Redis URL the policy uses, "" for none. */}}
{{- define "switchyard.redisURL" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "switchyard.fullname" .) -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* The gateway's pods and Service (the Redis ones are component redis). */}}
{{- define "switchyard.gatewaySelector" -}}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end -}}
