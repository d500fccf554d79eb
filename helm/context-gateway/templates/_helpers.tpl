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

{{/* extraEnv by name, as JSON: the checks and the env list look names up in it. */}}
{{- define "context-gateway.extraEnvByName" -}}
{{- $byName := dict -}}
{{- range .Values.gateway.extraEnv -}}
{{- $_ := set $byName .name . -}}
{{- end -}}
{{- toJson $byName -}}
{{- end -}}

{{/*
The shutdown grace the gateway will use: extraEnv's GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS when
it sets one, else gateway.shutdownGraceSeconds; whole seconds, rounded up.
*/}}
{{- define "context-gateway.shutdownGraceSeconds" -}}
{{- $extraEnv := include "context-gateway.extraEnvByName" . | fromJson -}}
{{- $override := get $extraEnv "GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS" -}}
{{- if $override -}}
{{- if not (hasKey $override "value") -}}
{{- fail "gateway.extraEnv: GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS must be a plain value (the pod's termination grace is computed from it); or set gateway.shutdownGraceSeconds" -}}
{{- end -}}
{{- $value := toString $override.value -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $value) -}}
{{- fail (printf "gateway.extraEnv: GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS must be a number of seconds, got %q" $value) -}}
{{- end -}}
{{- ceil (float64 $value) | int -}}
{{- else -}}
{{- .Values.gateway.shutdownGraceSeconds -}}
{{- end -}}
{{- end -}}

{{/* A Prometheus duration (1m30s, 500ms) in milliseconds. */}}
{{- define "context-gateway.durationMillis" -}}
{{- $millisPerUnit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $total = add $total (mul (trimSuffix $unit . | int) (get $millisPerUnit $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Combinations values.schema.json cannot express. Each refusal names the values to change: a
chart that renders is one the gateway (and Kubernetes) will run.
*/}}
{{- define "context-gateway.checks" -}}
{{- $secrets := .Values.secrets -}}
{{- $extraEnv := include "context-gateway.extraEnvByName" . | fromJson -}}
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
{{- /* The gateway refuses an upstream key without gateway keys on 0.0.0.0: an open relay. */ -}}
{{- $upstreamKey := or (hasKey $entries "upstreamApiKey") (hasKey $entries "anthropicApiKey") (hasKey $extraEnv "GATEWAY_UPSTREAM_API_KEY") (hasKey $extraEnv "GATEWAY_UPSTREAM_ANTHROPIC_API_KEY") -}}
{{- $teams := or (hasKey $entries "teams") (hasKey $extraEnv "GATEWAY_TEAMS") -}}
{{- $allowUnauthenticated := dig "server" "allow_unauthenticated" false .Values.gateway.config -}}
{{- with get $extraEnv "GATEWAY_SERVER_ALLOW_UNAUTHENTICATED" -}}
{{- $allowUnauthenticated = has (lower (toString (.value | default ""))) (list "1" "true" "yes" "on") -}}
{{- end -}}
{{- if and $upstreamKey (not $teams) (not $allowUnauthenticated) -}}
{{- fail "an upstream key is set (secrets.upstreamApiKey or anthropicApiKey) but no teams: the gateway would refuse to start, as anyone reaching it could spend that key. Add secrets.teams (gateway keys: context-gateway keys new prints one and its hash), list teams in secrets.existingSecretKeys, or set gateway.config.server.allow_unauthenticated: true if an open relay is what you mean" -}}
{{- end -}}
{{- /* The chart sets these from its own values; the environment would override the file silently. */ -}}
{{- $chartOwned := dict "workers" "gateway.workers" "log_format" "gateway.logFormat" "shutdown_grace_seconds" "gateway.shutdownGraceSeconds" "keep_alive_timeout" "gateway.keepAliveTimeoutSeconds" "host" "the chart (it listens on 0.0.0.0)" "port" "service.port (the container listens on 8080)" -}}
{{- range $key, $instead := $chartOwned -}}
{{- if hasKey ($.Values.gateway.config.server | default dict) $key -}}
{{- fail (printf "gateway.config.server.%s is set by the chart and would be ignored: use %s" $key $instead) -}}
{{- end -}}
{{- end -}}
{{- /* auto counts the CPUs the container may use: without a limit, every CPU of the node. */ -}}
{{- if has (toString .Values.gateway.workers) (list "auto" "0") -}}
{{- if not (dig "limits" "cpu" "" .Values.resources) -}}
{{- fail "gateway.workers auto (or 0) starts one worker per CPU the container may use: set resources.limits.cpu, or a number of workers" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if .Values.serviceMonitor.enabled -}}
{{- $interval := include "context-gateway.durationMillis" .Values.serviceMonitor.interval | int -}}
{{- $timeout := include "context-gateway.durationMillis" .Values.serviceMonitor.scrapeTimeout | int -}}
{{- if lt $interval $timeout -}}
{{- fail (printf "serviceMonitor.scrapeTimeout (%s) is longer than serviceMonitor.interval (%s): Prometheus refuses such a scrape config" .Values.serviceMonitor.scrapeTimeout .Values.serviceMonitor.interval) -}}
{{- end -}}
{{- end -}}
{{- end -}}
