//! Server process memory from `/proc` (Linux): resident set size by PID, and
//! the PID that listens on a TCP port (so the tool finds the server itself).

use anyhow::Context as _;
use std::path::Path;

/// `VmRSS` of `pid` in KiB.
pub fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    parse_vmrss(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// A memory reading of a process, KiB: the resident set and its two parts
/// that matter here — anonymous memory (heap, stacks: what sessions cost)
/// and file-backed pages (the binary, and database pages read through a
/// memory map: page cache the kernel can take back, shared with every
/// process that maps the file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemReading {
    /// `VmRSS`.
    pub rss: u64,
    /// `RssAnon`, when the kernel reports it.
    pub anon: Option<u64>,
    /// `RssFile`, when the kernel reports it.
    pub file: Option<u64>,
}

/// `VmRSS`, `RssAnon` and `RssFile` of `pid`.
pub fn mem_reading(pid: u32) -> anyhow::Result<MemReading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    parse_mem_reading(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// The [`MemReading`] in the text of `/proc/PID/status`.
pub fn parse_mem_reading(status: &str) -> Option<MemReading> {
    Some(MemReading {
        rss: parse_vmrss(status)?,
        anon: status_field(status, "RssAnon:"),
        file: status_field(status, "RssFile:"),
    })
}

fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// CPU time (user + system) of `pid` in seconds, from `/proc/PID/stat`
/// (clock ticks of 1/100 s, the value of `USER_HZ` on Linux).
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|t| t as f64 / 100.0)
}

/// utime + stime (fields 14 and 15) from the text of `/proc/PID/stat`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 → index 11.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Extracts `VmRSS` (KiB) from the text of `/proc/PID/status`.
pub fn parse_vmrss(status: &str) -> Option<u64> {
    status_field(status, "VmRSS:")
}

/// Socket inodes listening on `port` (from `/proc/net/tcp` and `tcp6`).
fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        out.extend(parse_listen_table(&text, port));
    }
    out
}

/// Inodes of LISTEN (state 0A) sockets on `port` in a `/proc/net/tcp` table.
pub fn parse_listen_table(text: &str, port: u16) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = f.get(1)?;
            let state = f.get(3)?;
            let inode = f.get(9)?;
            let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (p == port && *state == "0A").then(|| inode.parse().ok())?
        })
        .collect()
}

/// The PID of the process that owns a listening socket on `port`.
pub fn pid_listening_on(port: u16) -> anyhow::Result<u32> {
    let inodes = listening_inodes(port);
    anyhow::ensure!(!inodes.is_empty(), "nothing listens on TCP port {port}");
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if wanted.iter().any(|w| link.as_os_str() == w.as_str()) {
                    return Ok(pid);
                }
            }
        }
    }
    anyhow::bail!("port {port} is listening but its process is not visible (run as the same user or pass --server-pid)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vmrss() {
        let s = "Name:\tstarling\nVmPeak:\t  100 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(parse_vmrss(s), Some(12345));
        assert_eq!(parse_vmrss("Name: x\n"), None);
    }

    #[test]
    fn parses_the_parts_of_the_resident_set() {
        let s = "VmRSS:\t  300 kB\nRssAnon:\t  200 kB\nRssFile:\t   90 kB\nRssShmem:\t 10 kB\n";
        assert_eq!(
            parse_mem_reading(s),
            Some(MemReading {
                rss: 300,
                anon: Some(200),
                file: Some(90)
            })
        );
        // Old kernels: VmRSS only.
        assert_eq!(
            parse_mem_reading("VmRSS:\t 5 kB\n"),
            Some(MemReading {
                rss: 5,
                anon: None,
                file: None
            })
        );
    }

    #[test]
    fn finds_listening_inode() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1466 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1466 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(parse_listen_table(t, 5222), vec![4242]);
        assert!(parse_listen_table(t, 5223).is_empty());
    }

    #[test]
    fn parses_cpu_ticks() {
        let s = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 99 1000 200";
        assert_eq!(parse_cpu_ticks(s), Some(300));
        assert!(cpu_secs(std::process::id()).is_some());
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(rss_kb(std::process::id()).unwrap() > 0);
    }
}
