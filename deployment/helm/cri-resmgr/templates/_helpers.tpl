{{- define "cri-resmgr.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cri-resmgr.labels" -}}
app.kubernetes.io/part-of: cri-resmgr
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "cri-resmgr.webhookName" -}}
cri-resmgr-webhook
{{- end -}}
