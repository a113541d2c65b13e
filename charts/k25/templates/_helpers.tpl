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

{{/* A component's image and pull policy: (dict "root" $ "component" "gateway"). Its own
<component>.image.repository, else <image.repository>-<component>; its own tag, else
image.tag, else the appVersion. */}}
{{- define "k25.componentImage" -}}
{{- $image := .root.Values.image -}}
{{- $own := (index .root.Values .component).image | default dict -}}
{{- $repository := $own.repository | default (printf "%s-%s" $image.repository .component) -}}
{{- printf "%s:%s" $repository ($own.tag | default $image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{- define "k25.componentPullPolicy" -}}
{{- ((index .root.Values .component).image | default dict).pullPolicy | default .root.Values.image.pullPolicy -}}
{{- end -}}

{{- define "k25.engineImage" -}}
{{- printf "%s:%s" .Values.engineImage.repository (.Values.engineImage.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "k25.vllmEngineImage" -}}
{{- printf "%s:%s" .Values.vllmEngineImage.repository (.Values.vllmEngineImage.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* A component's pods spread over nodes where they can be (never left pending for it). (dict "root" $ "component" NAME) */}}
{{- define "k25.spreadOverNodes" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "k25.selectorLabels" . | nindent 8 }}
{{- end -}}

{{/* The repositories EnginePools may run, space-separated: the engine images', every pool's own
image's (tag and digest cut off, as operators/image_policy.py reads them) and operator.allowedImages. */}}
{{- define "k25.allowedEngineImages" -}}
{{- $images := list (include "k25.engineImage" .) (include "k25.vllmEngineImage" .) -}}
{{- range .Values.engine.pools -}}{{- if .image -}}{{- $images = append $images .image -}}{{- end -}}{{- end -}}
{{- $repositories := list -}}
{{- range $images -}}
{{- $repositories = append $repositories (regexReplaceAll "(:[^/:]*)?(@.*)?$" . "") -}}
{{- end -}}
{{- join " " (concat $repositories .Values.operator.allowedImages) -}}
{{- end -}}

{{/* "true" when the chart runs Redis itself: no Redis of your own is named */}}
{{- define "k25.bundledRedis" -}}
{{- if not (or .Values.redis.external.url .Values.redis.external.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* "true" when a hook Job makes the chart's Redis Secret in the cluster (generatedSecrets job, the
chart's own Redis, no Secret or password of yours) */}}
{{- define "k25.redisSecretGeneratedInCluster" -}}
{{- $redis := .Values.redis -}}
{{- if and (eq .Values.generatedSecrets "job") (include "k25.bundledRedis" .) (not $redis.auth.existingSecret) (not $redis.auth.password) -}}true{{- end -}}
{{- end -}}

{{/* "true" when a hook Job makes the Secrets of the parts' Redis users in the cluster */}}
{{- define "k25.redisUserSecretsGeneratedInCluster" -}}
{{- if and (eq .Values.generatedSecrets "job") (include "k25.redisUsers" .) -}}true{{- end -}}
{{- end -}}

{{/* Where a client finds the CA of the chart's Redis with redis.tls on (a volume of the Secret's ca.crt) */}}
{{- define "k25.redisCaDir" -}}/etc/k25/redis-tls{{- end -}}

{{/* The CA of the chart's Redis with redis.tls on, for a pod that connects to it: its volume
(k25.redisCaVolume) and mount (k25.redisCaMount); nothing with TLS off */}}
{{- define "k25.redisCaVolume" -}}
{{- if and (include "k25.bundledRedis" .) .Values.redis.tls.enabled -}}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret }}
    items:
      - {key: ca.crt, path: ca.crt}
{{- end -}}
{{- end -}}
{{- define "k25.redisCaMount" -}}
{{- if and (include "k25.bundledRedis" .) .Values.redis.tls.enabled -}}
- name: redis-tls
  mountPath: {{ include "k25.redisCaDir" . }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* The URL of the chart's Redis for a user (dict "root" . "user" "gateway" "password" PW; user ""
is the default user): rediss:// with the CA to check its certificate against when redis.tls is on */}}
{{- define "k25.bundledRedisUrl" -}}
{{- $tls := .root.Values.redis.tls.enabled -}}
{{- printf "%s://%s:%s@%s-redis:6379/0" (ternary "rediss" "redis" $tls) .user .password (include "k25.fullname" .root) -}}
{{- if $tls }}{{ printf "?ssl_ca_certs=%s/ca.crt" (include "k25.redisCaDir" .root) }}{{ end -}}
{{- end -}}

{{/* "true" when a hook Job makes the release's CURVE key Secret in the cluster */}}
{{- define "k25.transportSecretGeneratedInCluster" -}}
{{- $curve := .Values.transport.curve -}}
{{- if and (eq .Values.generatedSecrets "job") $curve.enabled (not $curve.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The Secret whose key redis-url every component and engine reads (and, for the chart's
Redis, whose key redis-password is its requirepass): one of yours, or the chart's. */}}
{{- define "k25.redisSecret" -}}
{{- .Values.redis.external.existingSecret | default .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "k25.fullname" .)) -}}
{{- end -}}

{{/* "true" when each part has a Redis user of its own (the chart's own Redis, redis.users.enabled) */}}
{{- define "k25.redisUsers" -}}
{{- if and (include "k25.bundledRedis" .) .Values.redis.users.enabled -}}true{{- end -}}
{{- end -}}

{{/* The parts with a Redis user of their own (templates/redis-users.yaml holds what each may do) */}}
{{- define "k25.redisParts" -}}gateway engine operator{{- end -}}

{{/* The Secret whose key redis-url a part reads (dict "root" . "part" "gateway"): its own user's
with redis.users on, else the release's one (k25.redisSecret). */}}
{{- define "k25.redisPartSecret" -}}
{{- if include "k25.redisUsers" .root -}}
{{- printf "%s-redis-%s" (include "k25.fullname" .root) .part -}}
{{- else -}}
{{- include "k25.redisSecret" .root -}}
{{- end -}}
{{- end -}}

{{/* The Redis URL, password included, as K25_REDIS_URL: every k25 command's --redis-url default;
the part's own user's (dict "root" . "part" "gateway") */}}
{{- define "k25.redisEnv" -}}
- name: K25_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "k25.redisPartSecret" . }}
      key: redis-url
{{- end -}}

{{/* The Secret whose key curve-secret-key is the release's CURVE key: one of yours, or the chart's. */}}
{{- define "k25.transportSecret" -}}
{{- .Values.transport.curve.existingSecret | default (printf "%s-transport" (include "k25.fullname" .)) -}}
{{- end -}}

{{/* The CURVE key as K25_CURVE_SECRET_KEY, which the gateway presents and engines and the
chunker ask for, and a rotation's second key when the Secret holds one (the key coming, or
the key going: see `k25 secrets rotate-curve`); nothing when CURVE is off. */}}
{{- define "k25.curveEnv" -}}
{{- if .Values.transport.curve.enabled -}}
{{- $secret := include "k25.transportSecret" . -}}
- name: K25_CURVE_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: curve-secret-key
{{- range $name, $key := dict "K25_CURVE_SECRET_KEY_NEXT" "curve-secret-key-next" "K25_CURVE_SECRET_KEY_PREVIOUS" "curve-secret-key-previous" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end -}}
{{- end -}}

{{/* The operator's rules on namespaced resources (k8s/rbac/operator.yaml): in a ClusterRole
with peering "clusterkopfpeerings", or in a Role of the release's namespace with "kopfpeerings";
(dict "root" $ "peerings" "kopfpeerings") */}}
{{- define "k25.operatorRules" -}}
- apiGroups: [k25.io]
  resources: [enginepools]
  verbs: [list, watch, get, patch]
- apiGroups: [k25.io]
  resources: [enginepools/status]
  verbs: [get, patch]
- apiGroups: [k25.io]
  resources: [adapterrollouts]
  verbs: [list, watch, get, patch]
- apiGroups: [k25.io]
  resources: [adapterrollouts/status]
  verbs: [get, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, create, patch, delete]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets/scale]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [kopf.dev]
  resources: [{{ .peerings }}]
  resourceNames: [{{ include "k25.peeringName" .root }}]
  verbs: [get, patch]
- apiGroups: [kopf.dev]
  resources: [{{ .peerings }}]
  verbs: [list, watch]
{{- end -}}

{{/* The kopf peering record of this release's operators (operators.runtime.peering_name) */}}
{{- define "k25.peeringName" -}}
{{- printf "k25-operator-%s" .Release.Name -}}
{{- end -}}

{{- define "k25.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- else if .Values.tracing.collector.enabled -}}
{{- printf "http://%s-otel-collector:4318" (include "k25.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The claim name is fixed: the operator mounts <release>-models into engines (operators/deployment.py). */}}
{{- define "k25.modelsClaim" -}}
{{- printf "%s-models" .Release.Name -}}
{{- end -}}

{{/* The `model` clients send for the base model: gateway.servedModelName, or the file or
folder name of `model` without .gguf. */}}
{{- define "k25.servedModelName" -}}
{{- .Values.gateway.servedModelName | default (.Values.model | base | trimSuffix ".gguf") -}}
{{- end -}}

{{/* env every K25 process gets (each names itself in its spans: k25-gateway, k25-engine,
...); the operator hands the endpoint on to the engines (operators/deployment.py). */}}
{{- define "k25.env" -}}
- name: K25_RELEASE
  value: {{ .Release.Name | quote }}
{{- with include "k25.otlpEndpoint" . }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A pool's LoRA settings as YAML: each key of its own `lora`, else of engine.lora (not
sprig's merge, which takes a pool's maxLoras 0 or claimName "" for unset); (dict "root" $ "pool" $pool) */}}
{{- define "k25.poolLora" -}}
{{- $own := .pool.lora | default dict -}}
{{- $lora := dict -}}
{{- range $key, $default := .root.Values.engine.lora -}}
{{- $_ := set $lora $key (ternary (get $own $key) $default (hasKey $own $key)) -}}
{{- end -}}
{{- toYaml $lora -}}
{{- end -}}

{{/* A pool's engine settings as YAML: each one the pool sets, else engine's where that is not
null (Helm 3 drops a key set to null, Helm 4 keeps it as nil), else none: the engine's default.
The keys are common/engine_settings.py's fields (_engine_settings.tpl). (dict "root" $ "pool" $pool) */}}
{{- define "k25.poolCompute" -}}
{{- $compute := dict -}}
{{- range $key := splitList " " (include "k25.engineSettingFields" $.root) -}}
{{- range $source := list $.pool $.root.Values.engine -}}
{{- if and (not (hasKey $compute $key)) (hasKey $source $key) (not (kindIs "invalid" (get $source $key))) -}}
{{- $_ := set $compute $key (get $source $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $compute -}}
{{- end -}}

{{/* The GPUs a pool's engines ask for, as the operator reads them: its gpusPerReplica, else 0 for nodeType CPU and 1 otherwise */}}
{{- define "k25.poolGpus" -}}
{{- if hasKey . "gpusPerReplica" -}}{{ int .gpusPerReplica }}{{- else -}}{{ ternary 0 1 (eq .nodeType "CPU") }}{{- end -}}
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
{{- $loraPools := dict -}}
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
{{- $lora := fromYaml (include "k25.poolLora" (dict "root" $ "pool" $pool)) -}}
{{- if gt (int $lora.maxLoras) 0 -}}
{{- $_ := set $loraPools $pool.name true -}}
{{- include "k25.validateLora" (dict "root" $ "where" (printf "engine.pools[%d] (%s)" $i $pool.name) "pool" $pool "lora" $lora) -}}
{{- end -}}
{{- $compute := fromYaml (include "k25.poolCompute" (dict "root" $ "pool" $pool)) -}}
{{- if and (eq (toString $compute.dtype) "float16") (eq (include "k25.poolGpus" $pool) "0") -}}
{{- fail (printf "engine.pools[%d] (%s): dtype float16 needs a GPU (gpusPerReplica is 0); on a CPU use float32, bfloat16 or auto" $i $pool.name) -}}
{{- end -}}
{{- $quantized := and $compute.quant (ne (toString $compute.quant) "none") -}}
{{- if and $quantized (not (has (toString (default "auto" $compute.dtype)) (list "auto" "bfloat16"))) -}}
{{- fail (printf "engine.pools[%d] (%s): quant needs dtype bfloat16 or auto, not %s" $i $pool.name $compute.dtype) -}}
{{- end -}}
{{- include "k25.validateBackend" (dict "where" (printf "engine.pools[%d] (%s)" $i $pool.name) "pool" $pool "compute" $compute "lora" $lora) -}}
{{- end -}}
{{- include "k25.validateRollouts" (dict "root" . "poolNames" $names "loraPools" $loraPools) -}}
{{- if and (hasPrefix "/models/" .Values.model) (not .Values.models.persistence.enabled) -}}
{{- fail (printf "model %s is a path on the models volume, but models.persistence.enabled is false; turn it on or name a model the image carries (smollm2-135m, tiny-random)" .Values.model) -}}
{{- end -}}
{{- include "k25.validateRedis" .Values.redis -}}
{{- if and .Values.redis.tls.enabled (not (include "k25.bundledRedis" .)) -}}
{{- fail "redis.tls is the chart's own Redis's TLS; for a Redis of your own give a rediss:// URL in redis.external" -}}
{{- end -}}
{{- if and .Values.redis.tls.enabled (not .Values.redis.tls.existingSecret) -}}
{{- fail "redis.tls.enabled needs redis.tls.existingSecret: a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt whose certificate names <fullname>-redis (cert-manager's Certificate makes one)" -}}
{{- end -}}
{{- if and .Values.transport.curve.existingSecret (not .Values.transport.curve.enabled) -}}
{{- fail "transport.curve.existingSecret names the CURVE key's Secret, but transport.curve.enabled is false; turn CURVE on or leave existingSecret empty" -}}
{{- end -}}
{{- include "k25.validateExposure" .Values.gateway -}}
{{- if gt (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas) -}}
{{- fail (printf "gateway.autoscaling: minReplicas (%v) must not exceed maxReplicas (%v)" .Values.gateway.autoscaling.minReplicas .Values.gateway.autoscaling.maxReplicas) -}}
{{- end -}}
{{- end -}}

{{/* A gateway reachable from outside the cluster asks for API keys, unless allowAnonymous says otherwise; (.Values.gateway) */}}
{{- define "k25.validateExposure" -}}
{{- $keys := or .apiKeys.existingSecret .apiKeys.entries -}}
{{- $service := .service | default dict -}}
{{- $public := list -}}
{{- if .ingress.enabled -}}{{- $public = append $public "gateway.ingress.enabled is true" -}}{{- end -}}
{{- if has $service.type (list "LoadBalancer" "NodePort") -}}{{- $public = append $public (printf "gateway.service.type is %s" $service.type) -}}{{- end -}}
{{- if and $public (not $keys) (not .allowAnonymous) -}}
{{- fail (printf "%s, which exposes the gateway outside the cluster, but it has no API keys: anyone who reaches it could use every model and adapter without limits. Add keys (gateway.apiKeys.entries, from `k25 api-key`, or gateway.apiKeys.existingSecret), or set gateway.allowAnonymous: true to serve it open on purpose" (join " and " $public)) -}}
{{- end -}}
{{- end -}}

{{/* Redis: one source for its URL, and a password only for the chart's own Redis; (.Values.redis) */}}
{{- define "k25.validateRedis" -}}
{{- if and .external.url .external.existingSecret -}}
{{- fail "redis.external: set url or existingSecret, not both" -}}
{{- end -}}
{{- if and (or .external.url .external.existingSecret) (or .auth.password .auth.existingSecret) -}}
{{- fail "redis.auth is the password of the chart's own Redis, which does not run with redis.external set; put the password in the external URL" -}}
{{- end -}}
{{- if and .auth.password .auth.existingSecret -}}
{{- fail "redis.auth: set password or existingSecret, not both" -}}
{{- end -}}
{{- end -}}

{{/* One pool's LoRA settings, merged: (dict "root" $ "where" "engine.pools[0] (h100)" "pool" $pool "lora" $lora) */}}
{{- define "k25.validateLora" -}}
{{- $lora := .lora -}}
{{- if lt (int $lora.maxCpuLoras) (int $lora.maxLoras) -}}
{{- fail (printf "%s: lora.maxCpuLoras (%v) must be at least lora.maxLoras (%v)" .where $lora.maxCpuLoras $lora.maxLoras) -}}
{{- end -}}
{{- range $reserved := list "/tmp" "/models" -}}
{{- if or (eq $lora.adapterRoot $reserved) (hasPrefix (printf "%s/" $reserved) $lora.adapterRoot) -}}
{{- fail (printf "%s: lora.adapterRoot %s must not be /tmp, /models or under them (the engine's scratch space and the models mount)" $.where $lora.adapterRoot) -}}
{{- end -}}
{{- end -}}
{{- if and (not $lora.claimName) (not .root.Values.models.persistence.enabled) -}}
{{- fail (printf "%s: LoRA adapters come from the models claim unless lora.claimName names another, but models.persistence.enabled is false; set engine.lora.claimName (or the pool's lora.claimName) to the claim that holds the adapters" .where) -}}
{{- end -}}
{{- if and (eq $lora.kernel "triton") (eq (include "k25.poolGpus" .pool) "0") -}}
{{- fail (printf "%s: lora.kernel triton needs a GPU (gpusPerReplica is 0); use kernel torch" .where) -}}
{{- end -}}
{{- end -}}

{{/* The rollouts against the pools: (dict "root" $ "poolNames" {name: true} "loraPools" {name: true}) */}}
{{- define "k25.validateRollouts" -}}
{{- $names := dict -}}
{{- $adapters := dict -}}
{{- $base := include "k25.servedModelName" .root -}}
{{- range $i, $rollout := .root.Values.adapterRollouts -}}
{{- $where := printf "adapterRollouts[%d] (%s)" $i $rollout.name -}}
{{- $adapter := $rollout.adapter | default $rollout.name -}}
{{- if hasKey $names $rollout.name -}}
{{- fail (printf "%s: the name %q is used twice; AdapterRollout names must be unique" $where $rollout.name) -}}
{{- end -}}
{{- $_ := set $names $rollout.name true -}}
{{- if hasKey $adapters $adapter -}}
{{- fail (printf "%s: the adapter %q has two rollouts; one adapter, one rollout" $where $adapter) -}}
{{- end -}}
{{- $_ := set $adapters $adapter true -}}
{{- if or (eq $adapter $base) (eq $adapter "base") -}}
{{- fail (printf "%s: the adapter %q has the base model's name (base, or %s: gateway.servedModelName); clients could not ask for it" $where $adapter $base) -}}
{{- end -}}
{{- if not (hasKey $.poolNames $rollout.pool) -}}
{{- fail (printf "%s: pool %q is not in engine.pools (%s)" $where $rollout.pool (keys $.poolNames | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if not (hasKey $.loraPools $rollout.pool) -}}
{{- fail (printf "%s: pool %q serves no adapters; set engine.lora.maxLoras (or that pool's lora.maxLoras) above 0" $where $rollout.pool) -}}
{{- end -}}
{{- if eq $rollout.canary.version $rollout.stable.version -}}
{{- fail (printf "%s: canary.version must differ from stable.version (%s)" $where $rollout.stable.version) -}}
{{- end -}}
{{- with $rollout.steps -}}
{{- if ne (int (last .)) 100 -}}
{{- fail (printf "%s: steps must end at 100, got %v" $where .) -}}
{{- end -}}
{{- range $j, $step := . -}}
{{- if and $j (le (int $step) (int (index $rollout.steps (sub $j 1)))) -}}
{{- fail (printf "%s: steps must be increasing, got %v" $where $rollout.steps) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
