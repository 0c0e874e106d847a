{{/* Names, labels and the TOML writer shared by the templates. */}}

{{- define "rasd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rasd.fullname" -}}
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

{{- define "rasd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "rasd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rasd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of the controller (component=controller) */}}
{{- define "rasd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rasd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "rasd.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rasd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "rasd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rasd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rasd.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The Secret mounted for TLS: tls.secretName, else <fullname>-tls when cert-manager issues it. */}}
{{- define "rasd.tlsSecretName" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "rasd.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "rasd.kubernetesQuarantine" -}}
{{- if eq (toString (default "record" .Values.config.quarantine.adapter)) "kubernetes" -}}true{{- end -}}
{{- end -}}

{{/*
controller.toml / agent.toml from a values map. Helm's own toToml cannot be used: values read from YAML
are float64, so toToml writes `max_attempts_reset_gpu = 2.0`, which the controller rightly refuses for
an integer setting. Here an integral number is written as a TOML integer (every float setting accepts
one), other numbers as floats, strings as JSON strings (valid TOML basic strings), maps as [tables]
in key order, maps inside arrays (the power tree's rows, racks and nodes) as inline tables; null
values are left out.
*/}}
{{- define "rasd.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "rasd.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "bool" $v -}}
{{- $v -}}
{{- else if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) (kindIs "int32" $v) (kindIs "uint64" $v) -}}
{{- $v -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $item := $v -}}{{- if $i }}, {{ end -}}{{- include "rasd.toml.value" $item -}}{{- end -}}]
{{- else if kindIs "map" $v -}}
{ {{- $first := true -}}
{{- range $key, $item := $v -}}
{{- if not (kindIs "invalid" $item) -}}
{{- if not $first }}, {{ end -}}{{- $first = false -}}
{{- include "rasd.toml.key" $key }} = {{ include "rasd.toml.value" $item -}}
{{- end -}}
{{- end -}} }
{{- else -}}
{{- fail (printf "cannot write %v (%s) as a TOML value" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* (list path map): the scalar keys of map, then its sub-tables. */}}
{{- define "rasd.toml.table" -}}
{{- $path := index . 0 -}}
{{- $table := index . 1 -}}
{{- if $path }}
[{{ $path }}]
{{- end }}
{{- range $key, $value := $table }}
{{- if and (not (kindIs "map" $value)) (not (kindIs "invalid" $value)) }}
{{ include "rasd.toml.key" $key }} = {{ include "rasd.toml.value" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- if kindIs "map" $value }}
{{- $sub := include "rasd.toml.key" $key }}
{{- if $path }}{{ $sub = printf "%s.%s" $path $sub }}{{ end }}
{{ include "rasd.toml.table" (list $sub $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The controller.toml document: the config tables, an empty [bmc] left out. */}}
{{- define "rasd.controllerToml" -}}
{{- $config := deepCopy .Values.config -}}
{{- if not $config.bmc }}{{ $_ := unset $config "bmc" }}{{ end -}}
{{- if not $config.power }}{{ $_ := unset $config "power" }}{{ end -}}
# controller.toml rendered by the rasd Helm chart from .Values.config; edit the values, not this file.
{{- include "rasd.toml.table" (list "" $config) }}
{{ end -}}
