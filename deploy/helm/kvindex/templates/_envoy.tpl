{{/* An h2c STRICT_DNS cluster for an ext_proc service. Args: name, host, port. */}}
{{- define "kvindex.envoyGrpcCluster" -}}
- name: {{ .name }}
  type: STRICT_DNS
  connect_timeout: 1s
  typed_extension_protocol_options:
    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
      "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
      explicit_http_config: {http2_protocol_options: {}}
  load_assignment:
    cluster_name: {{ .name }}
    endpoints:
    - lb_endpoints:
      - endpoint: {address: {socket_address: {address: {{ .host }}, port_value: {{ .port }}}}}
{{- end -}}

{{/* The cluster that sends each request to the address the picker named in
     x-gateway-destination-endpoint (llm-d's chart does the same). */}}
{{- define "kvindex.envoyPoolCluster" -}}
- name: inference-pool
  type: ORIGINAL_DST
  connect_timeout: 5s
  lb_policy: CLUSTER_PROVIDED
  original_dst_lb_config:
    use_http_header: true
    http_header_name: x-gateway-destination-endpoint
{{- end -}}

{{/* The pre-filter's ext_proc filter: request headers and body only, fail-open. */}}
{{- define "kvindex.prefilterFilter" -}}
name: kvindex.prefilter
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service: {envoy_grpc: {cluster_name: {{ .cluster }}}, timeout: 5s}
  failure_mode_allow: true
  message_timeout: 1000s
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SKIP
    request_body_mode: FULL_DUPLEX_STREAMED
    response_body_mode: NONE
    request_trailer_mode: SEND
    response_trailer_mode: SKIP
{{- end -}}

{{/* An endpoint picker's ext_proc filter (llm-d's modes). Args: cluster, failOpen, forward. */}}
{{- define "kvindex.pickerFilter" -}}
name: envoy.filters.http.ext_proc
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service: {envoy_grpc: {cluster_name: {{ .cluster }}}, timeout: 5s}
  failure_mode_allow: {{ .failOpen }}
  message_timeout: 1000s
  {{- if .forward }}
  metadata_options:
    forwarding_namespaces:
      untyped: ["envoy.lb.subset_hint"]
  {{- end }}
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SEND
    request_body_mode: FULL_DUPLEX_STREAMED
    response_body_mode: FULL_DUPLEX_STREAMED
    request_trailer_mode: SEND
    response_trailer_mode: SEND
{{- end -}}

{{/* A bootstrap: one listener routing everything to the pool through the given filters. */}}
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
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: inference-pool, timeout: 0s}
          http_filters:
          {{- .filters | nindent 10 }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  {{- .clusters | nindent 2 }}
  {{- include "kvindex.envoyPoolCluster" . | nindent 2 }}
{{- end -}}
