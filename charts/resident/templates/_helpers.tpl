{{/*
Names and labels shared by every template. Object names are "<fullname>-<component>";
cluster-scoped objects (ClusterRoles, bindings) carry the full name too, so two releases
in different namespaces do not collide. The CSIDriver's name is the driver name itself.
*/}}

{{- define "resident.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "resident.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The CSI driver name: fixed by the CSI contract (docs/contracts.md). */}}
{{- define "resident.driver" -}}bundles.resident.dev{{- end -}}

{{- define "resident.labels" -}}
app.kubernetes.io/name: {{ include "resident.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "resident.selectorLabels" -}}
app.kubernetes.io/name: {{ include "resident.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "resident.componentLabels" -}}
{{ include "resident.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "resident.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The default owner image. One project image holds the operator, the bridge and the owner
(the operator starts owners with the command `resident owner ...`), so an empty
operator.owner.image.repository means that image, with its tag.
*/}}
{{- define "resident.ownerImage" -}}
{{- $img := .Values.operator.owner.image -}}
{{- if $img.repository -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default (default .Chart.AppVersion .Values.image.tag) $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The restricted container securityContext every non-privileged container uses: no
privilege escalation, read-only root filesystem, every capability dropped.
*/}}
{{- define "resident.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
Does this release make a prometheus-operator object of .kind (ServiceMonitor, PodMonitor,
PrometheusRule)? With metrics.discovery "monitors" always; with "auto" only when the API
server serves the kind under monitoring.coreos.com/v1 (a Helm install or upgrade asks it;
`helm template` knows only what --api-versions tells it). Renders "true" or nothing.
Call with (dict "ctx" $ "kind" "ServiceMonitor").
*/}}
{{- define "resident.monitors" -}}
{{- $mode := .ctx.Values.metrics.discovery -}}
{{- if or (eq $mode "monitors") (and (eq $mode "auto") (.ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind))) -}}
true
{{- end -}}
{{- end -}}

{{/*
Are the Pods of a component found by prometheus.io annotations instead: discovery
"annotations", or "auto" without the monitor .kind that would find them. Renders "true"
or nothing. Call with (dict "ctx" $ "kind" "ServiceMonitor").
*/}}
{{- define "resident.scrapeAnnotated" -}}
{{- $mode := .ctx.Values.metrics.discovery -}}
{{- if or (eq $mode "annotations") (and (eq $mode "auto") (not (include "resident.monitors" .))) -}}
true
{{- end -}}
{{- end -}}
