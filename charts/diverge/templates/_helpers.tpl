{{/* Names and labels shared by every template. */}}
{{- define "diverge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "diverge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "diverge.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "diverge.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "diverge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "diverge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "diverge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "diverge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "diverge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "diverge.runnerImage" -}}
{{- printf "%s:%s" .Values.sandbox.image.repository (default .Chart.AppVersion .Values.sandbox.image.tag) -}}
{{- end -}}

{{- define "diverge.macaroonSecret" -}}
{{- default (printf "%s-macaroon" (include "diverge.fullname" .)) .Values.sandbox.macaroonSecretRef.name -}}
{{- end -}}

{{- define "diverge.tlsSecret" -}}
{{- printf "%s-tls" (include "diverge.fullname" .) -}}
{{- end -}}

{{- define "diverge.publicURL" -}}
{{- if .Values.server.publicURL -}}
{{- .Values.server.publicURL -}}
{{- else -}}
{{- printf "https://%s.%s.svc" (include "diverge.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The sandbox pods' labels: the NetworkPolicy selects on them. */}}
{{- define "diverge.sandboxLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sandbox
divergedev.com/sandbox: "true"
{{- end -}}

{{/* Restricted container security context (Pod Security Standard "restricted"). */}}
{{- define "diverge.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
