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

{{/* A probe on a readiness file (resmgr/readyfile.py): passes while the file is younger than a
minute. The daemon rewrites it every 10 s while ready and removes it when not, so a daemon that
says no or hangs fails; it costs a shell and find, not a Python process per look. */}}
{{- define "cri-resmgr.readyFileProbe" -}}
exec:
  command: ["sh", "-c", "test -n \"$(find {{ . }} -mmin -1 2>/dev/null)\""]
{{- end }}
