{{/* Name of the chart, overridable. */}}
{{- define "redrafter-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "redrafter-operator.fullname" -}}
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

{{- define "redrafter-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of the operator pods (immutable once installed). */}}
{{- define "redrafter-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "redrafter-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "redrafter-operator.labels" -}}
helm.sh/chart: {{ include "redrafter-operator.chart" . }}
{{ include "redrafter-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: redrafter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "redrafter-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "redrafter-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "redrafter-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Leader election: more than one replica coordinates through kopf peering. */}}
{{- define "redrafter-operator.peering" -}}
{{- if gt (int .Values.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{- define "redrafter-operator.peeringName" -}}
{{- include "redrafter-operator.fullname" . -}}
{{- end -}}

{{/* `redrafter-operator run` flags (the controller's CLI, controller/main.py). */}}
{{- define "redrafter-operator.args" -}}
- run
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if include "redrafter-operator.peering" . }}
- --peering={{ include "redrafter-operator.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.health.port }}{{ .Values.health.path }}
- --metrics-port={{ .Values.metrics.port }}
- --log-format={{ .Values.logging.format }}
- --log-level={{ .Values.logging.level }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
RBAC rules on namespaced resources: exactly what the operator calls, no more. tests/e2e/test_chart.py runs
the operator from this chart against the emulated API server and compares its request log with these.
- ReDrafterDeployments: kopf lists/watches them; the operator writes only their status subresource.
- children (Deployments, Services, ConfigMaps): server-side applied (a PATCH, authorized as create too
  when it creates the object); build Jobs and their ConfigMaps are only ever created (a retry is a new
  Job); none is deleted by the operator (owner references let the garbage collector remove them with
  their ReDrafterDeployment).
- Pods: watched (build Pods, for termination messages). Events: created. Secrets: never read.
*/}}
{{- define "redrafter-operator.namespacedRules" -}}
- apiGroups: ["redrafter.dev"]
  resources: ["redrafterdeployments"]
  verbs: ["list", "watch"]
- apiGroups: ["redrafter.dev"]
  resources: ["redrafterdeployments/status"]
  verbs: ["patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "get"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if and (include "redrafter-operator.peering" .) .Values.watchNamespaces }}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end -}}

{{/* Cluster-scoped reads kopf does in every mode: it watches CRDs to notice resources appear or change. */}}
{{- define "redrafter-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- else if include "redrafter-operator.peering" . }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end -}}
