{{- define "context-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "context-gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "context-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "context-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "context-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "context-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "context-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "context-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "context-gateway.secretName" -}}
{{- default (include "context-gateway.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/*
The Secret entries the gateway reads, as a JSON object: entry name -> environment variable.
With existingSecret, the entries existingSecretKeys lists; else the inline values that are set
(the chart's Secret holds those only).
*/}}
{{- define "context-gateway.secretEntries" -}}
{{- $envNames := dict
  "upstreamApiKey" "GATEWAY_UPSTREAM_API_KEY"
  "anthropicApiKey" "GATEWAY_UPSTREAM_ANTHROPIC_API_KEY"
  "summarizerApiKey" "GATEWAY_COMPRESSION_SUMMARIZER_API_KEY"
  "redisUrl" "GATEWAY_REDIS_URL"
  "teams" "GATEWAY_TEAMS" -}}
{{- $held := dict -}}
{{- range $entry, $envName := $envNames -}}
{{- if $.Values.secrets.existingSecret -}}
{{- if has $entry $.Values.secrets.existingSecretKeys -}}
{{- $_ := set $held $entry $envName -}}
{{- end -}}
{{- else if index $.Values.secrets $entry -}}
{{- $_ := set $held $entry $envName -}}
{{- end -}}
{{- end -}}
{{- toJson $held -}}
{{- end -}}

{{/*
Combinations values.schema.json cannot express. Each refusal names the values to change: a
chart that renders is one the gateway (and Kubernetes) will run.
*/}}
{{- define "context-gateway.checks" -}}
{{- $secrets := .Values.secrets -}}
{{- $entries := include "context-gateway.secretEntries" . | fromJson -}}
{{- /* Inline values beside existingSecret would otherwise be dropped without a word. */ -}}
{{- if $secrets.existingSecret -}}
{{- range $entry := list "upstreamApiKey" "anthropicApiKey" "summarizerApiKey" "redisUrl" "teams" -}}
{{- if index $secrets $entry -}}
{{- fail (printf "secrets.%s is set beside secrets.existingSecret, which replaces the chart's Secret: put it in %s (and list %s in secrets.existingSecretKeys), or unset existingSecret" $entry $secrets.existingSecret $entry) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $secrets.redisUrlSecretRef -}}
{{- if hasKey $entries "redisUrl" -}}
{{- fail "secrets.redisUrlSecretRef and secrets.redisUrl (or redisUrl in secrets.existingSecretKeys) both name the Redis URL: keep one" -}}
{{- end -}}
{{- end -}}
{{- end -}}
