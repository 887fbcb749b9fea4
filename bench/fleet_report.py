"""The outputs of bench/fleet_year.py: runs.csv, faults.csv, fleet-year.svg
and summary.md (printed too)."""
import csv
import os
import statistics

from fleet_faults import KINDS
from year import svg_chart

D = 86400
MIB = 1 << 20


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def outcome(f, runs):
    """What a fault did, from the runs of its step."""
    if f.get("skipped"):
        return "not applied: " + f["skipped"]
    k = f["kind"]
    if k in ("node-kill", "link-down", "node-kill-prune", "drive-wipe"):
        if not f.get("applied_at"):
            return "not applied"
        return "applied after waiting for the store to heal" if f.get("waited") else "applied"
    mine = [r for r in runs if r["step"] == f["step"]]
    if k.startswith("kill-") and k != "kill-backup":
        hit = [r for r in mine if r["kind"] == f.get("target")]
        if not hit:
            return "no run to kill"
        return "killed mid-run" if hit[0]["exit"] == -9 else f"ended before the kill (exit {hit[0]['exit']})"
    hit = [r for r in mine if r["host"] == f"h{f['host']}" and k in r["faults"].split("+")]
    if not hit:
        return "host asleep"
    codes = ",".join(str(r["exit"]) for r in hit)
    if k == "kill-backup":
        return "killed mid-run" if hit[0]["exit"] == -9 else f"ended before the kill (exit {codes})"
    return f"exit {codes}"


def fault_panel(faults, x0, x1, w=900):
    kinds = [k for k, _ in KINDS]
    left, top, row = 70, 30, 12
    h = top + row * len(kinds) + 30
    pw = w - left - 20
    out = [f'<g><text x="{left}" y="18" font-size="14">Faults on the time axis</text>']
    for i, k in enumerate(kinds):
        y = top + i * row
        out.append(f'<text x="4" y="{y + 9}" font-size="9">{k}</text>')
        for f in faults:
            if f["kind"] == k:
                x = left + (f["when"] - x0) / max(x1 - x0, 1) * pw
                out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + row - 2}" stroke="#d62728"/>')
    out.append("</g>")
    return "\n".join(out), h


def restore_row(speed):
    """Year-old against fresh restores: seconds (sums of medians), ratio, what they fetched."""
    if not speed:
        return ""
    old, new = sum(s[1] for s in speed), sum(s[2] for s in speed)
    sp = f"{old:.2f} s against {new:.2f} s from a fresh repository (**{old / new:.2f}×**, {len(speed)} hosts, median of 3 each)"
    if len(speed[0]) > 3:
        ro, rn = sum(s[3][0] for s in speed), sum(s[4][0] for s in speed)
        bo, bn = sum(s[3][1] for s in speed), sum(s[4][1] for s in speed)
        po, pn = sum(s[3][2] for s in speed), sum(s[4][2] for s in speed)
        sp += (f"; they fetched {ro} against {rn} requests, {bo / MIB:.0f} against {bn / MIB:.0f} MiB"
               f" from {po} against {pn} packs")
    if len(speed[0]) > 3 and len(speed[0][3]) > 5:
        co, cn = sum(s[3][5] for s in speed), sum(s[4][5] for s in speed)
        sp += f"; the store's servers used {co:.1f} against {cn:.1f} CPU seconds"
    return sp


def control_row(control):
    """The end's backups of the same changes, year-old repository against fresh."""
    if not control:
        return ""
    so, sn = med([c[1] for c in control]), med([c[2] for c in control])
    ro, rn = med([c[3] for c in control]), med([c[4] for c in control])
    mo, mn = max(c[5] for c in control), max(c[6] for c in control)
    return (f"{so:.2f} s against {sn:.2f} s (**{so / sn:.2f}×**), requests {ro:.0f} against {rn:.0f}, "
            f"peak memory {mo / 1024:.0f} against {mn / 1024:.0f} MiB ({len(control)} runs, medians)")


def kinds_table(early, last, e_runs, l_runs):
    """Mean requests by kind of the traced clean hourly runs of two months."""
    def means(rs):
        tot, n = {}, 0
        for r in rs:
            if not r.get("req_kinds"):
                continue
            n += 1
            for kv in r["req_kinds"].split():
                k, v = kv.rsplit("=", 1)
                tot[k] = tot.get(k, 0) + int(v)
        return {k: v / n for k, v in tot.items()} if n else {}
    me, ml = means(e_runs), means(l_runs)
    if not me or not ml:
        return ""
    rows = [f"| requests by kind (mean, clean hourly runs) | month {early + 1} | month {last + 1} |",
            "|---|---:|---:|"]
    for k in sorted(set(me) | set(ml), key=lambda k: -(ml.get(k, 0) + me.get(k, 0))):
        rows.append(f"| {k} | {me.get(k, 0):.1f} | {ml.get(k, 0):.1f} |")
    return "\n".join(rows)


