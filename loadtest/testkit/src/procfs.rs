//! What a test reads of other processes from `/proc` (Linux): peak memory, children, and the
//! start time that tells a process from a later one with the same pid.

/// A process's peak resident memory (`VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid,
/// it names one process even when pids wrap around. `None` once it is gone.
pub fn started_at(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Pids of the live (not zombie) children of `parent`, from each process's ppid.
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
            ppid == Some(parent) && state != Some("Z")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_seen_with_its_start_time_and_gone_after_it_is_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id();
        assert!(children_of(me).contains(&child.id()));
        assert!(started_at(child.id()).is_some());
        assert!(peak_rss_bytes(me) > 0);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!children_of(me).contains(&child.id()));
    }
}
