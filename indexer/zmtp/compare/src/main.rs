//! `kvindex-zmtp-compare`: the measured comparison behind `indexer/zmtp/README.md`.
//!
//! ```text
//! compare fanin [runs] [impls]     64 libzmq publishers → one subscriber; medians per load
//! compare faults [impls] [case]    hostile and failing peers against each subscriber
//! ```
//! `impls` is a comma-separated subset of `own,own-1t,libzmq,zeromq` (`own-1t`: ours on a
//! current-thread runtime; fan-in only). The other subcommands (`sub`,
//! `pub`, `dealer`) are the child processes those two start.

mod child;
mod dealers;
mod fanin;
mod faults;
mod pubs;
mod raw;
mod stats;
mod subs;

fn impls(arg: Option<&String>) -> Vec<String> {
    arg.map_or("own,own-1t,libzmq,zeromq", |s| s.as_str()).split(',').map(str::to_string).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> u64 { args[i].parse().expect("a number") };
    match args.first().map(String::as_str) {
        Some("fanin") => fanin::run(fanin::Plan {
            runs: args.get(1).map_or(3, |r| r.parse().expect("runs")),
            impls: impls(args.get(2)),
            publishers: 64,
            payload: 1024,
            loads: vec![
                // 64 engines at 250 batches/s each, 10 s.
                ("paced 16k/s".into(), 2500, 16_000),
                // As fast as the publishers can send: 64 × 5000.
                ("flat out".into(), 5000, 0),
            ],
        }),
        Some("faults") => faults::run(
            &args.get(1).map_or_else(|| impls(Some(&"own,libzmq,zeromq".to_string())), |a| impls(Some(a))),
            args.get(2).map(String::as_str),
        ),
        Some("sub") => {
            let run = subs::Run {
                publishers: num(3) as usize,
                expected_each: num(4),
                faults: args[2] == "faults",
                bounds: if args[2] == "faults" {
                    subs::Bounds::fault_tests()
                } else {
                    subs::Bounds { max_message: 16 << 20, ..subs::Bounds::fault_tests() }
                },
            };
            match args[1].as_str() {
                "own" => subs::own(run, false),
                "own-1t" => subs::own(run, true),
                "libzmq" => subs::libzmq(run),
                "zeromq" => subs::zeromq_crate(run),
                other => panic!("unknown candidate {other}"),
            }
        }
        Some("pub") => pubs::run(pubs::Load {
            endpoint: args[1].clone(),
            publishers: num(2) as usize,
            messages_each: num(3),
            rate: num(4),
            payload: num(5) as usize,
        }),
        Some("dealer") => dealers::run(&args[1], &args[2]),
        _ => {
            eprintln!(
                "usage: kvindex-zmtp-compare fanin [runs] [own,libzmq,zeromq] | faults [own,libzmq,zeromq] [case]"
            );
            std::process::exit(2);
        }
    }
}
