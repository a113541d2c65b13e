{{/* A pod annotation with a digest of the values the release's Redis and transport Secrets are
made from: a new password, Redis URL, CURVE setting or Secret name rolls the pods that read
them (a variable from a Secret is read once, when the container starts). A generated password
or key keeps its install-time value (see the Secrets' templates), so it is left out; a Secret
of your own can change without the chart knowing: then restart the pods yourself
(kubectl rollout restart). */}}
{{- define "k25.secretsChecksum" -}}
checksum/secrets: {{ toJson (dict "redis" (pick .Values.redis "auth" "external" "users" "tls") "curve" .Values.transport.curve) | sha256sum }}
{{- end -}}
