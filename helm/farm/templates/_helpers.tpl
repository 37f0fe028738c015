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

{{- define "farm.brokerUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:6379/0" (include "farm.redisName" .) -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/*
The worker pools (values `pools`), each with every field filled in: what a pool does not say
comes from worker.*, sandbox.* and autoscaling.*. Fields are overlaid key by key (hasKey), so a
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
{{- range $key := list "enabled" "minReplicas" "maxReplicas" "queueLengthPerWorker" -}}
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
{{- if not (has .Values.sandbox.mode (list "dind" "pod")) -}}
{{- fail (printf "sandbox.mode must be dind or pod, not %q" .Values.sandbox.mode) -}}
{{- end -}}
{{- if not (has .Values.autoscaling.engine (list "keda" "hpa")) -}}
{{- fail (printf "autoscaling.engine must be keda or hpa, not %q" .Values.autoscaling.engine) -}}
{{- end -}}
{{- end -}}
