{{/* The release's full name: the release name, or release-chart when the release name does not contain the chart's. */}}
{{- define "cascade-guard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cascade-guard.serviceAccountName" -}}
{{- default (include "cascade-guard.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Selector labels: never change across upgrades (a Deployment's selector is immutable). */}}
{{- define "cascade-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Labels of the chart's own objects. managed-by is Helm here: the value
cascade-guard is reserved for the admission objects the controller generates
(it prunes what carries it), and none of the chart's objects may carry it.
*/}}
{{- define "cascade-guard.labels" -}}
{{ include "cascade-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cascade-guard.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
xrdDefaultMode in its canonical case (convert: Convert), so that the
Deployment's flag and what NOTES.txt prints are the same whatever case the
value was given in; fails on anything but the four modes.
*/}}
{{- define "cascade-guard.xrdDefaultMode" -}}
{{- $given := toString .Values.xrdDefaultMode -}}
{{- $canonical := get (dict "refuse" "Refuse" "convert" "Convert" "warn" "Warn" "off" "Off") (lower $given) -}}
{{- if not $canonical -}}
{{- fail (printf "xrdDefaultMode %q is not one of Refuse, Convert, Warn, Off (in any case)" $given) -}}
{{- end -}}
{{- $canonical -}}
{{- end -}}

{{/*
A map of values without its null entries, as YAML (for fromYaml): a user's
null removes a default key, and must not render as a key with no value.
*/}}
{{- define "cascade-guard.withoutNulls" -}}
{{- $out := dict -}}
{{- range $key, $value := . -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
