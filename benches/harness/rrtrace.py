#!/usr/bin/env python3
"""Where a ping-pong message's microseconds go, from a tracefs capture.

  rrtrace.py TRACE THREADS

TRACE: text of a tracefs instance with sched:sched_waking, sched:sched_switch
and raw_syscalls (filtered to weft* and sockperf threads), taken by
throughput.sh with RR_TRACE=1 during rr-*/udp. THREADS: "tid role" lines,
role one of client, server, n1, n2 (the nodes' weftd threads).

Prints, per role: wake-ups per message, wake-up latency (sched_waking to
sched_switch in) p50/p99, the share woken on another CPU than the waker's and
the share that had to preempt a running task (not idle); who wakes whom; and
the median of each hop of one request (client send to server receive), each
hop's time measured from the previous hop's.
"""

import re
import statistics
import sys

LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+(\w+):\s+(.*)$")
SENDS = {1, 20, 44, 46, 307}  # write, writev, sendto, sendmsg, sendmmsg
RECVS = {0, 45, 47, 299}  # read, recvfrom, recvmsg, recvmmsg
# One request's hops: (role, event, syscall numbers) in path order.
HOPS = [
    ("client", "enter", SENDS, "client send"),
    ("n1", "run", None, "node 1 worker runs"),
    ("n1", "exit", {0}, "node 1 TUN read"),
    ("n1", "exit", {20, 307, 46, 44}, "node 1 send (encap + sendmmsg)"),
    ("n2", "run", None, "node 2 worker runs"),
    ("n2", "exit", {299, 0, 47}, "node 2 receive (recvmmsg)"),
    ("n2", "exit", {20, 1}, "node 2 TUN write (decap + writev)"),
    ("server", "run", None, "server runs"),
    ("server", "exit", RECVS, "server receive"),
]


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


def parse(path, roles):
    ev = []
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        _, pid, cpu, ts, name, rest = m.groups()
        ev.append((float(ts) * 1e6, int(pid), int(cpu), name, rest))
    return ev


def main():
    trace, threads = sys.argv[1], sys.argv[2]
    roles = {}
    for line in open(threads):
        if line.strip():
            tid, role = line.split()
            roles[int(tid)] = role
    ev = parse(trace, roles)
    waking = {}  # wakee tid -> (ts, waker cpu, target cpu, waker role)
    lat = {r: [] for r in set(roles.values())}
    cross = {r: 0 for r in lat}
    preempt = {r: 0 for r in lat}
    who = {}
    marks = []  # (ts, role, kind, nr, ret) for the hop walk
    sends = 0
    for ts, pid, cpu, name, rest in ev:
        if name == "sched_waking":
            tid = int(re.search(r" pid=(\d+)", rest).group(1))
            if tid in roles:
                tgt = int(re.search(r"target_cpu=(\d+)", rest).group(1))
                waker = roles.get(pid, "other")
                waking[tid] = (ts, cpu, tgt)
                k = (waker, roles[tid])
                who[k] = who.get(k, 0) + 1
        elif name == "sched_switch":
            nxt = int(re.search(r"next_pid=(\d+)", rest).group(1))
            if nxt in roles and nxt in waking:
                t0, wcpu, tgt = waking.pop(nxt)
                r = roles[nxt]
                lat[r].append(ts - t0)
                cross[r] += cpu != wcpu
                preempt[r] += not re.search(r"prev_pid=0 ", rest)
                marks.append((ts, r, "run", None, None))
        elif name in ("sys_enter", "sys_exit") and pid in roles:
            m = re.match(r"NR (\d+)(?: = (-?\d+))?", rest)
            if not m:
                continue
            nr = int(m.group(1))
            ret = int(m.group(2)) if m.group(2) else None
            kind = "enter" if name == "sys_enter" else "exit"
            if kind == "exit" and (ret is None or ret <= 0):
                continue
            if roles[pid] == "client" and kind == "enter" and nr in SENDS:
                sends += 1
            marks.append((ts, roles[pid], kind, nr, ret))
    msgs = max(sends, 1)
    print("messages (client sends) in the capture: %d" % sends)
    print("%-7s %13s %14s %14s %10s %10s" % ("role", "wakeups/msg", "wake p50 us", "wake p99 us", "cross-CPU", "preempted"))
    for r in ("client", "n1", "n2", "server"):
        v = lat.get(r, [])
        n = max(len(v), 1)
        print("%-7s %13.2f %14.1f %14.1f %9.0f%% %9.0f%%" % (
            r, len(v) / msgs, pct(v, 0.5), pct(v, 0.99), 100 * cross.get(r, 0) / n, 100 * preempt.get(r, 0) / n))
    print("who wakes whom (per message): " + ", ".join(
        "%s->%s %.2f" % (a, b, c / msgs) for (a, b), c in sorted(who.items(), key=lambda x: -x[1])))
    # Walk the hops: from each client send, find each next hop in order (a
    # "runs" hop is skipped when the thread was already running, i.e. its
    # next syscall hop comes first).
    present = {m[1] for m in marks}
    hops = [h for h in HOPS if h[0] in present]
    steps = {h[3]: [] for h in hops}
    total = []
    i, n = 0, len(marks)
    while i < n:
        ts, r, kind, nr, _ = marks[i]
        if not (r == "client" and kind == "enter" and nr in SENDS):
            i += 1
            continue
        t_prev, t_start, j, ok = ts, ts, i + 1, True
        for role, k, nrs, name in hops[1:]:
            found = None
            for q in range(j, min(n, j + 400)):
                m = marks[q]
                if m[1] == "client" and m[2] == "enter" and m[3] in SENDS:
                    break
                if m[1] == role and m[2] == k and (nrs is None or m[3] in nrs):
                    found = q
                    break
            if found is None:
                if k == "run":
                    continue
                ok = False
                break
            steps[name].append(marks[found][0] - t_prev)
            t_prev, j = marks[found][0], found + 1
        if ok:
            total.append(t_prev - t_start)
        i = j if ok else i + 1
    print("request path, median (p99) us per hop, each from the previous hop (%d requests walked):" % len(total))
    for h in hops[1:]:
        v = steps[h[3]]
        print("  %-36s %7.1f (%6.1f)  [%d]" % (h[3], statistics.median(v) if v else float("nan"), pct(v, 0.99), len(v)))
    print("  %-36s %7.1f (%6.1f)" % ("client send -> server receive", statistics.median(total) if total else float("nan"), pct(total, 0.99)))


if __name__ == "__main__":
    main()
