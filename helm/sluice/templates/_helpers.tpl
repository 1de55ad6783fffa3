{{/* Names and labels shared by every object of the chart. */}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sluice.agentSelector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/component: agent
{{- end -}}

{{- define "sluice.operatorSelector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/component: operator
{{- end -}}

{{/* The agent's image, by digest when one is given. */}}
{{- define "sluice.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- define "sluice.agentServiceAccount" -}}
{{ .Values.serviceAccounts.agent.name | default "sluice" }}
{{- end -}}

{{- define "sluice.operatorServiceAccount" -}}
{{ .Values.serviceAccounts.operator.name | default "sluice-operator" }}
{{- end -}}

{{/* Where the agent container sees the host's CNI directories. */}}
{{- define "sluice.hostCniBin" -}}/host/opt/cni/bin{{- end -}}
{{- define "sluice.hostCniConf" -}}/host/etc/cni/net.d{{- end -}}

{{/* kubeProxyReplacement as a bool: Cilium's charts take true/false as bools or strings. */}}
{{- define "sluice.kubeProxyReplacement" -}}
{{- $kpr := .Values.kubeProxyReplacement | toString -}}
{{- if eq $kpr "true" -}}true{{- else -}}false{{- end -}}
{{- end -}}
