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

{{/* Leader election: more than one replica elects one active operator through a Lease. */}}
{{- define "redrafter-operator.leaderElection" -}}
{{- if gt (int .Values.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{/* The coordination.k8s.io/v1 Lease: in the release namespace, named like the release's operator. */}}
{{- define "redrafter-operator.leaseName" -}}
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
{{- if include "redrafter-operator.leaderElection" . }}
- --leader-elect
- --leader-election-namespace={{ .Release.Namespace }}
- --leader-election-id={{ include "redrafter-operator.leaseName" . }}
- --lease-duration={{ .Values.leaderElection.leaseDuration }}
- --renew-deadline={{ .Values.leaderElection.renewDeadline }}
- --retry-period={{ .Values.leaderElection.retryPeriod }}
{{- else }}
- --standalone
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.health.port }}{{ .Values.health.path }}
- --metrics-address=0.0.0.0
- --metrics-port={{ .Values.metrics.port }}
- --log-format={{ .Values.logging.format }}
- --log-level={{ .Values.logging.level }}
{{- if not .Values.gpuNodeCheck }}
- --no-gpu-node-check
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
RBAC rules on namespaced resources: exactly what the operator calls, no more. tests/e2e/test_chart.py runs
the operator from this chart against a real kube-apiserver and compares its requests with these.
- ReDrafterDeployments: kopf lists/watches them; the operator writes only their status subresource.
- children (Deployments, Services, ConfigMaps, NetworkPolicies, InferencePools): server-side applied (a
  PATCH, authorized as create too when it creates the object); build Jobs and their ConfigMaps are only
  ever created (a retry is a new Job); none is deleted by the operator (owner references let the garbage
  collector remove them with their ReDrafterDeployment), except an InferencePool when the feature is turned off.
- Jobs, CronJobs and Pods: watched and indexed, so a change enqueues the owning resource (nothing is polled).
  Build and validation Jobs are only ever created; a finished collection Job is patched once (an annotation
  that its report was posted). Pods: build, validation and collection Pods for their termination messages
  (a LIST by label only when a finished Job's Pod has not reached the watch yet), serving Pods for the
  metrics scrape. Events: created. Secrets: never read.
- InferencePools (Gateway API Inference Extension, spec.routing.inferencePool) and NetworkPolicies
  (spec.serving.networkPolicy.enabled): watched and applied like the other children. InferencePools are
  granted whether or not the CRD is installed (the operator reports a missing CRD in status).
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
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/*
Leader election (replicas > 1), always a Role in the release namespace, even in cluster-wide mode: the
elector reads its Lease, creates it once, and updates it to acquire, renew and release. Nothing else.
*/}}
{{- define "redrafter-operator.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
{{- end -}}

{{/*
The GPU node check (gpuNodeCheck): the operator watches Nodes, cluster-scoped, to create a GPU Job only
when some node could run it. Read-only; in namespaced mode a ClusterRole of its own (rbac.yaml).
*/}}
{{- define "redrafter-operator.nodeRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
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
{{- end }}
{{- end -}}
