//! Writing a dump while the service runs (`kvindex record`), within a retention bound.
//!
//! The apply workers hand every message they receive (live, and replay replies) to the
//! [`Recorder`] before sequencing it, and every live connection that closed, so the dump holds
//! what the index was built from and `kvindex replay` sees what the live worker saw. The file
//! rotates once it passes `max_bytes` (the previous one is kept as `<file>.1`, so at most twice
//! the bound is on disk), and so does a file older than `max_age` (so no record is older than
//! twice that): token ids are never kept beyond the bound the operator chose.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use flate2::write::GzEncoder;
use flate2::Compression;
use metrics::counter;
use parking_lot::Mutex;

use super::DumpRecord;
use crate::config::retention::Retention;
use crate::telemetry as m;

pub struct Recorder {
    path: PathBuf,
    retention: Retention,
    inner: Mutex<Open>,
}

struct Open {
    encoder: Option<GzEncoder<File>>,
    opened: Instant,
    /// Uncompressed bytes since the last flush; flushed every 64 KiB.
    unflushed: usize,
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn open(path: &Path) -> std::io::Result<GzEncoder<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(GzEncoder::new(file, Compression::fast()))
}

impl Recorder {
    /// Opens `path` for appending (a new gzip member).
    pub fn new(path: &Path, retention: Retention) -> std::io::Result<Recorder> {
        let encoder = open(path)?;
        Ok(Recorder {
            path: path.to_path_buf(),
            retention,
            inner: Mutex::new(Open { encoder: Some(encoder), opened: Instant::now(), unflushed: 0 }),
        })
    }

    /// Appends one message (`live`, `replay`) or connection event (`disconnect`, no frames);
    /// `conn` is the live connection it came on or closed (see [`DumpRecord::conn`]).
    pub fn record(
        &self,
        kind: &str,
        pod: Option<&str>,
        model: Option<&str>,
        source: Option<&str>,
        conn: Option<u64>,
        frames: &[&[u8]],
    ) {
        let record = DumpRecord {
            t: now_unix(),
            kind: Some(kind.to_string()),
            pod: pod.map(str::to_string),
            model: model.map(str::to_string),
            source: source.map(str::to_string),
            conn,
            frames_hex: frames.iter().map(hex::encode).collect(),
        };
        let mut line = serde_json::to_vec(&record).expect("a dump record serializes");
        line.push(b'\n');
        let mut inner = self.inner.lock();
        if let Err(e) = self.write(&mut inner, &line) {
            counter!(m::DUMP_ERRORS).increment(1);
            tracing::warn!(path = %self.path.display(), error = %e, "dump write failed");
            return;
        }
        counter!(m::DUMP_RECORDS).increment(1);
    }

    fn write(&self, inner: &mut Open, line: &[u8]) -> std::io::Result<()> {
        let encoder = match &mut inner.encoder {
            Some(e) => e,
            None => inner.encoder.insert(open(&self.path)?),
        };
        encoder.write_all(line)?;
        inner.unflushed += line.len();
        let mut rotate = inner.opened.elapsed() >= self.retention.max_age;
        if inner.unflushed >= 64 << 10 {
            encoder.flush()?;
            inner.unflushed = 0;
            rotate |= encoder.get_ref().metadata()?.len() >= self.retention.max_bytes;
        }
        if rotate {
            self.rotate(inner)?;
        }
        Ok(())
    }

    fn rotate(&self, inner: &mut Open) -> std::io::Result<()> {
        if let Some(encoder) = inner.encoder.take() {
            encoder.finish()?;
        }
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        inner.encoder = Some(open(&self.path)?);
        inner.opened = Instant::now();
        counter!(m::DUMP_ROTATIONS).increment(1);
        tracing::info!(path = %self.path.display(), "dump rotated (retention bound)");
        Ok(())
    }

    /// Ends the gzip member, so the file is complete (shutdown).
    pub fn finish(&self) -> std::io::Result<()> {
        let mut inner = self.inner.lock();
        if let Some(encoder) = inner.encoder.take() {
            encoder.finish()?.sync_all()?;
        }
        Ok(())
    }
}
