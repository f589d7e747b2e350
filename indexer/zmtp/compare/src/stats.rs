//! What a subscriber run measured, the process figures it is read from (CPU time, peak RSS,
//! open descriptors), and the medians reported across runs.

use std::time::Duration;

/// Latencies (µs) and counts gathered by a subscriber.
#[derive(Default)]
pub struct Tally {
    pub latencies_us: Vec<u64>,
    pub per_publisher: Vec<u64>,
    pub first: Option<std::time::Instant>,
    pub last: Option<std::time::Instant>,
}

impl Tally {
    pub fn new(publishers: usize) -> Tally {
        Tally { per_publisher: vec![0; publishers], ..Tally::default() }
    }

    /// Records one message from publisher `index` sent at `sent_ns` (UNIX ns).
    pub fn record(&mut self, index: usize, sent_ns: u64) {
        let now = std::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        if let Some(n) = self.per_publisher.get_mut(index) {
            *n += 1;
        }
        self.latencies_us.push(unix_ns().saturating_sub(sent_ns) / 1000);
    }

    pub fn received(&self) -> u64 {
        self.per_publisher.iter().sum()
    }

    pub fn summary(&mut self, expected_each: u64, cpu: Duration) -> serde_json::Value {
        self.latencies_us.sort_unstable();
        let pct = |p: f64| {
            if self.latencies_us.is_empty() {
                0
            } else {
                self.latencies_us[((self.latencies_us.len() - 1) as f64 * p) as usize]
            }
        };
        let received = self.received();
        let span = match (self.first, self.last) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let starved = self.per_publisher.iter().filter(|&&n| n < expected_each).count();
        serde_json::json!({
            "received": received,
            "expected": expected_each * self.per_publisher.len() as u64,
            "publishers_short": starved,
            "span_s": span,
            "msgs_per_s": if span > 0.0 { received as f64 / span } else { 0.0 },
            "cpu_s": cpu.as_secs_f64(),
            "cpu_us_per_msg": if received > 0 { cpu.as_secs_f64() * 1e6 / received as f64 } else { 0.0 },
            "p50_us": pct(0.50),
            "p99_us": pct(0.99),
            "max_us": pct(1.0),
            "peak_rss_mib": peak_rss_kib(std::process::id()) as f64 / 1024.0,
        })
    }
}

pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// User + system CPU time of this process.
pub fn cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
