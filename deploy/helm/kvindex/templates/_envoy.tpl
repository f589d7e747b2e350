{{/* Envoy configuration shared by the endpoint-picker and epp-sidecar bootstraps and the Istio
     patch: the same filters and clusters as deploy/kustomize (tested against a real Envoy in
     router/tests/it/envoy.rs; why each setting is there: deploy/README.md). */}}

{{/* An h2c STRICT_DNS cluster for an ext_proc service. Args: name, host, port, healthCheck
     (kvindex-router's gRPC `readiness`: with no healthy host the filter is skipped at once). */}}
{{- define "kvindex.envoyGrpcCluster" -}}
- name: {{ .name }}
  type: STRICT_DNS
  connect_timeout: 1s
  typed_extension_protocol_options:
    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
      "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
      explicit_http_config: {http2_protocol_options: {}}
  {{- if .healthCheck }}
  common_lb_config: {healthy_panic_threshold: {value: 0}}
  health_checks:
  - timeout: 1s
    interval: 1s
    no_traffic_interval: 1s
    unhealthy_threshold: 2
    healthy_threshold: 1
    grpc_health_check: {service_name: readiness}
  {{- end }}
  load_assignment:
    cluster_name: {{ .name }}
    endpoints:
    - lb_endpoints:
      - endpoint: {address: {socket_address: {address: {{ .host }}, port_value: {{ .port }}}}}
{{- end -}}

{{/* The engines, for kvindex-router as the picker: every ready engine pod (the headless pool
     Service), the picker's envoy.lb metadata choosing among them (override_host, retries walking
     its fallbacks), least-request balancing when there is no pick. Args: host, port. */}}
{{- define "kvindex.envoyPoolByMetadata" -}}
- name: inference-pool
  type: STRICT_DNS
  connect_timeout: 5s
  dns_lookup_family: V4_ONLY
  load_assignment:
    cluster_name: inference-pool
    endpoints:
    - lb_endpoints:
      - endpoint: {address: {socket_address: {address: {{ .host }}, port_value: {{ .port }}}}}
  load_balancing_policy:
    policies:
    - typed_extension_config:
        name: envoy.load_balancing_policies.override_host
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
          override_host_sources:
          - metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}
          selected_host_key: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint-served}]}
          fallback_policy:
            policies:
            - typed_extension_config:
                name: envoy.load_balancing_policies.least_request
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest
{{- end -}}

{{/* The engines, for an EPP that names one pod in x-gateway-destination-endpoint (llm-d's):
     an ORIGINAL_DST cluster connecting to that address (llm-d's chart does the same). */}}
{{- define "kvindex.envoyPoolByHeader" -}}
- name: inference-pool
  type: ORIGINAL_DST
  connect_timeout: 5s
  lb_policy: CLUSTER_PROVIDED
  original_dst_lb_config:
    use_http_header: true
    http_header_name: x-gateway-destination-endpoint
{{- end -}}

{{/* The pre-filter's ext_proc filter: request headers and a BUFFERED body (the mode in which
     Envoy honours failure_mode_allow and message_timeout), fail-open, its hint accepted into
     the stream's metadata for the EPP behind it. */}}
{{- define "kvindex.prefilterFilter" -}}
name: kvindex.prefilter
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service: {envoy_grpc: {cluster_name: {{ .cluster }}}}
  failure_mode_allow: true
  message_timeout: 2s
  metadata_options:
    receiving_namespaces: {untyped: ["envoy.lb.subset_hint"]}
  processing_mode:
    request_header_mode: SEND
    request_body_mode: BUFFERED
    request_trailer_mode: SKIP
    response_header_mode: SKIP
    response_body_mode: NONE
    response_trailer_mode: SKIP
{{- end -}}

