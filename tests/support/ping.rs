//! Timestamped ping streams and what they saw: the longest time between two
//! consecutive replies and the echo requests that got none. One parser for
//! every place a test measures an interruption (namespaces on this machine,
//! the guests of [`crate::vm`], the kubelet cluster), so that a gap means
//! the same thing in each.
//!
//! A stream is `ping -D -n -i 0.01`: one request every 10 ms, each reply
//! stamped with the wall clock. The gap around an outage is the outage plus
//! up to one interval (the request before it and the one after it).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Netns;

/// What a ping stream saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gap {
    /// Echo requests sent (the summary line; the highest sequence number
    /// without one).
    pub sent: u64,
    /// Distinct replies (duplicates counted once).
    pub replies: u64,
    /// The longest time between two consecutive replies.
    pub longest: Duration,
    /// Wall-clock time (seconds since the Unix epoch, in the pinging
    /// machine's clock) of the reply before the longest gap.
    pub at: f64,
}

impl Gap {
    /// Requests without a reply.
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.replies)
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "longest gap {} ms, {} of {} pings lost",
            self.longest.as_millis(),
            self.lost(),
            self.sent
        )
    }
}

/// Parses the output of `ping -D` (iputils or busybox with `-D`): replies by
/// sequence number, the first time each was seen, and the summary line.
pub fn parse(log: &str) -> Gap {
    let replies = replies(log);
    let sent = log.lines().find_map(|line| {
        line.split(" packets transmitted")
            .next()
            .filter(|_| line.contains(" packets transmitted"))
            .and_then(|n| n.trim().parse().ok())
    });
    let mut times: Vec<f64> = replies.values().copied().collect();
    times.sort_by(f64::total_cmp);
    let (mut longest, mut at) = (0.0f64, 0.0);
    for w in times.windows(2) {
        if w[1] - w[0] > longest {
            longest = w[1] - w[0];
            at = w[0];
        }
    }
    let replies_n = replies.len() as u64;
    Gap {
        sent: sent.unwrap_or_else(|| replies.keys().last().copied().unwrap_or(0)),
        replies: replies_n,
        longest: Duration::from_secs_f64(longest.max(0.0)),
        at,
    }
}

/// Requests lost from wall-clock time `t` (seconds since the Unix epoch,
/// the pinging machine's clock) on: sequence numbers without a reply after
/// the last reply before `t` and before the last reply of all.
pub fn lost_from(log: &str, t: f64) -> u64 {
    let replies = replies(log);
    let Some(last) = replies.keys().last().copied() else {
        return 0;
    };
    let start = (replies.iter())
        .filter(|(_, at)| **at < t)
        .map(|(seq, _)| *seq)
        .max()
        .unwrap_or(0);
    (start + 1..last)
        .filter(|s| !replies.contains_key(s))
        .count() as u64
}

