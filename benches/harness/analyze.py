#!/usr/bin/env python3
"""Numbers and chart for benches/harness/throughput.sh.

  analyze.py header
  analyze.py row FILE CASE TEST ROUND NPROC CLK_TCK "T0 T1" "SNAP0" "SNAP1" LOAD1
  analyze.py gaprow PING_LOG CASE TEST ROUND LOAD1
  analyze.py summary RESULTS.tsv "CASES" "TESTS" MACHINE.txt
  analyze.py chart RESULTS.tsv "CASES" "TESTS" MACHINE.txt OUT.png

A SNAP is "machine_busy_ticks machine_total_ticks daemon_ticks udp_rcvbuf_errors".
TCP tests report Gbit/s received; udp64 reports delivered kpps (packets the
receiver got, per second). CPU: machine cores = busy share of /proc/stat times
nproc; daemon cores = utime+stime of weftd / wireguard-go (both nodes) per
second of wall time; "per Gbit/s" divides by the received Gbit/s.
Latency tests (rr-idle/udp, rr-busy/tcp, ...) read sockperf's ping-pong
output: value is the one-way p50 in microseconds, p99 and p999 its tails.
LOAD1 is the machine's 1-minute load average when the row was taken.
Gap tests (gap-k2u, gap-u2k, gap-term, gap-kill; `gaps` in TESTS) read a
`ping -D -i 0.01` log: value is the longest time between two consecutive
replies in ms, lost the echo requests without a reply.
"""

import json
import statistics
import sys

COLS = ["case", "test", "round", "value", "unit", "gbps", "machine_cores", "daemon_cores",
        "machine_cores_per_gbps", "daemon_cores_per_gbps", "retransmits", "loss_pct", "rcvbuf_errors",
        "p99", "p999", "load1", "lost"]
GAP_EVENTS = ("k2u", "u2k", "term", "kill")
GAP_NAMES = {"gap-k2u": "live switch kernel -> userspace", "gap-u2k": "live switch userspace -> kernel",
             "gap-term": "SIGTERM + restart", "gap-kill": "SIGKILL + restart"}
RR_KEYS = (("value", "50.000"), ("p99", "99.000"), ("p999", "99.900"))

LABELS = {
    "veth": "veth (no overlay)",
    "kvxlan": "kernel vxlan (flannel)",
    "wggo": "wireguard-go",
    "wggo-new": "wireguard-go (newest)",
    "weft-udp": "weft udp",
    "weft-vxlan": "weft vxlan (userspace)",
    "weft-vxlan-tap": "weft vxlan, tunnel TAP",
    "weft-udp-tap": "weft udp, tunnel TAP",
    "weft-kvxlan": "weft vxlan (kernel)",
    "weft-wg": "weft wireguard",
    "weft-ipip": "weft ipip (userspace)",
    "weft-hostgw": "weft host-gw",
}


def label(case):
    base, _, variant = case.partition("@")
    return LABELS.get(base, base) + (" @" + variant if variant else "")


def expand(tests):
    """rr tests report UDP and TCP rows: rr-idle -> rr-idle/udp, rr-idle/tcp; gaps one per event."""
    def one(t):
        if t.startswith("rr"):
            return (t + "/udp", t + "/tcp")
        if t == "gaps":
            return tuple("gap-" + e for e in GAP_EVENTS)
        return (t,)
    return [x for t in tests for x in one(t)]


def ping_gap(path):
    """(longest gap between consecutive replies in ms, requests without a reply) of `ping -D` output."""
    replies, sent = {}, None
    for line in open(path, errors="replace"):
        if " packets transmitted" in line:
            sent = int(line.split()[0])
        if "bytes from" in line and "icmp_seq=" in line and line.startswith("["):
            seq = int(line.split("icmp_seq=")[1].split()[0])
            replies.setdefault(seq, float(line[1:line.index("]")]))
    times = sorted(replies.values())
    gap = max((b - a for a, b in zip(times, times[1:])), default=nan())
    if sent is None:
        sent = max(replies, default=0)
    return gap * 1e3, sent - len(replies)


def gaprow(argv):
    path, case, test, rnd, load1 = argv
    try:
        gap, lost = ping_gap(path)
    except OSError:
        gap, lost = nan(), nan()
    vals = {k: "nan" for k in COLS}
    vals.update(case=case, test=test, round=rnd, value="%.1f" % gap, unit="ms", load1=load1, lost="%g" % lost)
    print("\t".join(vals[k] for k in COLS))


