{{/* Names, labels and shared pieces of the gpuportal chart. */}}

{{- define "gpuportal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuportal.fullname" -}}
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

{{/* Labels of every object; the component is added where one applies. */}}
{{- define "gpuportal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuportal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "portal"). The portal's
component label is the one the tenant NetworkPolicies select (IsolationSettings.portal_pod_labels). */}}
{{- define "gpuportal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuportal.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Non-empty when the portal may be upgraded by a rolling update: leader election on
PostgreSQL (an existing Secret, or a postgresql URL). */}}
{{- define "gpuportal.rollingUpgrade" -}}
{{- if and .Values.portal.leaderElection.enabled (or .Values.database.existingSecret (hasPrefix "postgresql" .Values.database.url)) -}}
true
{{- end -}}
{{- end -}}

{{- define "gpuportal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The portal's URL inside the cluster, with its service prefix. */}}
{{- define "gpuportal.portalUrl" -}}
{{- printf "http://%s.%s.svc:%d/services/%s" (include "gpuportal.fullname" .) .Release.Namespace (int .Values.portal.port) .Values.portal.serviceName -}}
{{- end -}}

{{- define "gpuportal.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "gpuportal.fullname" .)) .Values.tokens.existingSecret -}}
{{- end -}}

{{/* Pod-level security context of the restricted Pod Security level. */}}
{{- define "gpuportal.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .runAsUser | default 10001 }}
runAsGroup: {{ .runAsUser | default 10001 }}
fsGroup: {{ .runAsUser | default 10001 }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context of the restricted Pod Security level. */}}
{{- define "gpuportal.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Egress every pod of the chart needs: the cluster DNS. */}}
{{- define "gpuportal.dnsEgress" -}}
- to:
    - namespaceSelector: {}
      podSelector:
        matchLabels:
          k8s-app: kube-dns
  ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
{{- end -}}
