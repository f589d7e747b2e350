//! Reading a server's Prometheus text in tests: one parser for every crate's "the counter went
//! up" assertion, and a plain `GET /metrics` for the servers a test reaches over loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The sum of every sample of `name` whose line contains each of `labels` (fragments such as
/// `reason="disabled"`). `name` matches whole: `x_total` does not count `x_total_seconds`.
/// Comment lines and unparsable values are passed over; no sample gives 0.
pub fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `GET /metrics` from `addr` over plain HTTP/1.1 (`Connection: close`), the body as text.
/// Panics (failing the test) when the server cannot be reached or does not answer 200.
pub fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr} for /metrics: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    // One write: `write!` sends each formatted piece apart, and a server that answers after the
    // first piece and closes would make the rest a broken pipe.
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send GET /metrics");
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap_or_else(|e| panic!("read /metrics from {addr}: {e}"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET /metrics from {addr}: {head}");
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        crate::http::dechunk(body)
    } else {
        body.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP x_total Things.
# TYPE x_total counter
x_total{reason=\"a\",pod=\"p\"} 2
x_total{reason=\"b\",pod=\"p\"} 3
x_total_seconds 100
x_total 1
y_total{reason=\"a\"} 50
";

    #[test]
    fn samples_of_the_whole_name_are_summed_by_label_fragment() {
        assert_eq!(sum(TEXT, "x_total", &[]), 6.0);
        assert_eq!(sum(TEXT, "x_total", &["reason=\"a\""]), 2.0);
        assert_eq!(sum(TEXT, "x_total", &["reason=\"b\"", "pod=\"p\""]), 3.0);
        assert_eq!(sum(TEXT, "x_total", &["reason=\"c\""]), 0.0);
        assert_eq!(sum(TEXT, "x_total_seconds", &[]), 100.0);
        assert_eq!(sum(TEXT, "nothing", &[]), 0.0);
    }

    #[test]
    fn a_real_listener_is_scraped() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // The whole request head before the answer, as a real server reads it.
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                request.push(byte[0]);
            }
            conn.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nup 1\nx \r\n3\r\n4\n\n\r\n0\r\n\r\n",
            )
            .unwrap();
        });
        let text = scrape(&addr);
        server.join().unwrap();
        assert_eq!(sum(&text, "x", &[]), 4.0);
        assert_eq!(sum(&text, "up", &[]), 1.0);
    }
}
