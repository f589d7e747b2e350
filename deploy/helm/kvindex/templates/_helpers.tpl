{{/* Prefix of every object's name. */}}
{{- define "kvindex.prefix" -}}
{{- default .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvindex.name" -}}
{{- printf "%s-%s" (include "kvindex.prefix" .root) .component -}}
{{- end -}}

{{- define "kvindex.labels" -}}
app.kubernetes.io/name: {{ include "kvindex.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: kvindex
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "kvindex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvindex.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "kvindex.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "kvindex.serviceAccountName" -}}
{{- if eq .Values.layout "epp-sidecar" -}}
{{ .Values.eppSidecar.serviceAccountName }}
{{- else -}}
{{ default (printf "%s-kvindex" (include "kvindex.prefix" .)) .Values.discovery.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- define "kvindex.engineSelector" -}}
{{- $parts := list -}}
{{- range $k, $v := .Values.engines.labels -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{/* Pod discovery flags, shared by kvindex serve and kvindex-router. */}}
{{- define "kvindex.discoveryArgs" -}}
{{- /* Every DP rank offsets both ports by its rank (vLLM's and SGLang's rule): ports closer than
     dpSize collide (rank 1's PUB would be rank 0's replay ROUTER; the engine cannot bind it). */ -}}
{{- $dp := int .Values.engines.dpSize -}}
{{- $gap := sub (int .Values.engines.replayPort) (int .Values.engines.pubPort) -}}
{{- if and (gt $dp 1) (lt (max $gap (mul -1 $gap)) $dp) -}}
{{- fail (printf "engines.pubPort (%v) and engines.replayPort (%v) must be at least engines.dpSize (%v) apart: every DP rank adds its rank to both, so rank 1's PUB would be rank 0's replay ROUTER (e.g. replayPort: 6557)" .Values.engines.pubPort .Values.engines.replayPort $dp) -}}
{{- end -}}
- --discovery=kubernetes
- --discovery-namespace={{ default "$(POD_NAMESPACE)" .Values.discovery.namespace }}
- --discovery-label-selector={{ include "kvindex.engineSelector" . }}
- --discovery-http-port={{ .Values.engines.httpPort }}
- --discovery-dp-size={{ .Values.engines.dpSize }}
- --discovery-model={{ .Values.model }}
{{- end -}}

{{- define "kvindex.hashArgs" -}}
{{- if .Values.engines.pythonHashSeed }}
- --hash-seed={{ .Values.engines.pythonHashSeed }}
{{- end }}
- --hash-algo={{ .Values.engines.hashAlgo }}
- --vllm-version={{ .Values.engines.vllmVersion }}
{{- end -}}

{{- define "kvindex.podNamespaceEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{- define "kvindex.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The sidecar containers of the epp-sidecar layout (indexer in central mode, router as
     pre-filter, tokenizer), all on ports clear of the EPP's. No readiness probes: a pod is ready
     only when all its containers are, and the fail-open pre-filter must never take the EPP out
     of its Service; liveness probes restart a hung sidecar alone. */}}
{{- define "kvindex.eppSidecarContainers" -}}
{{- $p := .Values.eppSidecar.ports -}}
- name: kvindex
  image: {{ include "kvindex.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["kvindex"]
  args:
  - serve
  - --grpc-addr=127.0.0.1:{{ $p.indexerGrpc }}
  - --http-addr=0.0.0.0:{{ $p.indexerHttp }}
  - --probe-addr=0.0.0.0:{{ $p.indexerProbe }}
  - --block-size={{ .Values.blockSize }}
  - --zmq-bind=tcp://*:{{ $p.events }}
  - --max-entries={{ printf "%.0f" (float64 .Values.indexer.maxEntries) }}
  - --apply-workers={{ .Values.indexer.applyWorkers }}
  {{- include "kvindex.hashArgs" . | trim | nindent 2 }}
  {{- if .Values.tokenizer.enabled }}
  - --tokenizer-endpoint=http://127.0.0.1:{{ $p.tokenizerGrpc }}
  {{- end }}
  {{- include "kvindex.snapshotArgs" . | trim | nindent 2 }}
  {{- if .Values.adminToken.enabled }}
  - --admin-token-file={{ include "kvindex.adminTokenPath" . }}
  {{- end }}
  {{- with .Values.indexer.extraArgs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  env:
  - name: RUST_LOG
    value: {{ .Values.indexer.logLevel }}
  ports:
  - name: kv-events
    containerPort: {{ $p.events }}
  - name: kvindex-http
    containerPort: {{ $p.indexerHttp }}
  - name: kvindex-probe
    containerPort: {{ $p.indexerProbe }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ $p.indexerProbe }}
    periodSeconds: 10
    failureThreshold: 6
  {{- if or .Values.indexer.snapshots.enabled .Values.adminToken.enabled }}
  volumeMounts:
  {{- include "kvindex.snapshotMount" . | trim | nindent 2 }}
  {{- include "kvindex.adminTokenMount" . | trim | nindent 2 }}
  {{- end }}
  resources:
    {{- toYaml .Values.indexer.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .Values.podSecurityContext.runAsUser }}
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
- name: kvindex-router
  image: {{ include "kvindex.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["kvindex-router"]
  args:
  - serve
  - --http-addr=0.0.0.0:{{ $p.routerHttp }}
  - --probe-addr=0.0.0.0:{{ $p.routerProbe }}
  - --indexer=127.0.0.1:{{ $p.indexerGrpc }}
  {{- if .Values.tokenizer.enabled }}
  - --tokenizer-endpoint=127.0.0.1:{{ $p.tokenizerGrpc }}
  {{- end }}
  - --model={{ .Values.model }}
  - --block-size={{ .Values.blockSize }}
  - --ext-proc-addr=0.0.0.0:{{ $p.prefilter }}
  - --ext-proc-health-addr=0.0.0.0:{{ $p.prefilterHealth }}
  - --ext-proc-mode=prefilter
  - --load-band={{ .Values.router.loadBand }}
  - --score-deadline-ms={{ .Values.router.scoreDeadlineMs }}
  - --log-format={{ .Values.router.logFormat }}
  {{- if .Values.adminToken.enabled }}
  - --indexer-admin-token-file={{ include "kvindex.adminTokenPath" . }}
  {{- end }}
  {{- include "kvindex.discoveryArgs" . | nindent 2 }}
  {{- with .Values.router.extraArgs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  env:
  {{- include "kvindex.podNamespaceEnv" . | nindent 2 }}
  ports:
  - name: kvindex-xproc
    containerPort: {{ $p.prefilter }}
  - name: kvindex-xhealth
    containerPort: {{ $p.prefilterHealth }}
  - name: router-http
    containerPort: {{ $p.routerHttp }}
  - name: router-probe
    containerPort: {{ $p.routerProbe }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ $p.routerProbe }}
    periodSeconds: 10
    failureThreshold: 6
  {{- if .Values.adminToken.enabled }}
  volumeMounts:
  {{- include "kvindex.adminTokenMount" . | trim | nindent 2 }}
  {{- end }}
  resources:
    {{- toYaml .Values.router.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .Values.podSecurityContext.runAsUser }}
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
{{- if .Values.tokenizer.enabled }}
- name: kvindex-tokenizer
  image: {{ include "kvindex.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["kvindex-tokenizer"]
  args:
  - serve
  - --grpc-addr=127.0.0.1:{{ $p.tokenizerGrpc }}
  - --http-addr=0.0.0.0:{{ $p.tokenizerHttp }}
  - --model={{ .Values.model }}=/tokenizers/{{ .Values.model }}
  - --preload={{ .Values.model }}
  - --max-loaded-models={{ .Values.tokenizer.maxLoadedModels }}
  resources:
    {{- toYaml .Values.tokenizer.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .Values.podSecurityContext.runAsUser }}
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
  - name: kvindex-tokenizers
    mountPath: /tokenizers
    readOnly: true
{{- end }}
{{- end -}}

{{/* The admin token: the Secret's name, and where the indexer and the routers read it. */}}
{{- define "kvindex.adminTokenSecret" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin-token" (include "kvindex.prefix" .)) -}}
{{- end -}}
{{- define "kvindex.adminTokenPath" -}}
/etc/kvindex/admin/{{ .Values.adminToken.key }}
{{- end -}}
{{- define "kvindex.adminTokenMount" -}}
{{- if .Values.adminToken.enabled }}
- name: kvindex-admin-token
  mountPath: /etc/kvindex/admin
  readOnly: true
{{- end }}
{{- end -}}
{{- define "kvindex.adminTokenVolume" -}}
{{- if .Values.adminToken.enabled }}
- name: kvindex-admin-token
  secret:
    secretName: {{ include "kvindex.adminTokenSecret" . }}
    defaultMode: 0444
{{- end }}
{{- end -}}

{{/* The indexer's snapshot directory (warm restarts), its flags, mount and volume. */}}
{{- define "kvindex.snapshotArgs" -}}
{{- if .Values.indexer.snapshots.enabled }}
- --snapshot-dir=/var/lib/kvindex/snapshots
- --snapshot-interval={{ .Values.indexer.snapshots.intervalSeconds }}
{{- end }}
{{- end -}}
{{- define "kvindex.snapshotMount" -}}
{{- if .Values.indexer.snapshots.enabled }}
- name: kvindex-snapshots
  mountPath: /var/lib/kvindex/snapshots
{{- end }}
{{- end -}}
{{- define "kvindex.snapshotVolume" -}}
{{- $s := .Values.indexer.snapshots -}}
{{- if $s.enabled }}
- name: kvindex-snapshots
  emptyDir:
    sizeLimit: {{ $s.sizeLimit }}
{{- end }}
{{- end -}}

{{/* The volumes of the sidecar containers (tokenizers, snapshots, admin token). */}}
{{- define "kvindex.eppSidecarVolumes" -}}
{{- if .Values.tokenizer.enabled }}
- name: kvindex-tokenizers
  {{- toYaml .Values.tokenizer.volume | nindent 2 }}
{{- end }}
{{- include "kvindex.snapshotVolume" . }}
{{- include "kvindex.adminTokenVolume" . }}
{{- end -}}