def sockperf(path):
    """One-way latency percentiles (us) from sockperf ping-pong output."""
    got = {}
    for line in open(path, errors="replace"):
        if "---> percentile" in line:
            k, v = line.split("percentile", 1)[1].split("=")
            got[k.strip()] = float(v)
    return {key: got.get(pct, nan()) for key, pct in RR_KEYS}


def nan():
    return float("nan")


def iperf(path, test):
    """(value, Gbit/s, retransmits, loss %) from iperf3's JSON."""
    value = gbps = retr = loss = nan()
    try:
        end = json.load(open(path))["end"]
        gbps = end["sum_received"]["bits_per_second"] / 1e9
        if test.startswith("udp"):
            s = end["sum"]
            value = (s["packets"] - s["lost_packets"]) / s["seconds"] / 1e3
            loss = s["lost_percent"]
        else:
            value = gbps
            retr = end["sum_sent"].get("retransmits", nan())
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        pass
    return value, gbps, retr, loss


def row(argv):
    path, case, test, rnd, nproc, clk, times, s0, s1, load1 = argv
    nproc, clk = int(nproc), float(clk)
    t0, t1 = (float(x) for x in times.split())
    b0, tot0, d0, r0 = (int(x) for x in s0.split())
    b1, tot1, d1, r1 = (int(x) for x in s1.split())
    wall = max(t1 - t0, 1e-9)
    machine = (b1 - b0) / max(tot1 - tot0, 1) * nproc
    daemon = (d1 - d0) / clk / wall
    rr = {"value": nan(), "p99": nan(), "p999": nan()}
    if test.startswith("rr"):
        unit, gbps, retr, loss = "us", nan(), nan(), nan()
        try:
            rr = sockperf(path)
        except OSError:
            pass
        value = rr["value"]
    elif test == "idle":
        unit, gbps, retr, loss = "%core/node", nan(), nan(), nan()
        value = daemon * 100 / 2
    else:
        unit = "kpps" if test.startswith("udp") else "Gbit/s"
        value, gbps, retr, loss = iperf(path, test)
    per = (lambda c: c / gbps) if gbps > 0 else (lambda c: nan())
    vals = [case, test, rnd, "%.3f" % value, unit, "%.4f" % gbps, "%.2f" % machine, "%.2f" % daemon,
            "%.3f" % per(machine), "%.3f" % per(daemon), "%g" % retr, "%.1f" % loss, str(r1 - r0),
            "%.3f" % rr["p99"], "%.3f" % rr["p999"], load1, "nan"]
    print("\t".join(vals))


def load(path):
    lines = open(path).read().splitlines()
    head = lines[0].split("\t")
    rows = [dict(zip(head, line.split("\t"))) for line in lines[1:] if line.strip()]
    for r in rows:
        for k in COLS[3:]:
            if k != "unit":
                try:
                    r[k] = float(r[k])
                except (KeyError, ValueError):
                    r[k] = nan()
    return rows


def stats(rows, case, test, key="value"):
    v = [r[key] for r in rows if r["case"] == case and r["test"] == test and r[key] == r[key]]
    if not v:
        return None
    return statistics.median(v), min(v), max(v), len(v)