/// The replies of a `ping -D` output: when each sequence number's first
/// reply was seen.
fn replies(log: &str) -> std::collections::BTreeMap<u64, f64> {
    let mut replies = std::collections::BTreeMap::new();
    for line in log.lines() {
        if !line.contains("bytes from") {
            continue;
        }
        let ts = line
            .strip_prefix('[')
            .and_then(|l| l.split(']').next())
            .and_then(|t| t.parse::<f64>().ok());
        let seq = line
            .split("icmp_seq=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse::<u64>().ok());
        if let (Some(ts), Some(seq)) = (ts, seq) {
            replies.entry(seq).or_insert(ts);
        }
    }
    replies
}

/// Waits until a stream to `dst` has `more` replies after its first
/// `after`; `read` gives (replies, whether the stream still runs, its
/// output). Panics with the output's tail after `timeout`.
#[track_caller]
pub fn wait_replies(
    dst: &str,
    after: u64,
    more: u64,
    timeout: Duration,
    read: impl Fn() -> (u64, bool, String),
) {
    let deadline = Instant::now() + timeout;
    loop {
        let (n, running, text) = read();
        if n >= after + more {
            return;
        }
        if Instant::now() >= deadline || !running {
            let lines: Vec<&str> = text.lines().collect();
            panic!(
                "ping stream to {dst}: only {} replies after {timeout:?} (wanted {more} after {after}); tail:\n{}",
                n.saturating_sub(after),
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A ping every 10 ms from a namespace, its output in a file; killed on drop.
#[derive(Debug)]
pub struct Stream {
    child: Option<Child>,
    out: PathBuf,
    _dir: tempfile::TempDir,
    dst: String,
}

impl Stream {
    /// Starts pinging `dst` from `ns` and waits for the first 50 replies
    /// (up to 30 s), so that what follows starts on a working path.
    #[track_caller]
    pub fn start(ns: &Netns, dst: &str) -> Stream {
        Stream::start_every(ns, dst, "0.01", 50)
    }

    /// [`Stream::start`] with a request every `interval` seconds (as ping's
    /// `-i` takes it), waiting for the first `first` replies.
    #[track_caller]
    pub fn start_every(ns: &Netns, dst: &str, interval: &str, first: u64) -> Stream {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("ping.txt");
        let f = std::fs::File::create(&out).expect("ping output");
        let child = ns
            .command("ping")
            .args(["-D", "-n", "-i", interval, "-W", "1", dst])
            .stdout(Stdio::from(f))
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn ping");
        let s = Stream {
            child: Some(child),
            out,
            _dir: dir,
            dst: dst.to_string(),
        };
        s.wait_more(0, first, Duration::from_secs(30));
        s
    }

    /// The output so far.
    pub fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Replies so far.
    pub fn replies(&self) -> u64 {
        parse(&self.text()).replies
    }

    /// Waits until `more` replies came after the first `after`.
    #[track_caller]
    pub fn wait_more(&self, after: u64, more: u64, timeout: Duration) {
        wait_replies(&self.dst, after, more, timeout, || {
            let text = self.text();
            (parse(&text).replies, true, text)
        });
    }

    /// Stops the stream (SIGINT, so that ping prints its summary) and
    /// returns what it saw.
    pub fn finish(mut self) -> Gap {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: a signal to our own child; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while !matches!(c.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        parse(&self.text())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_losses_and_duplicates() {
        let log = "PING 10.244.1.2 (10.244.1.2) 56(84) bytes of data.\n\
            [100.000] 64 bytes from 10.244.1.2: icmp_seq=1 ttl=62 time=1 ms\n\
            [100.010] 64 bytes from 10.244.1.2: icmp_seq=2 ttl=62 time=1 ms\n\
            [100.011] 64 bytes from 10.244.1.2: icmp_seq=2 ttl=62 time=1 ms (DUP!)\n\
            [100.530] 64 bytes from 10.244.1.2: icmp_seq=54 ttl=62 time=1 ms\n\
            [100.540] 64 bytes from 10.244.1.2: icmp_seq=55 ttl=62 time=1 ms\n\
            \n--- 10.244.1.2 ping statistics ---\n\
            56 packets transmitted, 4 received, 92.8571% packet loss, time 560ms\n";
        let g = parse(log);
        assert_eq!((g.sent, g.replies, g.lost()), (56, 4, 52));
        assert_eq!(g.longest.as_millis(), 520);
        assert!((g.at - 100.010).abs() < 1e-9);
        assert_eq!(g.to_string(), "longest gap 520 ms, 52 of 56 pings lost");
    }

    #[test]
    fn without_a_summary_the_highest_sequence_counts_as_sent() {
        let g = parse(
            "[1.00] 64 bytes from x: icmp_seq=1 ttl=1\n[1.50] 64 bytes from x: icmp_seq=9 ttl=1\n",
        );
        assert_eq!((g.sent, g.replies), (9, 2));
        assert_eq!(g.longest.as_millis(), 500);
    }

    #[test]
    fn losses_from_a_time_on() {
        let log = "[1.0] 64 bytes from x: icmp_seq=1 ttl=1\n\
            [1.6] 64 bytes from x: icmp_seq=4 ttl=1\n\
            [2.0] 64 bytes from x: icmp_seq=6 ttl=1\n\
            [2.2] 64 bytes from x: icmp_seq=7 ttl=1\n";
        assert_eq!(lost_from(log, 0.0), 3, "2, 3 and 5");
        assert_eq!(lost_from(log, 1.5), 3, "from the reply before 1.5: 2, 3, 5");
        assert_eq!(lost_from(log, 1.7), 1, "5");
        assert_eq!(lost_from(log, 2.1), 0);
        assert_eq!(lost_from("", 1.0), 0);
    }
}
