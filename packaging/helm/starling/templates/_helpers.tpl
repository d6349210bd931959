{{/* Chart name. */}}
{{- define "starling.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the StatefulSet's, so pods are <fullname>-<ordinal>. */}}
{{- define "starling.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "starling.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "starling.selectorLabels" -}}
app.kubernetes.io/name: {{ include "starling.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "starling.labels" -}}
helm.sh/chart: {{ include "starling.chart" . }}
{{ include "starling.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the database URL. */}}
{{- define "starling.databaseSecret" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecret }}{{ else }}{{ include "starling.fullname" . }}-database{{ end }}
{{- end }}

{{- define "starling.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}database-url{{ end }}
{{- end }}

{{- define "starling.clusterName" -}}
{{- default (include "starling.fullname" .) .Values.nats.clusterName }}
{{- end }}

{{/*
One node's configuration file. Called with (dict "root" $ "ordinal" N).
Starling reads node_id only from its file (no environment variable or flag),
so every pod gets a file of its own, chosen by its pod name.
*/}}
{{- define "starling.nodeConfig" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
# Starling node {{ .ordinal }} of release {{ $root.Release.Name }} (rendered by the Helm chart).
[server]
domains = {{ toJson $v.xmpp.domains }}
data_dir = "/data"
node_id = {{ add $v.nodeIdOffset .ordinal }}

[log]
level = {{ $v.config.logLevel | quote }}
format = {{ $v.config.logFormat | quote }}

[storage]
backend = "postgres"
# url: from STARLING_DATABASE_URL (Secret {{ include "starling.databaseSecret" $root }}).
pool_size = {{ $v.database.poolSize }}

[cluster]
nats_url = {{ required "nats.url is required (an external NATS server)" $v.nats.url | quote }}
name = {{ include "starling.clusterName" $root | quote }}
heartbeat_ms = {{ $v.nats.heartbeatMs }}
node_timeout_ms = {{ $v.nats.nodeTimeoutMs }}

[admin]
listen = [{{ printf "%s:%v" $v.admin.bindAddress $v.admin.port | quote }}]
{{- if $v.tls.existingSecret }}

[tls]
certificate = "/etc/starling/tls/tls.crt"
private_key = "/etc/starling/tls/tls.key"
{{- end }}
{{- with $v.config.extra }}

{{ . }}
{{- end }}
{{- end }}