def summary(argv):
    path, cases, tests, machine = argv
    rows, cases, tests = load(path), cases.split(), tests.split()
    info = open(machine).read().rstrip()
    print(info)
    cores = next((float(l.split(": ", 1)[1]) for l in info.splitlines() if l.startswith("nproc: ")), nan())
    gaps = [t for t in expand(tests) if t.startswith("gap-")]
    if gaps:
        gap_table(rows, cases, gaps)
    for t in expand(tests):
        if t.startswith("gap-"):
            continue
        if t.startswith("rr"):
            rr_table(rows, cases, t)
            continue
        udp = t.startswith("udp")
        unit = {"idle": "%core/node"}.get(t, "kpps" if udp else "Gbit/s")
        extra = "loss%  rcvbuf_err" if udp else "retr  rcvbuf_err  ceiling"
        print()
        cpu = ("us/pkt", "daemon_us") if udp else ("cores/Gb", "daemon/Gb")
        print("%-6s %-24s %8s %15s %2s %8s %7s %9s %9s  %s" % (
            t, "case (" + unit + ")", "median", "min-max", "n", "/kvxlan", "/veth", cpu[0], cpu[1], extra))
        for c in cases:
            m = stats(rows, c, t)
            if not m:
                print("%-6s %-24s %8s" % (t, label(c), "n/a"))
                continue

            def ratio(ref):
                r = stats(rows, ref, t)
                return "%.3f" % (m[0] / r[0]) if r and r[0] > 0 else "-"

            def med(key):
                s = stats(rows, c, t, key)
                return s[0] if s else nan()
            per_gb = med("machine_cores_per_gbps")
            ceiling = cores / per_gb if per_gb > 0 else nan()
            tail = ("%5.1f %10.0f" % (med("loss_pct"), med("rcvbuf_errors")) if udp
                    else "%5.0f %10.0f %8.1f" % (med("retransmits"), med("rcvbuf_errors"), ceiling))
            if udp:  # CPU microseconds per delivered packet
                cpu = (med("machine_cores") * 1e3 / m[0], med("daemon_cores") * 1e3 / m[0]) if m[0] > 0 else (nan(), nan())
            else:
                cpu = (med("machine_cores_per_gbps"), med("daemon_cores_per_gbps"))
            print("%-6s %-24s %8.3f %7.3f-%-7.3f %2d %8s %7s %9.3f %9.3f  %s" % (
                t, label(c), m[0], m[1], m[2], m[3], ratio("kvxlan"), ratio("veth"), cpu[0], cpu[1], tail))
    if all(t.startswith("gap-") for t in expand(tests)):
        return
    print()
    print("median of the rounds; min-max over rounds; /kvxlan and /veth: ratio of medians;")
    print("cores/Gb: machine CPU (both nodes, all processes and softirq) per received Gbit/s;")
    print("daemon/Gb: weftd or wireguard-go CPU (both nodes) per received Gbit/s (kernel paths: 0);")
    print("ceiling: Gbit/s with every core of the machine busy at the measured cores/Gb (nproc / cores/Gb);")
    print("udp64: us/pkt and daemon_us are the same CPU figures per delivered packet (microseconds).")
    print("rr-*: sockperf ping-pong, 64 B, one-way latency in us (median over rounds of each round's")
    print("percentile), x kvxlan = ratio of medians; rr-busy beside two nice -n 19 busy loops, rr-bulk")
    print("beside one iperf3 TCP stream; daemon: weftd/wireguard-go cores; load: 1-min load average.")


def gap_table(rows, cases, gaps):
    """One line per case and event: longest gap and pings lost, median (min-max) over rounds."""
    print()
    print("%-26s %-34s %24s %20s %2s %5s" % (
        "switch and restart", "event (ping every 10 ms)", "longest gap ms (min-max)", "lost (min-max)", "n", "load"))
    for c in cases:
        for t in gaps:
            m, lost, ld = stats(rows, c, t), stats(rows, c, t, "lost"), stats(rows, c, t, "load1")
            if not m:
                continue
            print("%-26s %-34s %24s %20s %2d %5.1f" % (
                label(c), GAP_NAMES.get(t, t), "%.0f (%.0f-%.0f)" % m[:3],
                "%.0f (%.0f-%.0f)" % lost[:3] if lost else "n/a", m[3], ld[0] if ld else nan()))
    print("gap-*: pod 1 pings pod 2 every 10 ms; node 2 switches path (weft dataplane set) or its weftd")
    print("is signalled and started again at once; longest time between two replies, and the pings lost.")


def rr_table(rows, cases, t):
    print()
    print("%-12s %-28s %21s %16s %16s %7s %5s" % (
        t, "case (us, one-way)", "p50 (min-max) x kvx", "p99  x kvxlan", "p99.9 x kvxlan", "daemon", "load"))
    ref = {k: stats(rows, "kvxlan", t, k) for k, _ in RR_KEYS}
    for c in cases:
        cells = []
        for k, _ in RR_KEYS:
            m, r = stats(rows, c, t, k), ref[k]
            if not m:
                cells.append("n/a")
                continue
            x = "%.2fx" % (m[0] / r[0]) if r and r[0] > 0 else "-"
            cells.append(("%7.1f (%.0f-%.0f) %s" % (m[0], m[1], m[2], x)) if k == "value" else "%7.1f %6s" % (m[0], x))
        d, ld = stats(rows, c, t, "daemon_cores"), stats(rows, c, t, "load1")
        print("%-12s %-28s %21s %16s %16s %7.2f %5.1f" % (
            t, label(c), cells[0], cells[1], cells[2], d[0] if d else nan(), ld[0] if ld else nan()))


