{{/* Names, labels and the few values several templates derive. */}}

{{- define "farm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "farm.fullname" -}}
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

{{- define "farm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component (worker, redis, sandbox). */}}
{{- define "farm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "farm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "farm.labels" -}}
{{ include "farm.selectorLabels" . }}
helm.sh/chart: {{ include "farm.chart" .root }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: farm
{{- end -}}

{{- define "farm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-worker" (include "farm.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "farm.workerImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "farm.redisName" -}}
{{- printf "%s-redis" (include "farm.fullname" .) -}}
{{- end -}}

{{/* The broker's URL, never with the password in it (that comes from the Secret). */}}
{{- define "farm.brokerUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s://%s:6379/0" (ternary "rediss" "redis" .Values.redis.tls.enabled) (include "farm.redisName" .) -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* The broker's database number (the path of redis.externalUrl; the bundled Redis uses 0):
     where the queues are, so where KEDA must read their lengths. */}}
{{- define "farm.redisDatabase" -}}
{{- $path := regexFind "^rediss?://[^/?#]*/[0-9]+" (ternary "" (default "" .Values.redis.externalUrl) .Values.redis.enabled) -}}
{{- ternary (regexReplaceAll "^.*/" $path "") "0" (ne $path "") -}}
{{- end -}}

{{/* The Secret holding the broker's password: yours, or the one the chart makes. */}}
{{- define "farm.redisAuthSecret" -}}
{{- default (printf "%s-redis-auth" (include "farm.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{/* FARM_BROKER_PASSWORD for a container, from the Secret: never a literal in a pod spec. */}}
{{- define "farm.brokerPasswordEnv" -}}
- name: FARM_BROKER_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "farm.redisAuthSecret" . }}
      key: {{ .Values.redis.auth.secretKey }}
{{- end -}}

{{/* A PING that succeeds only with the password (redis-cli reads it from REDISCLI_AUTH, not
     its command line; a NOAUTH reply would exit 0, hence the grep), over TLS when on. */}}
{{- define "farm.redisPing" -}}
{{- $tls := .Values.redis.tls -}}
{{- $flags := "" -}}
{{- if $tls.enabled -}}
{{- $flags = " --tls --cacert /etc/redis/tls/ca.crt" -}}
{{- if $tls.clientCertSecret -}}
{{- $flags = printf "%s --cert /etc/redis/client/tls.crt --key /etc/redis/client/tls.key" $flags -}}
{{- end -}}
{{- end -}}
{{- printf "REDISCLI_AUTH=\"$FARM_BROKER_PASSWORD\" redis-cli%s ping | grep -q PONG" $flags -}}
{{- end -}}

{{/*
The worker pools (values `pools`), each with every field filled in: what a pool does not say
comes from worker.*, sandbox.* and autoscaling.*. Its work waits in three Redis lists: queue
(farm.<farmImage>: one-shot runs), opens (<queue>.opens: session opens) and chunks
(<queue>.chunks: map chunks); workers take an open or a chunk only when they have room. Fields are overlaid key by key (hasKey), so a
pool may set false or 0 (no autoscaling, minReplicas 0) over a default that is not. As JSON:
  {{- range $pool := (include "farm.pools" . | fromJson).pools }}
*/}}
{{- define "farm.pools" -}}
{{- $w := .Values.worker -}}
{{- $sb := .Values.sandbox -}}
{{- $a := .Values.autoscaling -}}
{{- $repository := regexReplaceAll ":[^:/]+$" $sb.image "" -}}
{{- $pools := list -}}
{{- range $p := .Values.pools -}}
{{- $farmImage := $p.farmImage | default $p.name -}}
{{- $defaultImage := ternary $sb.image (printf "%s:%s" $repository $farmImage) (eq $farmImage "default") -}}
{{- $pool := dict "name" $p.name "farmImage" $farmImage "queue" (printf "farm.%s" $farmImage) -}}
{{- $_ := set $pool "opens" (printf "%s.opens" $pool.queue) -}}
{{- $_ := set $pool "chunks" (printf "%s.chunks" $pool.queue) -}}
{{- $_ := set $pool "sandboxImage" ($p.sandboxImage | default $defaultImage) -}}
{{- range $key := list "replicas" "concurrency" "maxSessions" "idleTimeoutS" "resources" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" -}}
{{- $_ := set $pool $key (ternary (index $p $key) (index $w $key) (hasKey $p $key)) -}}
{{- end -}}
{{- $_ := set $pool "env" (merge (deepCopy ($p.env | default dict)) $w.env) -}}
{{- $_ := set $pool "engineResources" ($p.engineResources | default $sb.dind.resources) -}}
{{- $limits := dict -}}
{{- $given := $p.sandbox | default dict -}}
{{- range $key := list "memoryMb" "cpus" "pids" "tmpMb" "workspaceMb" "graceS" "startTimeoutS" -}}
{{- $_ := set $limits $key (ternary (index $given $key) (index $sb $key) (hasKey $given $key)) -}}
{{- end -}}
{{- $_ := set $pool "sandbox" $limits -}}
{{- $scaling := dict -}}
{{- $given = $p.autoscaling | default dict -}}
{{- range $key := list "enabled" "minReplicas" "maxReplicas" "queueLengthPerWorker" "opensPerWorker" "chunksPerWorker" "waitingPerWorker" -}}
{{- $_ := set $scaling $key (ternary (index $given $key) (index $a $key) (hasKey $given $key)) -}}
{{- end -}}
{{- $_ := set $pool "autoscaling" $scaling -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- dict "pools" $pools | toJson -}}
{{- end -}}

{{/* A memory quantity in MiB ("1Gi", "1536Mi"); -1 when it is in another form. */}}
{{- define "farm.mebibytes" -}}
{{- $q := toString . -}}
{{- if regexMatch "^[0-9]+Gi$" $q -}}
{{- mul (trimSuffix "Gi" $q | atoi) 1024 -}}
{{- else if regexMatch "^[0-9]+Mi$" $q -}}
{{- trimSuffix "Mi" $q | atoi -}}
{{- else -}}
-1
{{- end -}}
{{- end -}}

{{/* Whether any pool is scaled by KEDA (its operator must then reach Redis). */}}
{{- define "farm.kedaScales" -}}
{{- $keda := false -}}
{{- range $pool := (include "farm.pools" . | fromJson).pools -}}
{{- if and $pool.autoscaling.enabled (eq $.Values.autoscaling.engine "keda") -}}
{{- $keda = true -}}
{{- end -}}
{{- end -}}
{{- ternary "true" "" $keda -}}
{{- end -}}

{{/* The hardened securityContext every non-privileged farm container gets. */}}
{{- define "farm.restrictedContainer" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "farm.validate" -}}
{{- with .Values.egress.caBundle -}}
{{- if and .configMap .secret -}}
{{- fail "egress.caBundle: give configMap or secret, not both" -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.worker "farmImage" -}}
{{- fail "worker.farmImage is gone: each entry of pools names its image (pools[].farmImage)" -}}
{{- end -}}
{{- $names := list -}}
{{- range .Values.pools -}}
{{- if has .name $names -}}
{{- fail (printf "pools: the name %q is given twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $r := .Values.redis -}}
{{- if and (not $r.enabled) (not $r.auth.existingSecret) -}}
{{- fail "redis.auth.existingSecret is required with an external Redis: farm's clients must authenticate (a Secret holding its password)" -}}
{{- end -}}
{{- if regexMatch "^rediss?://[^/@]*:[^/@]*@" (default "" $r.externalUrl) -}}
{{- fail "redis.externalUrl must not hold the password: put it in the Secret redis.auth.existingSecret" -}}
{{- end -}}
{{- if and (not $r.enabled) $r.externalUrl (ne (hasPrefix "rediss://" $r.externalUrl) (eq $r.tls.enabled true)) -}}
{{- fail "redis.tls.enabled must match redis.externalUrl: rediss:// with TLS, redis:// without" -}}
{{- end -}}
{{- if and $r.enabled $r.tls.enabled (not $r.tls.certSecret) -}}
{{- fail "redis.tls.certSecret is required for the bundled Redis over TLS (tls.crt, tls.key, ca.crt)" -}}
{{- end -}}
{{- if and $r.tls.clientCertSecret (not $r.tls.enabled) -}}
{{- fail "redis.tls.clientCertSecret needs redis.tls.enabled" -}}
{{- end -}}
{{- if ne .Values.sandbox.mode "dind" -}}
{{- fail (printf "sandbox.mode must be dind, not %q (farm has no Kubernetes sandbox backend: docs/design/kubernetes-sandbox-pods.md)" .Values.sandbox.mode) -}}
{{- end -}}
{{- if not (has .Values.autoscaling.engine (list "keda" "hpa")) -}}
{{- fail (printf "autoscaling.engine must be keda or hpa, not %q" .Values.autoscaling.engine) -}}
{{- end -}}
{{- end -}}

{{/* The egress CA bundle's volume name when boxes have egress and a bundle is given, else "". */}}
{{- define "farm.egressCa" -}}
{{- $e := .Values.egress -}}
{{- if and $e.allow (or $e.caBundle.configMap $e.caBundle.secret) -}}egress-ca{{- end -}}
{{- end -}}
