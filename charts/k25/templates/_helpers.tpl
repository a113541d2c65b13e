{{/* Names: <release>-k25 unless the release name already says k25. */}}
{{- define "k25.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "k25.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: k25
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Pods of one component: (dict "root" $ "component" "gateway") */}}
{{- define "k25.selectorLabels" -}}
app.kubernetes.io/name: k25-{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "k25.componentLabels" -}}
{{ include "k25.labels" .root }}
{{ include "k25.selectorLabels" . }}
{{- end -}}

{{- define "k25.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "k25.engineImage" -}}
{{- printf "%s:%s" .Values.engineImage.repository (.Values.engineImage.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "k25.redisUrl" -}}
{{- .Values.redis.external.url | default (printf "redis://%s-redis:6379/0" (include "k25.fullname" .)) -}}
{{- end -}}

{{- define "k25.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- else if .Values.tracing.collector.enabled -}}
{{- printf "http://%s-otel-collector:4317" (include "k25.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The claim name is fixed: the operator mounts <release>-models into engines (operators/deployment.py). */}}
{{- define "k25.modelsClaim" -}}
{{- printf "%s-models" .Release.Name -}}
{{- end -}}

{{/* env every K25 process gets: (dict "root" $ "component" "gateway") */}}
{{- define "k25.env" -}}
- name: K25_RELEASE
  value: {{ .root.Release.Name | quote }}
{{- with include "k25.otlpEndpoint" .root }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_SERVICE_NAME
  value: k25-{{ $.component }}
{{- end }}
{{- end -}}

{{/* The restricted-policy pod fields and the pull secrets, shared by every pod. */}}
{{- define "k25.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* /tmp, the one writable place under a read-only root, and the models volume when on */}}
{{- define "k25.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.models.persistence.enabled }}
- name: models
  persistentVolumeClaim:
    claimName: {{ include "k25.modelsClaim" . }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "k25.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.models.persistence.enabled }}
- name: models
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{/* Checks the schema cannot express; each fails the install with a message. */}}
{{- define "k25.validate" -}}
{{- $names := dict -}}
{{- range $i, $pool := .Values.engine.pools -}}
{{- if hasKey $names $pool.name -}}
{{- fail (printf "engine.pools[%d]: the pool name %q is used twice; pool names must be unique" $i $pool.name) -}}
{{- end -}}
{{- $_ := set $names $pool.name true -}}
{{- $min := ternary $pool.minReplicas 1 (hasKey $pool "minReplicas") -}}
{{- $max := ternary $pool.maxReplicas 4 (hasKey $pool "maxReplicas") -}}
{{- if gt (int $min) (int $max) -}}
{{- fail (printf "engine.pools[%d] (%s): minReplicas (%v) must not exceed maxReplicas (%v)" $i $pool.name $min $max) -}}
{{- end -}}
{{- $model := $pool.model | default $.Values.model -}}
{{- if and (hasPrefix "/models/" $model) (not $.Values.models.persistence.enabled) -}}
{{- fail (printf "engine.pools[%d] (%s): model %s is a path on the models volume, but models.persistence.enabled is false; turn it on or name a model the image carries (smollm2-135m, tiny-random)" $i $pool.name $model) -}}
{{- end -}}
{{- end -}}
{{- if and (hasPrefix "/models/" .Values.model) (not .Values.models.persistence.enabled) -}}
{{- fail (printf "model %s is a path on the models volume, but models.persistence.enabled is false; turn it on or name a model the image carries (smollm2-135m, tiny-random)" .Values.model) -}}
{{- end -}}
{{- if gt (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas) -}}
{{- fail (printf "gateway.autoscaling: minReplicas (%v) must not exceed maxReplicas (%v)" .Values.gateway.autoscaling.minReplicas .Values.gateway.autoscaling.maxReplicas) -}}
{{- end -}}
{{- end -}}
