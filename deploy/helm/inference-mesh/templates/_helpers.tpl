{{/* Names and labels. */}}
{{- define "inference-mesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "inference-mesh.fullname" -}}
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

{{- define "inference-mesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inference-mesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.role }}
{{- end -}}

{{- define "inference-mesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "inference-mesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: inference-mesh
{{- end -}}

{{- define "inference-mesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "inference-mesh.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "inference-mesh.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Whether this role serves models / opens a feature store. */}}
{{- define "inference-mesh.servesModels" -}}
{{- if ne .Values.role "features" -}}true{{- end -}}
{{- end -}}
{{- define "inference-mesh.usesStore" -}}
{{- if and (ne .Values.role "model") (or .Values.features.enabled .Values.redis.enabled) -}}true{{- end -}}
{{- end -}}
{{- define "inference-mesh.sledPvc" -}}
{{- if and (include "inference-mesh.usesStore" .) (not .Values.redis.enabled) (eq .Values.features.sled.storage "pvc") -}}true{{- end -}}
{{- end -}}

{{/* Paths inside the container (the Dockerfile's layout). */}}
{{- define "inference-mesh.modelsPath" -}}
{{- if .Values.models.volume -}}
{{- if .Values.models.subPath -}}{{ printf "%s/%s" .Values.models.mountPath .Values.models.subPath }}{{- else -}}{{ .Values.models.mountPath }}{{- end -}}
{{- else -}}
/models
{{- end -}}
{{- end -}}

{{/*
The scaling signal: the mean time a request waited in the models' batch queues,
in microseconds, across the release's pods, over the window. When no request
came (the rate of the count is 0) the sum is 0 too, and the query answers 0, not
NaN. `autoscaling.query` replaces it whole.
*/}}
{{- define "inference-mesh.scalingQuery" -}}
{{- $a := .Values.autoscaling -}}
{{- if $a.query -}}
{{- tpl $a.query . -}}
{{- else -}}
{{- $sel := tpl $a.selector . -}}
{{- printf "sum(rate(mesh_model_queue_wait_seconds_sum{%s}[%s])) * 1e6 / clamp_min(sum(rate(mesh_model_queue_wait_seconds_count{%s}[%s])), 1e-9)" $sel $a.window $sel $a.window -}}
{{- end -}}
{{- end -}}

{{/*
A small TOML writer for mesh.toml (Helm's toToml writes every YAML number as a
float, and the mesh wants integers for ports and counts). Strings are written as
JSON strings (valid TOML basic strings), whole numbers as integers, lists inline,
maps as tables, lists of maps as arrays of tables.
*/}}
{{- define "inference-mesh.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "inference-mesh.tomlIsTables" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) -}}
{{- $all := true -}}
{{- range . -}}{{- if not (kindIs "map" .) -}}{{- $all = false -}}{{- end -}}{{- end -}}
{{- if $all -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "inference-mesh.tomlValue" -}}
{{- $k := kindOf . -}}
{{- if eq $k "string" -}}{{ toJson . }}
{{- else if eq $k "bool" -}}{{ . }}
{{- else if or (eq $k "float64") (eq $k "float32") -}}
{{- if eq (float64 (int64 .)) (float64 .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if or (eq $k "int") (eq $k "int64") (eq $k "int32") (eq $k "uint64") -}}{{ . }}
{{- else if eq $k "slice" -}}[{{- range $i, $e := . -}}{{- if $i }}, {{ end -}}{{- include "inference-mesh.tomlValue" $e -}}{{- end -}}]
{{- else if eq $k "map" -}}{ {{- $first := true -}}{{- range $key, $v := . -}}{{- if not $first }}, {{ end -}}{{- $first = false -}}{{- include "inference-mesh.tomlKey" $key }} = {{ include "inference-mesh.tomlValue" $v -}}{{- end -}} }
{{- else -}}{{- fail (printf "config: a %s value has no TOML form (null or empty?)" $k) -}}
{{- end -}}
{{- end -}}

{{- define "inference-mesh.tomlTable" -}}
{{- $path := .path -}}
{{- range $key, $v := .table -}}
{{- if not (or (kindIs "map" $v) (include "inference-mesh.tomlIsTables" $v)) }}
{{ include "inference-mesh.tomlKey" $key }} = {{ include "inference-mesh.tomlValue" $v }}
{{- end -}}
{{- end -}}
{{- range $key, $v := .table -}}
{{- $p := ternary (include "inference-mesh.tomlKey" $key) (printf "%s.%s" $path (include "inference-mesh.tomlKey" $key)) (eq $path "") -}}
{{- if kindIs "map" $v }}

[{{ $p }}]
{{- include "inference-mesh.tomlTable" (dict "path" $p "table" $v) -}}
{{- else if include "inference-mesh.tomlIsTables" $v -}}
{{- range $e := $v }}

[[{{ $p }}]]
{{- include "inference-mesh.tomlTable" (dict "path" $p "table" $e) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
mesh.toml as a dict: `config` with the keys the chart owns filled in. A key the
chart owns that `config` also sets fails the render, naming the value to use.
*/}}
{{- define "inference-mesh.meshConfig" -}}
{{- $cfg := deepCopy (default dict .Values.config) -}}
{{- $owned := dict
  "server" (list "host" "grpc_port" "http_port" "models" "role")
  "tls" (list "cert" "key" "client_ca")
  "admin" (list "token_file" "token_env")
  "writer" (list "token_file" "token_env")
  "features" (list "path" "views" "backend" "redis_url" "redis_cluster" "redis_password_file")
  "prediction_log" (list "dir") -}}
{{- range $section, $keys := $owned -}}
{{- $t := get $cfg $section -}}
{{- if $t -}}
{{- if not (kindIs "map" $t) -}}{{- fail (printf "config.%s must be a table" $section) -}}{{- end -}}
{{- range $keys -}}
{{- if hasKey $t . -}}{{- fail (printf "config.%s.%s is set by the chart, not in config (see values.yaml: ports, models, role, tls, adminToken, writerToken, features, predictionLog)" $section .) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $userClient := get (default dict (get $cfg "tls")) "client" -}}
{{- if $userClient -}}
{{- range list "ca" "cert" "key" -}}
{{- if hasKey $userClient . -}}{{- fail (printf "config.tls.client.%s is set by the chart (tls.client)" .) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $tls := default dict (get $cfg "tls") -}}
{{- $_ := set $tls "cert" "/etc/mesh/tls/tls.crt" -}}
{{- $_ := set $tls "key" "/etc/mesh/tls/tls.key" -}}
{{- if .Values.tls.clientAuth -}}{{- $_ := set $tls "client_ca" "/etc/mesh/tls/ca.crt" -}}{{- end -}}
{{- $_ := set $cfg "tls" $tls -}}
{{- end -}}
{{- if .Values.tls.client.enabled -}}
{{- $tls := default dict (get $cfg "tls") -}}
{{- $client := default dict (get $tls "client") -}}
{{- $_ := set $client "ca" "/etc/mesh/tls-client/ca.crt" -}}
{{- if .Values.tls.client.clientCertificate -}}
{{- $_ := set $client "cert" "/etc/mesh/tls-client/tls.crt" -}}
{{- $_ := set $client "key" "/etc/mesh/tls-client/tls.key" -}}
{{- end -}}
{{- $_ := set $tls "client" $client -}}
{{- $_ := set $cfg "tls" $tls -}}
{{- end -}}
{{- if .Values.adminToken.secretName -}}
{{- $admin := default dict (get $cfg "admin") -}}
{{- $_ := set $admin "token_file" "/etc/mesh/secrets/admin/token" -}}
{{- $_ := set $cfg "admin" $admin -}}
{{- end -}}
{{- if .Values.writerToken.secretName -}}
{{- $writer := default dict (get $cfg "writer") -}}
{{- $_ := set $writer "token_file" "/etc/mesh/secrets/writer/token" -}}
{{- $_ := set $cfg "writer" $writer -}}
{{- end -}}
{{- if include "inference-mesh.usesStore" . -}}
{{- $features := default dict (get $cfg "features") -}}
{{- if .Values.redis.enabled -}}
{{- $_ := set $features "backend" "redis" -}}
{{- if .Values.redis.url -}}{{- $_ := set $features "redis_url" .Values.redis.url -}}{{- end -}}
{{- if .Values.redis.cluster -}}{{- $_ := set $features "redis_cluster" .Values.redis.cluster -}}{{- end -}}
{{- if .Values.redis.passwordSecret -}}{{- $_ := set $features "redis_password_file" "/etc/mesh/secrets/redis/password" -}}{{- end -}}
{{- else -}}
{{- $_ := set $features "path" "/var/lib/mesh/features" -}}
{{- end -}}
{{- $_ := set $features "views" (ternary "/etc/mesh/config/views.toml" "/etc/mesh/views.toml" (ne .Values.features.views "")) -}}
{{- $_ := set $cfg "features" $features -}}
{{- end -}}
{{- if and .Values.predictionLog.enabled (include "inference-mesh.servesModels" .) -}}
{{- $plog := default dict (get $cfg "prediction_log") -}}
{{- $_ := set $plog "dir" "/var/lib/mesh/predictions" -}}
{{- if .Values.predictionLog.converter.enabled -}}
{{- if hasKey $plog "parquet" -}}
{{- fail "config.prediction_log.parquet is set by the chart when predictionLog.converter.enabled (deferred: the converter container builds the Parquet files)" -}}
{{- end -}}
{{- $_ := set $plog "parquet" "deferred" -}}
{{- end -}}
{{- $_ := set $cfg "prediction_log" $plog -}}
{{- else if get $cfg "prediction_log" -}}
{{- fail "config.prediction_log is set but predictionLog.enabled is false (or the role serves no models)" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The prediction log's volume mount, the same in the mesh's container and the
converter's: on a PVC each pod's own directory.
*/}}
{{- define "inference-mesh.predictionsMount" -}}
- name: predictions
  mountPath: /var/lib/mesh/predictions
  {{- if eq .Values.predictionLog.storage "pvc" }}
  # One directory per pod: the log has one writer per directory.
  subPathExpr: $(POD_NAME)
  {{- end }}
{{- end -}}

{{/* The checks that span several values; the schema checks each value. */}}
{{- define "inference-mesh.validate" -}}
{{- if and .Values.redis.enabled .Values.redis.url .Values.redis.cluster -}}
{{- fail "redis: set url (standalone) or cluster (seed nodes), not both" -}}
{{- end -}}
{{- if and .Values.redis.enabled (not (or .Values.redis.url .Values.redis.cluster)) -}}
{{- fail "redis.enabled needs redis.url or redis.cluster" -}}
{{- end -}}
{{- if and .Values.redis.passwordSecret (not .Values.redis.enabled) -}}
{{- fail "redis.passwordSecret is set but redis.enabled is false" -}}
{{- end -}}
{{- range $u := prepend (default list .Values.redis.cluster) (default "" .Values.redis.url) -}}
{{- if regexMatch "^rediss?://[^/@]*:[^/@]*@" $u -}}
{{- fail (printf "redis: %s carries a password; it would sit in the ConfigMap in clear" (regexReplaceAll ":[^:/@]*@" $u ":***@")) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.client.enabled (not .Values.tls.client.secretName) -}}
{{- fail "tls.client.enabled needs tls.client.secretName (a Secret with ca.crt)" -}}
{{- end -}}
{{- if and .Values.tls.clientAuth (not .Values.tls.enabled) -}}
{{- fail "tls.clientAuth needs tls.enabled" -}}
{{- end -}}
{{- if include "inference-mesh.sledPvc" . -}}
{{- if or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled -}}
{{- fail "features.sled.storage=pvc: a sled store has one writer, so run one pod (replicaCount 1, autoscaling off) or use Redis" -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.role "features") .Values.autoscaling.enabled -}}
{{- fail "autoscaling scales on model queue time; a features role serves no models" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas" -}}
{{- end -}}
{{- $reserved := int (dig "prediction_log" "reserved_cpus" 0 (default dict .Values.config)) -}}
{{- if gt $reserved 0 -}}
{{- $req := include "inference-mesh.wholeCpus" (dig "requests" "cpu" "" .Values.resources) -}}
{{- $lim := include "inference-mesh.wholeCpus" (dig "limits" "cpu" "" .Values.resources) -}}
{{- $memReq := toString (dig "requests" "memory" "" .Values.resources) -}}
{{- $memLim := toString (dig "limits" "memory" "" .Values.resources) -}}
{{- if or (not $req) (ne $req $lim) (not $memReq) (ne $memReq $memLim) -}}
{{- fail (printf "config.prediction_log.reserved_cpus = %d needs CPUs of the pod's own: resources.requests and resources.limits with the same whole cpu and the same memory (Guaranteed QoS), on nodes with the static CPU manager policy" $reserved) -}}
{{- end -}}
{{- if le (atoi $req) $reserved -}}
{{- fail (printf "config.prediction_log.reserved_cpus = %d leaves no CPU to serve: the pod has %s" $reserved $req) -}}
{{- end -}}
{{- end -}}
{{- if .Values.predictionLog.converter.enabled -}}
{{- if not (and .Values.predictionLog.enabled (include "inference-mesh.servesModels" .)) -}}
{{- fail "predictionLog.converter.enabled needs predictionLog.enabled (and a role that serves models)" -}}
{{- end -}}
{{- if gt $reserved 0 -}}
{{- fail "predictionLog.converter.enabled and config.prediction_log.reserved_cpus both keep the log's work off the serving CPUs (the converter on a CPU of its own, the log's threads on CPUs the mesh sets aside): choose one" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A cpu quantity that is a whole number of CPUs ("2", 2, "2000m") as that number; else empty. */}}
{{- define "inference-mesh.wholeCpus" -}}
{{- $s := toString . -}}
{{- if regexMatch "^[1-9][0-9]*$" $s -}}
{{- $s -}}
{{- else if regexMatch "^[1-9][0-9]*000m$" $s -}}
{{- trimSuffix "000m" $s -}}
{{- end -}}
{{- end -}}
