//! The router's HTTP listeners hold the indexer's connection caps, on the real binary over
//! loopback TCP from several source addresses (127.0.0.x, and 127.0.1.x as another /24): silent
//! connections from a few addresses filling `--max-connections` no longer keep a new client out
//! (the oldest idle one makes room, counted); a network at `--max-connections-per-network`
//! makes room only among its own connections and is refused once all of them are answering,
//! while another network still gets in; and `--probe-addr` answers `/healthz` and `/readyz`
//! while the public port, every connection answering, refuses each newcomer (counted) until a
//! request ends.

use crate::support::fake_pod::{FakePod, Script};
use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A connection to `addr` from the loopback address `source` (any 127.0.0.0/8 address is local).
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// Asks `GET path` on `stream` (`connection: close`) and returns what came back before the
/// router closed it: empty when it was closed at accept.
async fn get_on(stream: &mut TcpStream, path: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the router neither answered nor closed the connection within {DEADLINE:?}");
    String::from_utf8_lossy(&answer).into_owned()
}

async fn answered(source: &str, addr: &str, path: &str) -> bool {
    get_on(&mut connect_from(source, addr).await, path).await.starts_with("HTTP/1.1 200")
}

/// A completion request sent on `stream` that the hanging pod never answers: the connection is
/// busy (answering) for as long as the test holds it.
async fn busy_from(source: &str, addr: &str) -> TcpStream {
    let mut stream = connect_from(source, addr).await;
    let body = r#"{"model":"m","prompt":"hello","max_tokens":1}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

fn started(bins: &Bins, pod: &FakePod, extra: &[&str]) -> RouterProcess {
    let mut args = vec!["--pod".to_string(), pod.spec(), "--model".into(), "m".into()];
    args.extend(["--metrics-addr", "127.0.0.1:0"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    router(bins, &args)
}

async fn wait_open(metrics: &str, n: f64) {
    wait_for(&format!("{n} connections open on http"), DEADLINE, || async {
        (metric(metrics, "kvindex_router_http_connections", &["listener=\"http\""]).await == n).then_some(())
    })
    .await;
}

async fn counted(metrics: &str, name: &str, reason: &str) -> f64 {
    metric(metrics, name, &["listener=\"http\"", &format!("reason=\"{reason}\"")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_a_few_addresses_filling_the_cap_do_not_keep_a_new_client_out() {
    let bins = bins();
    let pod = FakePod::start(Script::Echo("p".into())).await;
    let router = started(&bins, &pod, &["--max-connections", "8"]);
    let (addr, metrics) = (router.http.clone(), router.metrics.clone().unwrap());
    // Four addresses (of four /24s, each within its per-address and per-network share), two
    // silent connections each: the listener is full.
    let mut silent = Vec::new();
    for source in ["127.0.0.2", "127.0.1.2", "127.0.2.2", "127.0.3.2"] {
        for _ in 0..2 {
            silent.push(connect_from(source, &addr).await);
        }
    }
    wait_open(&metrics, 8.0).await;
    // Each new client is answered, an idle connection making room for it.
    for i in 0..3 {
        assert!(answered("127.0.4.1", &addr, "/healthz").await, "client {i} was not answered on a full listener");
    }
    // The first at least found it full (a closed client's place may be free for the next).
    assert!(counted(&metrics, "kvindex_router_http_connections_evicted_total", "max_connections").await >= 1.0);
    assert_eq!(counted(&metrics, "kvindex_router_http_connections_refused_total", "max_connections").await, 0.0);
    // A request on the full listener is served too.
    let mut chat = connect_from("127.0.5.1", &addr).await;
    assert!(get_on(&mut chat, "/v1/models").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_network_makes_room_among_its_own_and_is_refused_when_all_of_it_is_answering() {
    let bins = bins();
    let pod = FakePod::start(Script::Hang).await;
    let router = started(
        &bins,
        &pod,
        &["--max-connections", "16", "--max-connections-per-address", "16", "--max-connections-per-network", "4"],
    );
    let (addr, metrics) = (router.http.clone(), router.metrics.clone().unwrap());
    // The oldest idle connection is another network's (127.0.1.0/24).
    let mut other = connect_from("127.0.1.1", &addr).await;
    // 127.0.0.0/24 full: three connections answering (the pod never replies), one silent.
    let mut busy = Vec::new();
    for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        busy.push(busy_from(source, &addr).await);
    }
    wait_for("three requests at the pod", DEADLINE, || async { (pod.posts().len() == 3).then_some(()) }).await;
    let mut silent = connect_from("127.0.0.5", &addr).await;
    wait_open(&metrics, 5.0).await;

    // A newcomer of the full network takes the place of its silent connection, not the other
    // network's older one.
    assert!(answered("127.0.0.6", &addr, "/healthz").await, "the network's idle connection did not make room");
    let mut rest = Vec::new();
    assert_eq!(tokio::time::timeout(DEADLINE, silent.read_to_end(&mut rest)).await.map(|r| r.is_ok()), Ok(true));
    assert!(rest.is_empty(), "the silent connection was closed without an answer");
    assert_eq!(
        counted(&metrics, "kvindex_router_http_connections_evicted_total", "max_connections_per_network").await,
        1.0
    );

    // All four of the network's connections answering: the next one of it is refused at accept…
    busy.push(busy_from("127.0.0.7", &addr).await);
    wait_for("four requests at the pod", DEADLINE, || async { (pod.posts().len() == 4).then_some(()) }).await;
    let refused = get_on(&mut connect_from("127.0.0.8", &addr).await, "/healthz").await;
    assert!(refused.is_empty(), "a fifth connection of a network at its cap was served: {refused}");
    assert_eq!(
        counted(&metrics, "kvindex_router_http_connections_refused_total", "max_connections_per_network").await,
        1.0
    );
    // …while another network still gets in, and its older connection was never closed.
    assert!(answered("127.0.1.2", &addr, "/healthz").await);
    assert!(get_on(&mut other, "/healthz").await.starts_with("HTTP/1.1 200"));
    drop(busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_on_their_own_listener_while_the_public_port_refuses_everyone() {
    let bins = bins();
    let pod = FakePod::start(Script::Hang).await;
    let router = started(&bins, &pod, &["--max-connections", "4", "--probe-addr", "127.0.0.1:0"]);
    let (addr, metrics) = (router.http.clone(), router.metrics.clone().unwrap());
    let probe = router.probe.clone().expect("the start-up line names probe=");
    // The public port full of requests being answered, from four addresses.
    let mut busy = Vec::new();
    for source in ["127.0.0.2", "127.0.1.3", "127.0.2.4", "127.0.3.5"] {
        busy.push(busy_from(source, &addr).await);
    }
    wait_for("four requests at the pod", DEADLINE, || async { (pod.posts().len() == 4).then_some(()) }).await;
    let refused = get_on(&mut connect_from("127.0.0.1", &addr).await, "/healthz").await;
    assert!(refused.is_empty(), "the public port was not full: {refused}");
    assert_eq!(counted(&metrics, "kvindex_router_http_connections_refused_total", "max_connections").await, 1.0);
    // The kubelet's probes still answer, and the probe port serves nothing else.
    for path in ["/healthz", "/readyz"] {
        assert!(answered("127.0.0.1", &probe, path).await, "{path} did not answer on --probe-addr");
    }
    let other = get_on(&mut connect_from("127.0.0.1", &probe).await, "/v1/models").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    // Silent connections cannot hold the probe port either: an idle one makes room.
    let mut silent = Vec::new();
    for _ in 0..16 {
        silent.push(connect_from("127.0.0.9", &probe).await);
    }
    assert!(answered("127.0.0.1", &probe, "/healthz").await, "silent connections held the probe port");
    // A request answered (here: given up by its client) makes room on the public port.
    drop(busy.pop());
    wait_for("room on the public port", DEADLINE, || async {
        answered("127.0.0.1", &addr, "/healthz").await.then_some(())
    })
    .await;
}