def report(A, out, runs, faults, storage, tiers, policy, problems, speed, check_code,
           end_restores, year_secs, steps, start, prefix, speed16=(), control=(), store_reports=()):
    cols = ["step", "when", "host", "kind", "exit", "secs", "requests", "bytes_up",
            "peak_rss_kib", "cache_kib", "faults", "run", "hourly", "store_out", "sampled", "note",
            "req_kinds"]
    with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(runs)
    for f in faults:
        f["outcome"] = outcome(f, runs)
    with open(os.path.join(out, "faults.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["step", "when", "kind", "host", "node", "delay", "secs", "jump",
                               "waited", "outcome"], extrasaction="ignore")
        w.writeheader()
        w.writerows(faults)

    x0, x1 = start, steps[-1]
    backups = [r for r in runs if r["kind"] in ("backup", "second")]
    clean = [r for r in backups if r["exit"] == 0 and not r["faults"] and not r["store_out"]]
    charts = [
        svg_chart([("stored (MiB)", "#1f77b4", [(s[0], s[1] / MIB) for s in storage]),
                   ("distinct kept (MiB)", "#2ca02c", [(s[0], s[2] / MIB) for s in storage])],
                  "Repository size after each prune against the distinct data it keeps", "MiB",
                  x0, x1, max([s[1] / MIB for s in storage] + [1]) * 1.1),
        svg_chart([("last 24 h", "#2ca02c", [(t[0], t[1]) for t in tiers]),
                   ("daily (30 d)", "#ff7f0e", [(t[0], t[2]) for t in tiers]),
                   ("weekly", "#9467bd", [(t[0], t[3]) for t in tiers])],
                  "Snapshots per tier (all hosts)", "", x0, x1,
                  max([max(t[1:]) for t in tiers] + [1]) * 1.1),
        svg_chart([("backup (s)", "#1f77b4", [(r["when"], r["secs"]) for r in clean])],
                  "Seconds per clean backup", "s", x0, x1,
                  max([r["secs"] for r in clean] + [1]) * 1.1),
        svg_chart([("requests", "#8c564b", [(r["when"], r["requests"]) for r in clean])],
                  "Requests per clean backup", "", x0, x1,
                  max([r["requests"] for r in clean] + [1]) * 1.1),
        fault_panel(faults, x0, x1),
    ]
    y, body = 0, []
    for svg, h in charts:
        body.append(f'<g transform="translate(0,{y})">{svg}</g>')
        y += h
    with open(os.path.join(out, "fleet-year.svg"), "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{y}" '
                f'font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n")

    # Months: twelve equal parts of the simulated span.
    span = (A.days * D) / 12

    def month(t):
        return min(11, int((t - start) // span))
    lines = ["| month | backups (exit 0 / all) | faults | median s, clean hourly run | "
             "median requests | median requests, every clean run | largest cache MiB | "
             "peak memory MiB | stored / distinct after prune (last, max) |",
             "|---|---|---|---|---|---|---|---|---|"]
    hourly_by_month = {}
    for m in range(12):
        mb = [r for r in backups if month(r["when"]) == m]
        hr = [r for r in clean if month(r["when"]) == m and r["hourly"]]
        hourly_by_month[m] = hr
        st = [s for s in storage if month(s[0]) == m and s[2]]
        ratios = [s[1] / s[2] for s in st]
        lines.append(
            f"| {m + 1} | {sum(r['exit'] == 0 for r in mb)} / {len(mb)} | "
            f"{sum(month(f['when']) == m for f in faults)} | "
            f"{med([r['secs'] for r in hr]):.2f} | {med([r['requests'] for r in hr]):.0f} | "
            f"{med([r['requests'] for r in clean if month(r['when']) == m]):.0f} | "
            f"{max([r.get('cache_kib') or 0 for r in mb] + [0]) / 1024:.0f} | "
            f"{max([r['peak_rss_kib'] for r in mb] + [0]) / 1024:.0f} | "
            + (f"{ratios[-1]:.2f}, {max(ratios):.2f} |" if ratios else "— |"))
    # The second month's hourly runs (or the first month after the first
    # that has any) against the latest month's.
    early = next((m for m in range(1, 11) if hourly_by_month[m]), None)
    last = next((m for m in range(11, 0, -1) if hourly_by_month[m]), None)
    flat = ""
    if early is not None and last is not None and last > early:
        e, l_ = hourly_by_month[early], hourly_by_month[last]
        flat = (f"month {early + 1} {med([r['secs'] for r in e]):.2f} s against month {last + 1} "
                f"{med([r['secs'] for r in l_]):.2f} s "
                f"(**{med([r['secs'] for r in l_]) / med([r['secs'] for r in e]):.2f}×**; "
                f"requests {med([r['requests'] for r in e]):.0f} → {med([r['requests'] for r in l_]):.0f})")
    by_kind = {}
    for f in faults:
        by_kind.setdefault(f["kind"], []).append(f["outcome"])
    fault_lines = ["| fault | count | what it did |", "|---|---:|---|"]
    for k, _ in KINDS:
        oc = by_kind.get(k, [])
        counts = {}
        for o in oc:
            counts[o] = counts.get(o, 0) + 1
        fault_lines.append(f"| {k} | {len(oc)} | "
                           + "; ".join(f"{n}× {o}" for o, n in sorted(counts.items(), key=lambda x: -x[1]))
                           + " |")
    codes = {}
    for r in backups:
        codes[r["exit"]] = codes.get(r["exit"], 0) + 1
    jobs = [r for r in runs if r["kind"] not in ("backup", "second")]
    lost = [p for p in problems if "LOST" in p]
    less = [p for p in problems if "with less" in p or "exit 0 with" in p]
    ratios = [s[1] / s[2] for s in storage if s[2]]
    use = [s for s in storage if s[4] and s[2]]
    waiting = (f"last {use[-1][1] / use[-1][4]:.2f}×, highest {max(s[1] / s[4] for s in use):.2f}×"
               if use else "—")
    granular = (f"last {use[-1][4] / use[-1][2]:.2f}×, highest {max(s[4] / s[2] for s in use):.2f}×"
                if use else "—")
    sp = restore_row(speed)
    sp16 = restore_row(speed16)
    ctl = control_row(control)
    kinds = ""
    if early is not None and last is not None and last > early:
        kinds = kinds_table(early, last, hourly_by_month[early], hourly_by_month[last])
    waits = [f["waited"] for f in faults if f.get("waited")]
    days_run = sorted({(w - start) // 86400 for w in steps})
    sparse_days = sum(1 for d in days_run if A.dense_days <= d < A.days - A.hourly_days - 7)
    summary = f"""| fleet year (seed {A.seed}) | value |
|---|---|
| simulated | {A.days} days, {A.hosts} hosts (a desktop always on, laptops asleep 23:00–08:00 and two holiday weeks), {len(steps)} steps on {len(days_run)} days: hourly on days {A.sampled_days} and the last {A.hourly_days}; one run a day at 20:00 on days 0–{min(A.dense_days, A.days) - 1} and from day {max(0, A.days - A.hourly_days - 7)}; between them only on the {sparse_days} days a weekly prune or check or the monthly subset check falls on |
| runs | {len(backups)} backups ({", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))}); {len(jobs)} forget / prune / check jobs |
| faults | {len(faults)} (table below) |
| lost | **{len(lost)}** ({sum(1 for r in runs if r.get('sampled'))} runs restored during the year and {end_restores} kept snapshots at the end compared byte for byte) |
| exit 0 with less than the source | **{len(less)}** |
| kept set = Time Machine schedule | {sum(p[2] for p in policy.values())} of {len(policy)} hosts ({", ".join(f"{h}: {p[0]}" for h, p in policy.items())} kept) |
| `check --read-data` at the end | {"clean" if check_code == 0 else f"FAILED (exit {check_code})"}; during the year: {sum(1 for r in jobs if r['kind'] == 'check-read-data' and r['exit'] == 0)} clean of {sum(1 for r in jobs if r['kind'] == 'check-read-data')} |
| stored / distinct after prune | last {ratios[-1] if ratios else float('nan'):.2f}×, highest {max(ratios) if ratios else float('nan'):.2f}× ({storage[-1][1] / MIB if storage else 0:.0f} MiB for {storage[-1][2] / MIB if storage else 0:.0f} MiB) |
| of which: stored / packs in use (waiting for the sweep) | {waiting} |
| of which: packs in use / distinct (chunks against 1 MiB blocks) | {granular} |
| per-run cost, clean hourly runs | {flat or "—"} |
| per-run cost at the end, same sources and changes: year-old repository vs fresh | {ctl or "—"} |
| newest snapshots restored, year-old repository vs fresh | {sp or "—"} |
| the same, `--connections 16` | {sp16 or "—"} |
| store faults applied after waiting for the store to heal | {len(waits)} ({sum(waits):.0f} s in all) |
| wall time of the year | {year_secs / 60:.1f} min |
| checks that named an index file the store lists but cannot give (a warning: every snapshot's blobs found elsewhere) | {len(store_reports)}{" (steps " + ", ".join(str(r[0]) for r in store_reports) + ")" if store_reports else ""} |
| problems | {len(problems)} |

{chr(10).join(fault_lines)}

{chr(10).join(lines)}

{kinds}
"""
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary)
        for p in problems:
            f.write(f"- {p}\n")
    print(summary)
    for p in problems[:50]:
        print("problem:", p)
    notes = [r for r in runs if r.get("note")]
    for r in notes[:20]:
        print(f"note: step {r['step']} {r['host']} {r['kind']} exit {r['exit']}: {r['note']}")
