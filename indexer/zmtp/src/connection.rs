//! One ZMTP connection after accept or connect: reads through the [`Decoder`], charges what it
//! holds to the socket's budget, answers PINGs, sends PINGs to a silent 3.1 peer and closes a
//! connection that stays silent past the idle timeout. SUB and DEALER both sit on it.
//!
//! Reads go into a fixed 32 KiB buffer per connection, so an idle connection costs that and no
//! more; bytes are charged to the budget before they are decoded, and each finished message
//! takes its share of the charge with it (see [`crate::budget`]).
//!
//! Timers: one `Sleep` per connection, re-armed only when it fires (a read just records the
//! time), so a busy connection pays one clock read per `read`, not a timer per message.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep_until, timeout, timeout_at, Instant, Sleep};

use crate::budget::Lease;
use crate::command::{self, Command};
use crate::decoder::{Decoder, Item};
use crate::error::{ProtocolError, Reason};
use crate::frame;
use crate::limits::Limits;
use crate::transport::Stream;

const READ_BUFFER: usize = 32 << 10;

pub(crate) struct Connection {
    stream: Stream,
    decoder: Decoder,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Covers what the decoder holds plus the undecoded bytes in `buf`.
    lease: Lease,
    speaks_31: bool,
    heartbeat: Duration,
    idle: Duration,
    last_rx: Instant,
    pinged: bool,
    timer: Pin<Box<Sleep>>,
}

impl Connection {
    pub(crate) fn new(stream: Stream, limits: &Limits, lease: Lease) -> Connection {
        let now = Instant::now();
        Connection {
            stream,
            decoder: Decoder::new(limits),
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            lease,
            speaks_31: false,
            heartbeat: limits.heartbeat_interval,
            idle: limits.idle_timeout,
            last_rx: now,
            pinged: false,
            timer: Box::pin(sleep_until(now + limits.idle_timeout)),
        }
    }

    /// From the handshake on, whether the peer gets 3.1 commands (PING, SUBSCRIBE).
    pub(crate) fn set_speaks_31(&mut self, yes: bool) {
        self.speaks_31 = yes;
        self.rearm();
    }

    pub(crate) fn speaks_31(&self) -> bool {
        self.speaks_31
    }

    /// Writes `bytes` (whole frames), giving up after the idle timeout: a peer that does not
    /// read cannot park us in a write.
    pub(crate) async fn write(&mut self, bytes: &[u8]) -> Result<(), Reason> {
        match timeout(self.idle, self.stream.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Reason::from_io(&e)),
            Err(_) => Err(Reason::IdleTimeout),
        }
    }

    pub(crate) async fn send_message(&mut self, frames: &[Bytes]) -> Result<(), Reason> {
        self.write(&frame::encode_message(frames)).await
    }

    /// The next message; commands in between are handled (PING answered, the rest ignored)
    /// and ERROR ends the connection with the peer's reason.
    pub(crate) async fn recv(&mut self) -> Result<(Vec<Bytes>, Lease), Reason> {
        loop {
            match self.next_item().await? {
                (Item::Message(frames), lease) => return Ok((frames, lease)),
                (Item::Command(Command::Ping { context }), _) => self.write(&command::pong(&context)).await?,
                (Item::Command(Command::Error { reason }), _) => {
                    return Err(ProtocolError::PeerError(String::from_utf8_lossy(&reason).into_owned()).into())
                }
                (Item::Command(_) | Item::Greeting(_), _) => {}
            }
        }
    }

    /// The next decoded item; a message comes with the lease for its bytes.
    pub(crate) async fn next_item(&mut self) -> Result<(Item, Lease), Reason> {
        loop {
            if self.start < self.end {
                let mut input = &self.buf[self.start..self.end];
                let before = input.len();
                let decoded = self.decoder.decode(&mut input);
                self.start += before - input.len();
                match decoded {
                    Err(e) => return Err(e.into()),
                    Ok(Some(item)) => {
                        let share = match &item {
                            Item::Message(frames) => frames.iter().map(Bytes::len).sum(),
                            _ => 0,
                        };
                        return Ok((item, self.lease.split(share)));
                    }
                    Ok(None) => {}
                }
            }
            self.lease.shrink_to(self.decoder.held_bytes());
            self.fill().await?;
        }
    }

    /// Reads at least one byte into the (empty) buffer and charges it to the budget.
    async fn fill(&mut self) -> Result<(), Reason> {
        let n = loop {
            tokio::select! {
                biased;
                read = self.stream.read(&mut self.buf[..]) => {
                    let n = read.map_err(|e| Reason::from_io(&e))?;
                    if n == 0 {
                        return Err(Reason::Closed);
                    }
                    self.last_rx = Instant::now();
                    self.pinged = false;
                    break n;
                }
                () = &mut self.timer => self.on_timer().await?,
            }
        };
        self.start = 0;
        self.end = n;
        if !self.lease.try_grow(n) {
            if self.decoder.held_bytes() == 0 {
                // Holding nothing, waiting costs nothing: this is plain backpressure.
                self.lease.grow(n).await;
            } else {
                // Holding part of a message: wait no longer than an idle peer would be allowed,
                // so connections that hold bytes cannot wait on each other for ever.
                timeout_at(self.last_rx + self.idle, self.lease.grow(n)).await.map_err(|_| Reason::IdleTimeout)?;
            }
        }
        Ok(())
    }

    async fn on_timer(&mut self) -> Result<(), Reason> {
        let silent = self.last_rx.elapsed();
        if silent >= self.idle {
            return Err(Reason::IdleTimeout);
        }
        if self.speaks_31 && !self.pinged && silent >= self.heartbeat {
            self.write(&command::ping()).await?;
            self.pinged = true;
        }
        self.rearm();
        Ok(())
    }

    fn rearm(&mut self) {
        let next =
            if self.speaks_31 && !self.pinged { self.last_rx + self.heartbeat } else { self.last_rx + self.idle };
        self.timer.as_mut().reset(next);
    }
}
