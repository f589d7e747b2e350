//! `envoy.service.ext_proc.v3.ExternalProcessor/Process`: each call is one HTTP request through
//! the gateway, served by its own task ([`super::stream`]) so a slow or broken stream holds up
//! no other.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::stream::{self, Shared};

/// Answers queued per stream before the stream task waits for Envoy to read them.
const OUTBOUND_QUEUE: usize = 16;

pub struct Picker {
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        tokio::spawn(stream::run(self.shared.clone(), request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
