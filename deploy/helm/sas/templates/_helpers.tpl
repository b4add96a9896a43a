{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "sas.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sas.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "scheduler"). */}}
{{- define "sas.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sas.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "sas.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "sas.fullname" .)) -}}
{{- end -}}

{{/* A database URL for a login: (dict "root" $ "user" "sas_scheduler_login"), with "hosts" a partition's. No password: it is a file. */}}
{{- define "sas.databaseURL" -}}
{{- $db := .root.Values.database -}}
{{- printf "postgres://%s@%s/%s" (.user | urlquery) (.hosts | default $db.hosts) ($db.name | urlquery) -}}
{{- with $db.params }}?{{ . }}{{ end -}}
{{- end -}}

{{/* The broker URLs for a user, one per node, comma-separated. */}}
{{- define "sas.amqpURL" -}}
{{- $b := .root.Values.broker -}}
{{- $vhost := ternary "" ($b.vhost | urlquery) (eq $b.vhost "/") -}}
{{- $user := .user -}}
{{- $urls := list -}}
{{- range $b.hosts -}}
{{- $urls = append $urls (printf "%s://%s@%s/%s" $b.scheme ($user | urlquery) . $vhost) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The variable holding a partition's database URL, as the layout names it. */}}
{{- define "sas.partitionURLEnv" -}}
{{- printf "SAS_%s_DATABASE_URL" (. | upper | replace "-" "_") -}}
{{- end -}}

{{/* The partitions layout (SAS_PARTITIONS_FILE). */}}
{{- define "sas.partitionsLayout" -}}
exchange: {{ .Values.partitions.exchange | quote }}
buckets: {{ .Values.partitions.buckets }}
partitions:
{{- range .Values.partitions.items }}
  - name: {{ .name | quote }}
    queue_prefix: {{ .queuePrefix | quote }}
    database_url_env: {{ include "sas.partitionURLEnv" .name }}
{{- if .added }}
    added: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The settings every sas container shares: (dict "root" $ "prefix" a partition's queue prefix, or none). */}}
{{- define "sas.commonEnv" -}}
{{- $root := .root -}}
- name: SAS_QUEUE_PREFIX
  value: {{ .prefix | default $root.Values.queuePrefix | quote }}
- name: SAS_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
- name: SAS_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if $root.Values.workflows }}
- name: SAS_WORKFLOWS_FILE
  value: /etc/sas/workflows/workflows.yaml
{{- end }}
{{- if $root.Values.partitions.items }}
- name: SAS_PARTITIONS_FILE
  value: /etc/sas/partitions/partitions.yaml
{{- end }}
{{- include "sas.tracingEnv" $root }}
{{- end -}}

{{/* OpenTelemetry: traces over OTLP/HTTP when tracing.endpoint is set. */}}
{{- define "sas.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
{{- with .headersSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .name | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A pod's security settings and scheduling. */}}
{{- define "sas.podSpecCommon" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The components: name, metrics port, database role (none for agents),
broker user (none for the supervisor), password keys of the Secret it
may read, and its values.
*/}}
{{- define "sas.components" -}}
{{- $c := list -}}
{{- $parts := .Values.partitions.items | default (list (dict "name" "" "queuePrefix" "" "hosts" "")) -}}
{{- range $parts -}}
{{- $sfx := ternary "" (printf "-%s" .name) (eq .name "") -}}
{{- $p := dict "partition" .name "prefix" .queuePrefix "hosts" .hosts "userPrefix" (.brokerUserPrefix | default "") -}}
{{- $c = append $c (merge (dict "name" (printf "submitter%s" $sfx) "binary" "submitter" "port" 9101 "role" "submitter" "amqp" "submitter" "values" $.Values.submitter) $p) -}}
{{- $c = append $c (merge (dict "name" (printf "scheduler%s" $sfx) "binary" "scheduler" "port" 9102 "role" "scheduler" "amqp" "scheduler" "values" $.Values.scheduler) $p) -}}
{{- $c = append $c (merge (dict "name" (printf "supervisor%s" $sfx) "binary" "supervisor" "port" 9104 "role" "supervisor" "amqp" "" "values" $.Values.supervisor) $p) -}}
{{- range $.Values.agents -}}
{{- $v := merge (dict "replicas" .replicas "kinds" .kinds) (deepCopy $.Values.agent) -}}
{{- $c = append $c (merge (dict "name" (printf "agent-%s%s" .name $sfx) "binary" "agent" "port" 9103 "role" "" "amqp" "agent" "values" $v "kinds" .kinds) $p) -}}
{{- end -}}
{{- end -}}
{{- if .Values.console.enabled -}}
{{- $c = append $c (dict "name" "console" "binary" "console" "port" 9106 "role" "console" "amqp" "sasctl" "values" .Values.console) -}}
{{- end -}}
{{- if .Values.api.enabled -}}
{{- $c = append $c (dict "name" "api" "binary" "api" "port" 9107 "role" "api" "amqp" "api" "values" .Values.api) -}}
{{- end -}}
{{- toJson (dict "items" $c) -}}
{{- end -}}
