{{/* Names, labels and the derived settings every template shares. */}}

{{- define "render-service.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "render-service.fullname" -}}
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

{{- define "render-service.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "render-service.selectorLabels" -}}
app.kubernetes.io/name: {{ include "render-service.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "render-service.labels" -}}
helm.sh/chart: {{ include "render-service.chart" . }}
{{ include "render-service.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: render-service
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "render-service.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "render-service.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "render-service.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "render-service.redisName" -}}
{{- printf "%s-redis" (include "render-service.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* true when the render pods get a Redis URL (in-cluster or external). */}}
{{- define "render-service.redisEnabled" -}}
{{- if or .Values.redis.inCluster.enabled .Values.redis.external.url .Values.redis.external.existingSecret .Values.redis.external.sentinel.hosts -}}true{{- end -}}
{{- end -}}

{{/* The CA bundle file of --ssl-ca-certs (mounted from tls.caSecret or tls.existingSecret). */}}
{{- define "render-service.tlsCaFile" -}}
{{- printf "%s-ca/ca.crt" (trimSuffix "/" .Values.tls.mountPath) -}}
{{- end -}}

{{/*
A probe's action for (list $ path): HTTP(S) GET of the path; with mutual TLS required, a TCP check
(the kubelet has no client certificate; a worker listens only once the model is loaded).
*/}}
{{- define "render-service.probeAction" -}}
{{- $root := index . 0 -}}
{{- if and $root.Values.tls.enabled (eq (int $root.Values.tls.certReqs) 2) -}}
tcpSocket:
  port: http
{{- else -}}
httpGet:
  path: {{ index . 1 }}
  port: http
  {{- if $root.Values.tls.enabled }}
  scheme: HTTPS
  {{- end }}
{{- end -}}
{{- end -}}

{{/* true when the chart's ConfigMap exists (template override and/or default template kwargs). */}}
{{- define "render-service.configMapEnabled" -}}
{{- if or .Values.chatTemplate.override .Values.defaultChatTemplateKwargs -}}true{{- end -}}
{{- end -}}

{{/* The chat template file path the container gets, when the template comes from a ConfigMap. */}}
{{- define "render-service.chatTemplateFile" -}}
{{- printf "%s/chat_template.jinja" (trimSuffix "/" .Values.chatTemplate.mountPath) -}}
{{- end -}}

{{/*
A config value rendered as the string the service parses from RENDER_<FLAG>: lists joined by
spaces (nargs="+" flags), objects as JSON, whole numbers without an exponent (YAML numbers arrive
as float64), booleans as true/false.
*/}}
{{- define "render-service.envValue" -}}
{{- $v := . -}}
{{- if kindIs "slice" $v -}}
{{- join " " $v -}}
{{- else if kindIs "map" $v -}}
{{- toJson $v -}}
{{- else if kindIs "float64" $v -}}
{{- if eq $v (floor $v) -}}{{- int64 $v -}}{{- else -}}{{- $v -}}{{- end -}}
{{- else -}}
{{- toString $v -}}
{{- end -}}
{{- end -}}

{{/* Checks that fail the install with a message instead of a crash-looping pod. */}}
{{- define "render-service.validate" -}}
{{- if not .Values.model.name -}}
{{- fail "model.name is required: a Hugging Face id (e.g. Qwen/Qwen3-8B) or a path in the container (e.g. /models/qwen3 with model.volume)" -}}
{{- end -}}
{{- if and .Values.redis.inCluster.enabled (or .Values.redis.external.url .Values.redis.external.existingSecret) -}}
{{- fail "set either redis.inCluster.enabled or redis.external, not both" -}}
{{- end -}}
{{- if and (include "render-service.redisEnabled" .) (not .Values.snapshotKey.existingSecret) -}}
{{- fail "Redis needs a shared snapshot HMAC key: set snapshotKey.existingSecret (kubectl create secret generic render-snapshot-key --from-literal=snapshot-key=\"$(openssl rand -hex 32)\")" -}}
{{- end -}}
{{- $templates := 0 -}}
{{- range (list .Values.chatTemplate.override .Values.chatTemplate.existingConfigMap .Values.chatTemplate.path) -}}
{{- if . -}}{{- $templates = add1 $templates -}}{{- end -}}
{{- end -}}
{{- if gt $templates 1 -}}
{{- fail "set at most one of chatTemplate.override, chatTemplate.existingConfigMap and chatTemplate.path" -}}
{{- end -}}
{{- if and .Values.config.enableAutoToolChoice (not .Values.config.toolCallParser) -}}
{{- fail "config.enableAutoToolChoice needs config.toolCallParser (hermes or qwen3_json)" -}}
{{- end -}}
{{- $drain := add (int .Values.shutdown.preStopSleepSeconds) 35 -}}
{{- if lt (int .Values.shutdown.terminationGracePeriodSeconds) $drain -}}
{{- fail (printf "shutdown.terminationGracePeriodSeconds must be at least preStopSleepSeconds + 30 s of drain + 5 s (%d)" $drain) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" -}}
{{- end -}}
{{- if and .Values.audit.enabled (not .Values.audit.engines) -}}
{{- fail "audit.enabled needs at least one engine URL in audit.engines" -}}
{{- end -}}
{{- $external := .Values.redis.external -}}
{{- if and $external.sentinel.hosts (not $external.sentinel.masterName) -}}
{{- fail "redis.external.sentinel.hosts needs redis.external.sentinel.masterName (the master set's name, e.g. mymaster)" -}}
{{- end -}}
{{- if and $external.sentinel.masterName (not $external.sentinel.hosts) -}}
{{- fail "redis.external.sentinel.masterName needs redis.external.sentinel.hosts (host:port of each sentinel)" -}}
{{- end -}}
{{- if and $external.sentinel.hosts $external.cluster -}}
{{- fail "set either redis.external.sentinel or redis.external.cluster, not both" -}}
{{- end -}}
{{- if and .Values.redis.inCluster.enabled (or $external.cluster $external.sentinel.hosts $external.tls.existingSecret) -}}
{{- fail "redis.external.cluster, .sentinel and .tls apply to an external Redis, not to redis.inCluster" -}}
{{- end -}}
{{- if and $external.tls.certKey (not $external.tls.keyKey) -}}
{{- fail "redis.external.tls.certKey needs redis.external.tls.keyKey" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- fail "tls.enabled needs tls.existingSecret (a Secret with the certificate and key, e.g. from cert-manager)" -}}
{{- end -}}
{{- if not (has (int .Values.tls.certReqs) (list 0 1 2)) -}}
{{- fail "tls.certReqs must be 0 (none), 1 (optional) or 2 (required)" -}}
{{- end -}}
{{- if and .Values.tls.enabled (gt (int .Values.tls.certReqs) 0) (not .Values.tls.caKey) -}}
{{- fail "tls.certReqs 1 or 2 needs tls.caKey (the CA bundle that signs client certificates)" -}}
{{- end -}}
{{- if and .Values.tls.enabled (eq (int .Values.tls.certReqs) 2) .Values.audit.enabled -}}
{{- fail "the audit CronJob has no client certificate: it cannot reach a service with tls.certReqs 2" -}}
{{- end -}}
{{- if not (has .Values.podAntiAffinity.type (list "" "soft" "hard")) -}}
{{- fail "podAntiAffinity.type must be \"\", soft or hard" -}}
{{- end -}}
{{- end -}}
