{{/*
Names and labels shared by every template (the dashboards ConfigMap template uses
rooftop.fullname and rooftop.labels too).
*/}}

{{/* Chart name, overridable. */}}
{{- define "rooftop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-chart, or just the release name when it already contains the chart
name. Truncated to 63 characters (DNS label limit).
*/}}
{{- define "rooftop.fullname" -}}
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

{{/* chart-version label value. */}}
{{- define "rooftop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (Deployment selectors are immutable). */}}
{{- define "rooftop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rooftop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Common labels. */}}
{{- define "rooftop.labels" -}}
helm.sh/chart: {{ include "rooftop.chart" . }}
{{ include "rooftop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rooftop
{{- end }}

{{/* ServiceAccount the operator runs as. */}}
{{- define "rooftop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rooftop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Operator image reference. */}}
{{- define "rooftop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Namespaces the operator watches, as a list. cluster scope: the listed ones (empty means
all); namespace scope: the listed ones or the release namespace.
*/}}
{{- define "rooftop.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- toYaml .Values.operator.watchNamespaces }}
{{- else if eq .Values.rbac.scope "namespace" }}
{{- toYaml (list .Release.Namespace) }}
{{- else }}
{{- toYaml list }}
{{- end }}
{{- end }}

{{/*
RBAC rules for ServingTargets and their children, shared by the Role and ClusterRole.
Least privilege: children are written with server-side apply (create + patch) and
removed by garbage collection through ownerReferences; the one delete verb is for
a mixed fleet's pool Deployment the plan no longer has (its target stays).
*/}}
{{- define "rooftop.rules" -}}
- apiGroups: ["rooftop.dev"]
  resources: ["servingtargets"]
  # patch: kopf keeps its progress in annotations.
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["rooftop.dev"]
  resources: ["servingtargets/status"]
  verbs: ["get", "update", "patch"]
- apiGroups: ["rooftop.dev"]
  # ownerReferences with blockOwnerDeletion need this where the
  # OwnerReferencesPermissionEnforcement admission plugin is on.
  resources: ["servingtargets/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  # delete: a mixed fleet's pool Deployment its plan no longer has.
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  # configmaps: the drain middleware each vLLM target's pods load.
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
kopf peering, "true" or empty: on with operator.peering.enabled or more than one replica
(two standalone operators would both handle every target). Read through a dict: under
`helm upgrade --reuse-values` from an older chart, keys this one added are absent.
*/}}
{{- define "rooftop.peering" -}}
{{- $peering := .Values.operator.peering | default dict }}
{{- if or $peering.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The peering object's name. */}}
{{- define "rooftop.peeringName" -}}
{{- (.Values.operator.peering | default dict).name | default "rooftop" }}
{{- end }}

{{/* Seconds a replica's keep-alive counts (--peering-lifetime). */}}
{{- define "rooftop.peeringLifetime" -}}
{{- (.Values.operator.peering | default dict).lifetimeSeconds | default 20 }}
{{- end }}
