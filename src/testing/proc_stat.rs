//! A process's CPU time and page faults so far, from Linux's
//! `/proc/PID/stat`, and its resident memory now, from `/proc/PID/status`:
//! what tests and benches read of a child process they started (a node's
//! CPU per request; a waiting node that must not spin; a node's memory
//! under a live tail).

use std::time::Duration;

/// A process's counters at one moment; subtract two for an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStat {
    /// User plus system CPU time, all threads.
    pub cpu: Duration,
    /// Page faults, minor and major.
    pub faults: u64,
    /// Resident memory now (`VmRSS`), in bytes.
    pub rss: u64,
}

impl ProcStat {
    /// Process `pid`'s counters now; `None` if it is gone or this is not
    /// Linux.
    pub fn of(pid: u32) -> Option<ProcStat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and
        // may hold spaces: state(0) ppid pgrp session tty tpgid flags
        // minflt(7) cminflt majflt(9) cmajflt utime(11) stime(12).
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        let ticks = num(11)? + num(12)?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())?;
        Some(ProcStat {
            // Clock ticks of USER_HZ, which Linux fixes at 100 for user
            // space.
            cpu: Duration::from_millis(ticks * 10),
            faults: num(7)? + num(9)?,
            rss: rss_kib * 1024,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_s_cpu_and_memory_show_its_work_and_a_gone_one_reads_as_none() {
        let me = std::process::id();
        let start = ProcStat::of(me).expect("this process");
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        let mut now = start;
        // Work until a clock tick (10 ms of CPU) shows, however busy the
        // machine is.
        while now.cpu == start.cpu && t0.elapsed() < Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            now = ProcStat::of(me).expect("this process");
        }
        assert!(now.cpu > start.cpu, "{start:?} then {now:?}");
        assert!(now.faults >= start.faults);
        // 64 MiB touched page by page is resident.
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let held = ProcStat::of(me).expect("this process");
        assert!(held.rss >= 64 << 20, "{held:?}");
        drop(block);
        assert_eq!(ProcStat::of(u32::MAX), None);
    }
}