def chart(argv):
    path, cases, tests, machine, out = argv
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cases, tests = load(path), cases.split(), expand(tests.split())
    info = dict(line.split(": ", 1) for line in open(machine).read().splitlines() if ": " in line)
    fig, axes = plt.subplots(len(tests), 1, figsize=(11, 3.2 * len(tests) + 0.8), squeeze=False)
    colors = {c: ("#7f7f7f" if not c.startswith("weft") else "#1f77b4") for c in cases}
    colors.update({"kvxlan": "#2ca02c", "veth": "#4d4d4d", "wggo": "#9467bd", "wggo-new": "#c5b0d5"})
    colors.update({c: "#ff7f0e" for c in cases if "@" in c})
    for ax, t in zip(axes[:, 0], tests):
        if t.startswith("rr"):
            rr_chart(ax, rows, cases, t, colors)
            continue
        labels, med, lo, hi, col = [], [], [], [], []
        for c in cases:
            m = stats(rows, c, t)
            labels.append(label(c))
            col.append(colors[c])
            if m:
                med.append(m[0]); lo.append(m[0] - m[1]); hi.append(m[2] - m[0])
            else:
                med.append(0); lo.append(0); hi.append(0)
        x = range(len(cases))
        ax.bar(x, med, color=col, yerr=[lo, hi], capsize=3)
        ref = stats(rows, "kvxlan", t)
        for i, v in enumerate(med):
            txt = "n/a" if v == 0 else ("%.2f" % v if v < 100 else "%.0f" % v)
            if v and ref and ref[0] > 0:
                txt += "\n(%.2fx)" % (v / ref[0])
            ax.annotate(txt, (i, v + hi[i]), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
        unit = {"idle": "% of a core per node"}.get(t, "delivered kpps" if t.startswith("udp") else "Gbit/s")
        if t.startswith("gap-"):
            unit = "longest gap, ms"
        name = {"tcp1": "iperf3 TCP, 1 stream", "tcp4": "iperf3 TCP, 4 streams",
                "udp64": "iperf3 UDP flood, 64-byte payload", "idle": "daemon CPU with no traffic"}.get(
                    t, GAP_NAMES.get(t, t))
        ax.set_title("%s (median, min-max bars; ratio to kernel vxlan)" % name, fontsize=9)
        ax.set_ylabel(unit)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.margins(y=0.25)
    fig.suptitle("weft pod-to-pod, two nodes in netns on one host: %s x %s, kernel %s\nrounds: %s; load average at start %s" % (
        info.get("nproc", "?"), info.get("cpu", "?"), info.get("kernel", "?"), info.get("rounds", "?"),
        info.get("load average at start", "?")), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(out, dpi=110)
    print("chart: %s" % out)


def rr_chart(ax, rows, cases, t, colors):
    """p50 (solid) and p99 (hatched) bars per case, each with its ratio to kernel vxlan."""
    for j, (k, name) in enumerate((("value", "p50"), ("p99", "p99"))):
        ref = stats(rows, "kvxlan", t, k)
        for i, c in enumerate(cases):
            m = stats(rows, c, t, k)
            if not m:
                continue
            x = i + (j - 0.5) * 0.4
            ax.bar(x, m[0], width=0.38, color=colors[c], hatch="//" if j else None, alpha=0.6 if j else 1,
                   yerr=[[m[0] - m[1]], [m[2] - m[0]]], capsize=2)
            txt = "%s %.0f" % (name, m[0]) + ("\n%.2fx" % (m[0] / ref[0]) if ref and ref[0] > 0 else "")
            ax.annotate(txt, (x, m[2]), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
    test, proto = t.split("/")
    what = {"rr-idle": "idle", "rr-busy": "beside two nice 19 busy loops", "rr-bulk": "beside a bulk TCP stream"}
    ax.set_title("sockperf ping-pong %s, 64 B, %s: one-way p50 / p99 (hatched), us; ratio to kernel vxlan" % (
        proto.upper(), what.get(test, test)), fontsize=9)
    ax.set_ylabel("us")
    ax.set_xticks(list(range(len(cases))))
    ax.set_xticklabels([label(c) for c in cases], rotation=20, ha="right", fontsize=8)
    ax.margins(y=0.25)


def main():
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "header":
        print("\t".join(COLS))
    elif cmd == "row":
        row(argv)
    elif cmd == "gaprow":
        gaprow(argv)
    elif cmd == "summary":
        summary(argv)
    elif cmd == "chart":
        chart(argv)
    else:
        sys.exit("unknown command %s" % cmd)


if __name__ == "__main__":
    main()
