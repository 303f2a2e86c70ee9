//! What the kernel says about a proxy process: CPU time from `/proc/<pid>/stat` and resident memory from
//! `/proc/<pid>/status`.
//!
//! `utime + stime` in `/proc/<pid>/stat` is the CPU time of every thread of the process, in clock ticks
//! (`getconf CLK_TCK`, 100 on Linux), so a 1.5 s round at one busy core resolves to better than 1%.
//! `/proc/stat` gives the busy time of one CPU, which tells how much else ran on the proxy's CPU, and
//! `/proc/loadavg` the machine's load.

use std::sync::OnceLock;

/// CPU seconds (user + system, all threads) the process has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = parse_cpu_ticks(&stat)?;
    Some(ticks as f64 / clock_ticks() as f64)
}

/// Resident set size in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// Seconds CPU `cpu` has been busy (user, nice, system, irq, softirq, steal), from `/proc/stat`.
pub fn cpu_busy_seconds(cpu: usize) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks = parse_cpu_busy(&stat, cpu)?;
    Some(ticks as f64 / clock_ticks() as f64)
}

/// The 1-, 5- and 15-minute load averages, as `/proc/loadavg` writes them.
pub fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn parse_cpu_busy(stat: &str, cpu: usize) -> Option<u64> {
    let name = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: everything but idle and iowait.
    let busy = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    Some(busy)
}

/// `utime + stime` from a `/proc/<pid>/stat` line. Fields are counted after the `)` that ends `comm`, since
/// `comm` may itself hold spaces.
pub(crate) fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    // After comm: state is field 3; utime and stime are fields 14 and 15, i.e. the 12th and 13th after comm.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `getconf CLK_TCK`, once; 100 when it cannot be read.
pub(crate) fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_comm() {
        let stat = "1234 (envoy main) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 1000 50";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
    }

    #[test]
    fn parses_vm_rss() {
        let status = "Name:\tenvoy\nVmPeak:\t  9000 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(51200 * 1024));
    }

    #[test]
    fn parses_one_cpus_busy_time() {
        let stat = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 1 5 1000 7 2 3 4 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_cpu_busy(stat, 0), Some(10 + 1 + 5 + 2 + 3 + 4));
        assert_eq!(parse_cpu_busy(stat, 1), Some(6));
        assert_eq!(parse_cpu_busy(stat, 2), None);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(cpu_busy_seconds(0).is_some());
        assert_eq!(load_average().unwrap().split(' ').count(), 3);
    }
}
