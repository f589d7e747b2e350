//! The router's front doors, each speaking one protocol and placing through the same pipeline
//! ([`crate::place`]): the OpenAI-compatible proxy with the admin and metrics listeners
//! ([`http`]), and the Gateway API endpoint picker over Envoy's ext_proc ([`ext_proc`]). The
//! bound on request bytes buffered at once ([`budget`]) is shared by both.

pub mod budget;
pub mod ext_proc;
pub mod http;