{{/* kvindex-router as the endpoint picker: a BUFFERED request body (failOpen is honoured, a
     frozen picker costs one 2 s timeout), the response headers (the served pod comes back in
     envoy.lb), its envoy.lb metadata accepted for override_host. Args: cluster, failOpen. */}}
{{- define "kvindex.pickerFilter" -}}
name: envoy.filters.http.ext_proc
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service: {envoy_grpc: {cluster_name: {{ .cluster }}}}
  failure_mode_allow: {{ .failOpen }}
  message_timeout: 2s
  metadata_options:
    receiving_namespaces: {untyped: ["envoy.lb"]}
    forwarding_namespaces: {untyped: ["envoy.lb"]}
  processing_mode:
    request_header_mode: SEND
    request_body_mode: BUFFERED
    request_trailer_mode: SKIP
    response_header_mode: SEND
    response_body_mode: NONE
    response_trailer_mode: SKIP
{{- end -}}

{{/* An existing EPP's ext_proc filter, in llm-d's modes (FULL_DUPLEX_STREAMED), with the
     pre-filter's envoy.lb.subset_hint forwarded to it. Args: cluster. */}}
{{- define "kvindex.eppFilter" -}}
name: envoy.filters.http.ext_proc
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service: {envoy_grpc: {cluster_name: {{ .cluster }}}, timeout: 5s}
  failure_mode_allow: false
  message_timeout: 1000s
  metadata_options:
    forwarding_namespaces:
      untyped: ["envoy.lb.subset_hint"]
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SEND
    request_body_mode: FULL_DUPLEX_STREAMED
    response_body_mode: FULL_DUPLEX_STREAMED
    request_trailer_mode: SEND
    response_trailer_mode: SEND
{{- end -}}

{{/* A bootstrap: one listener routing everything to the pool through the given filters.
     Args: port, filters, clusters (the pool cluster among them), retries (retry attempts down
     the picker's fallbacks; 0 for none). */}}
{{- define "kvindex.envoyBootstrap" -}}
static_resources:
  listeners:
  - name: inference
    address:
      socket_address: {address: 0.0.0.0, port_value: {{ .port }}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inference
          # Envoy's own error replies (a body past request_body_buffer_limit, no pod reachable, a bad
          # request line) as the OpenAI-shaped JSON error the router and the picker answer with: type
          # server_error for a 5xx, else invalid_request_error; code is Envoy's response code details
          # (request_too_large for a body past the limit, as the router says it). A reply that already is
          # JSON (the picker's own errors) goes out as it was written. (A runtime_key is required by the
          # status filter; none is set, so the default applies.)
          local_reply_config:
            mappers:
            - filter:
                extension_filter:
                  name: envoy.access_loggers.extension_filters.cel
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter
                    expression: "response.headers['content-type'].startsWith('application/json')"
              body_format_override:
                text_format_source: {inline_string: "%LOCAL_REPLY_BODY%"}
                content_type: application/json
            - filter: {status_code_filter: {comparison: {op: EQ, value: {default_value: 413, runtime_key: kvindex.local_reply.too_large}}}}
              body_format_override:
                json_format:
                  error: {message: "the request body is larger than 16777216 bytes", type: invalid_request_error, param: null, code: request_too_large}
            - filter: {status_code_filter: {comparison: {op: GE, value: {default_value: 500, runtime_key: kvindex.local_reply.server_error}}}}
              body_format_override:
                json_format:
                  error: {message: "%LOCAL_REPLY_BODY%", type: server_error, param: null, code: "%RESPONSE_CODE_DETAILS%"}
            body_format:
              json_format:
                error: {message: "%LOCAL_REPLY_BODY%", type: invalid_request_error, param: null, code: "%RESPONSE_CODE_DETAILS%"}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                # The body is buffered for the picker: up to the router's --max-body-bytes.
                request_body_buffer_limit: 16777216
                route:
                  cluster: inference-pool
                  timeout: 0s
                  {{- if .retries }}
                  retry_policy: {retry_on: "connect-failure,refused-stream,reset", num_retries: {{ .retries }}}
                  {{- end }}
          http_filters:
          {{- .filters | nindent 10 }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  {{- .clusters | nindent 2 }}
{{- end -}}
