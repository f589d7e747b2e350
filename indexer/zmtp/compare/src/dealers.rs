//! The replay DEALER of each candidate, in a child process (so an abort is an exit status, not
//! the end of the comparison): connect, send vLLM's request `[b"", seq]`, wait for one reply,
//! print what happened.

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

fn report(result: String) {
    println!("{}", json!({ "result": result }));
}

pub fn run(imp: &str, endpoint: &str) {
    let request = [Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())];
    match imp {
        "own" => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                let limits = kvindex_zmtp::Limits::default();
                match kvindex_zmtp::Dealer::request(endpoint, &request, &limits, deadline).await {
                    Ok(mut d) => match d.recv().await {
                        Ok(m) => report(format!("reply of {} frames", m.frames.len())),
                        Err(e) => report(format!("error: {e}")),
                    },
                    Err(e) => report(format!("error: {e}")),
                }
            });
        }
        "libzmq" => {
            let ctx = zmq::Context::new();
            let sock = ctx.socket(zmq::DEALER).unwrap();
            sock.set_maxmsgsize(16 << 20).unwrap();
            sock.set_rcvtimeo(10_000).unwrap();
            sock.connect(endpoint).unwrap();
            sock.send_multipart([&b""[..], &request[1][..]], 0).unwrap();
            match sock.recv_multipart(0) {
                Ok(frames) => report(format!("reply of {} frames", frames.len())),
                Err(e) => report(format!("no reply: {e} (the connection was dropped; libzmq reconnects)")),
            }
        }
        "zeromq" => {
            use zeromq::{Socket, SocketRecv, SocketSend};
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let mut sock = zeromq::DealerSocket::new();
                sock.connect(endpoint).await.unwrap();
                sock.send(zeromq::ZmqMessage::try_from(request.to_vec()).unwrap()).await.unwrap();
                match tokio::time::timeout(Duration::from_secs(10), sock.recv()).await {
                    Ok(Ok(m)) => report(format!("reply of {} frames", m.len())),
                    Ok(Err(e)) => report(format!("error: {e}")),
                    Err(_) => report("no reply in 10 s".into()),
                }
            });
        }
        other => panic!("unknown candidate {other}"),
    }
}
