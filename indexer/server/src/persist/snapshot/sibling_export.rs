//! The whole index, exported for a sibling replica that bootstraps from it
//! (`kvindex.v1.Replica/ExportIndex`): every stream's record at its cursor, captured by the
//! apply workers as a snapshot is (ingest goes on: only a pod being exported waits, see
//! `capture`), and encoded as the snapshot store encodes them, on the snapshot pool below
//! ingest's priority. The encoded export must fit the byte budget, or it is dropped at once.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::format::{self, Header, StreamRecord};
use super::pool;
use crate::protocols::{Captured, HeldMap};
use crate::queue::captures::CaptureError;
use crate::queue::Queues;

/// An encoded export: the header, then one value per stream record.
pub struct Export {
    pub header: Vec<u8>,
    pub records: Vec<Vec<u8>>,
    pub bytes: u64,
    pub residencies: u64,
}

/// Why no export was made.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("the export is larger than the byte budget ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("{0}")]
    Capture(#[from] CaptureError),
    #[error("the export's encoding stopped (a panic, see the log)")]
    EncodingStopped,
}

/// Captures every stream's record and encodes it, within `budget` bytes.
pub async fn export(queues: &Queues, block_size: u64, budget: u64) -> Result<Export, ExportError> {
    let captured = queues.capture(Arc::new(HeldMap::new()), None).await?;
    let records: Vec<StreamRecord> = captured
        .into_iter()
        .filter_map(|c| match c {
            Captured::Fresh { record, .. } => Some(*record),
            // Without a sink, nothing is kept, written or failed.
            Captured::Kept { .. } | Captured::Written { .. } | Captured::Failed { .. } => None,
        })
        .collect();
    let (tx, rx) = tokio::sync::oneshot::channel();
    pool::pool().spawn(move || {
        let _ = tx.send(encode(records, block_size, budget));
    });
    rx.await.unwrap_or(Err(ExportError::EncodingStopped))
}

/// Encodes the records (each dropped as soon as it is encoded) and the header that lists them.
fn encode(records: Vec<StreamRecord>, block_size: u64, budget: u64) -> Result<Export, ExportError> {
    let mut values = Vec::with_capacity(records.len());
    let mut streams = Vec::with_capacity(records.len());
    let (mut bytes, mut residencies) = (0u64, 0u64);
    for record in records {
        let value = format::encode_record(&record);
        bytes += value.len() as u64;
        if bytes > budget {
            return Err(ExportError::TooLarge { limit: budget });
        }
        residencies += record.residencies();
        streams.push((record.key(), format::checksum_of(&value).unwrap_or(0)));
        values.push(value);
    }
    streams.sort_unstable();
    let header = format::encode(&Header {
        recipe_version: kvindex::keys::RECIPE_VERSION,
        block_size,
        created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        residencies,
        streams,
        generation: 0,
        generations: Vec::new(),
    });
    bytes += header.len() as u64;
    if bytes > budget {
        return Err(ExportError::TooLarge { limit: budget });
    }
    Ok(Export { header, records: values, bytes, residencies })
}
