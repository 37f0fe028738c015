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

{{- define "farm.sharedQueue" -}}
{{- printf "farm.%s" .Values.worker.farmImage -}}
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
{{- if not (has .Values.sandbox.mode (list "dind" "pod")) -}}
{{- fail (printf "sandbox.mode must be dind or pod, not %q" .Values.sandbox.mode) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (not (has .Values.autoscaling.engine (list "keda" "hpa"))) -}}
{{- fail (printf "autoscaling.engine must be keda or hpa, not %q" .Values.autoscaling.engine) -}}
{{- end -}}
{{- end -}}
