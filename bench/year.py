#!/usr/bin/env python3
"""A simulated year of hourly backups in a fixed space (bench/year.sh runs it).

Hourly backups (the test clock, CAPSULE_TEST_NOW) of a source that changes
about 1% every hour go into a repository with a quota on a small
loop-mounted file system; once a day `forget --policy timemachine --prune`
runs. Every run is timed; the repository's size is read from the disk and
its snapshot count from the snapshots/ directory. Written to OUT:

  runs.csv     one row per run
  year.svg     repository size, snapshots per tier and seconds per run
  summary.md   the checks and the medians

Checks, made without capsule's own code (except to list snapshot times and
to restore):
  * the packs on disk never exceed the quota;
  * the kept set is the Time Machine schedule for these times (everything of
    the last 24 hours, the newest of each UTC day of 30, the newest of each
    ISO week), less only its oldest members, which the quota took;
  * sampled kept snapshots restore to what was backed up (SHA-256 per file);
  * `check --read-data` is clean.
"""
import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time

H, D = 3600, 86400


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--capsule", required=True)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--file-size", type=int, default=100_000)
    p.add_argument("--quota-mib", type=int, default=48)
    p.add_argument("--fs-mib", type=int, default=128)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    return p.parse_args()


def sh(*cmd):
    subprocess.run(cmd, check=True)


class Run:
    def __init__(self, a, repo):
        self.a, self.repo = a, repo

    def __call__(self, args, when=None, check=True):
        env = dict(os.environ, CAPSULE_PASSWORD="year", TZ="UTC")
        env["CAPSULE_CACHE_DIR"] = os.path.join(self.a.work, "cache")
        if when is not None:
            env["CAPSULE_TEST_NOW"] = str(when)
        r = subprocess.run([self.a.capsule, "--repo", self.repo, *args],
                           env=env, capture_output=True, text=True)
        if check and r.returncode != 0:
            sys.exit(f"capsule {' '.join(args)} exited {r.returncode}: {r.stderr}")
        return r


def dir_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def timemachine_expected(times, now):
    def newest_by(key):
        best = {}
        for t in times:
            k = key(t)
            best[k] = max(best.get(k, t), t)
        return set(best.values())
    daily = newest_by(lambda t: t // D)
    weekly = newest_by(lambda t: (t // D + 3) // 7)
    return {t for t in times
            if now - t <= D or (now - t <= 30 * D and t in daily) or t in weekly}


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def svg_chart(series, title, ylabel, x0, x1, y1, w=900, h=220):
    """A line chart as SVG text: series is [(label, colour, [(x, y)])]."""
    left, right, top, bottom = 70, 20, 30, 30
    pw, ph = w - left - right, h - top - bottom
    y1 = y1 or 1

    def px(x):
        return left + (x - x0) / max(x1 - x0, 1) * pw

    def py(y):
        return top + ph - y / y1 * ph
    out = [f'<g><text x="{left}" y="18" font-size="14">{title}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
           f'<text x="6" y="{top + 10}" font-size="11">{y1:.3g}</text>',
           f'<text x="6" y="{top + ph}" font-size="11">0 {ylabel}</text>']
    for day in range(0, int((x1 - x0) / D) + 1, 30):
        x = px(x0 + day * D)
        out.append(f'<text x="{x:.0f}" y="{h - 8}" font-size="10">d{day}</text>')
    for i, (label, colour, pts) in enumerate(series):
        step = max(1, len(pts) // 1500)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts[::step])
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1" points="{path}"/>')
        out.append(f'<text x="{left + 10 + 150 * i}" y="{top + 14}" font-size="11" fill="{colour}">{label}</text>')
    out.append("</g>")
    return "\n".join(out), h


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    img, mnt = os.path.join(a.work, "fs.img"), os.path.join(a.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    sh("truncate", f"-s{a.fs_mib}M", img)
    sh("mkfs.ext4", "-q", "-F", "-m", "0", img)
    sh("mount", "-o", "loop", img, mnt)
    try:
        year(a, mnt)
    finally:
        subprocess.run(["umount", mnt])


def year(a, mnt):
    rng = random.Random(42)
    src = os.path.join(a.work, "src")
    os.makedirs(src, exist_ok=True)
    repo = os.path.join(mnt, "repo")
    run = Run(a, repo)
    quota = a.quota_mib << 20
    run(["init", "--quota", f"{a.quota_mib}M"])
    files = {}
    serial = 0

    def write(name):
        with open(os.path.join(src, name), "wb") as f:
            f.write(rng.randbytes(a.file_size))
        files[name] = sha(os.path.join(src, name))

    for _ in range(a.files):
        write(f"f{serial:06}")
        serial += 1
    now0 = int(time.time()) // D * D
    start = now0 - a.days * D
    rows, history, over, daily = [], {}, 0, []
    reclaims = []
    runs = a.days * 24
    for i in range(runs):
        when = start + i * H
        # About 1%: one file rewritten every run; one added and one deleted
        # every third run.
        write(sorted(files)[i % len(files)])
        if i % 3 == 0:
            write(f"f{serial:06}")
            serial += 1
            gone = sorted(files)[0]
            os.remove(os.path.join(src, gone))
            del files[gone]
        t0 = time.monotonic()
        r = run(["--json", "backup", "-q", src], when)
        secs = time.monotonic() - t0
        thinned = sum(len(t["plan"]["remove"]) for t in json.loads(r.stdout).get("thinned") or [])
        history[when] = dict(files)
        forget_secs = 0.0
        if i % 24 == 23:
            t0 = time.monotonic()
            out = run(["--json", "forget", "-q", "--policy", "timemachine", "--prune"], when)
            forget_secs = time.monotonic() - t0
            # Did this one prune give back all it marked (nothing left for a
            # later prune)? How many prunes each reclaim took.
            p = json.loads(out.stdout).get("prune") or {}
            if p.get("packs_marked"):
                reclaims.append(1 if p.get("marks_waiting") == 0
                                and p.get("packs_deleted", 0) >= p["packs_marked"] else 2)
        packs = dir_bytes(os.path.join(repo, "data")) + dir_bytes(os.path.join(repo, "tree"))
        over += packs > quota
        count = len(os.listdir(os.path.join(repo, "snapshots")))
        rows.append((i, when, secs, forget_secs, packs, dir_bytes(repo), count, thinned))
        if i % 24 == 23:
            snaps = json.loads(run(["--json", "snapshots"], when).stdout)
            ages = [when - s["snapshot"]["time_unix"] for s in snaps]
            daily.append((when, sum(x <= D for x in ages),
                          sum(D < x <= 30 * D for x in ages), sum(x > 30 * D for x in ages)))
        if i % (24 * 30) == 0:
            print(f"day {i // 24}: {packs >> 20} MiB of packs, {count} snapshots, "
                  f"{secs:.2f} s per backup", flush=True)
    now = start + (runs - 1) * H
    run(["forget", "-q", "--policy", "timemachine", "--prune"], now)
    run(["prune", "-q"], now)
    snaps = json.loads(run(["--json", "snapshots"], now).stdout)
    kept = sorted(s["snapshot"]["time_unix"] for s in snaps)
    expected = timemachine_expected(list(history), now)
    suffix = {t for t in expected if t >= kept[0]}
    policy_ok = set(kept) == suffix
    quota_took = min(expected) < kept[0]
    by_time = {s["snapshot"]["time_unix"]: s["id"] for s in snaps}
    restores = []
    for t in (kept[0], kept[len(kept) // 2], kept[-1]):
        target = os.path.join(a.work, f"restore-{t}")
        run(["restore", by_time[t], "--target", target])
        got_dir = os.path.join(target, src.lstrip("/"))
        got = {n: sha(os.path.join(got_dir, n)) for n in os.listdir(got_dir)}
        restores.append((t, got == history[t]))
        subprocess.run(["rm", "-rf", target])
    check = run(["check", "--read-data"], now, check=False).returncode == 0

    with open(os.path.join(a.out, "runs.csv"), "w") as f:
        f.write("run,time_unix,backup_secs,forget_prune_secs,pack_bytes,repo_bytes,snapshots,thinned\n")
        for r in rows:
            f.write(",".join(str(round(x, 4)) if isinstance(x, float) else str(x) for x in r) + "\n")
    x0, x1 = start, now
    charts = [
        svg_chart([("packs (MiB)", "#1f77b4", [(r[1], r[4] / 2**20) for r in rows]),
                   ("quota", "#d62728", [(x0, quota / 2**20), (x1, quota / 2**20)])],
                  "Repository size", "MiB", x0, x1, quota / 2**20 * 1.1),
        svg_chart([("last 24 h", "#2ca02c", [(d[0], d[1]) for d in daily]),
                   ("daily (30 d)", "#ff7f0e", [(d[0], d[2]) for d in daily]),
                   ("weekly", "#9467bd", [(d[0], d[3]) for d in daily])],
                  "Snapshots per tier (daily)", "", x0, x1,
                  max(max(d[1:]) for d in daily) * 1.1),
        svg_chart([("backup (s)", "#1f77b4", [(r[1], r[2]) for r in rows]),
                   ("forget --prune (s)", "#d62728", [(r[1], r[3]) for r in rows if r[3]])],
                  "Seconds per run", "s", x0, x1,
                  max(max(r[2] for r in rows), max(r[3] for r in rows)) * 1.1),
    ]
    y, body = 0, []
    for svg, h in charts:
        body.append(f'<g transform="translate(0,{y})">{svg}</g>')
        y += h
    with open(os.path.join(a.out, "year.svg"), "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{y}" '
                f'font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n")

    backups = [r[2] for r in rows]
    prunes = [r[3] for r in rows if r[3]]
    last = len(rows) - 1
    ok = over == 0 and policy_ok and quota_took and all(g for _, g in restores) and check
    summary = f"""| simulated year | value |
|---|---|
| runs | {len(rows)} hourly backups over {a.days} days, {len(prunes)} daily `forget --policy timemachine --prune` |
| source | {a.files} files of {a.file_size // 1000} kB; one rewritten each hour, one added and one deleted every third hour |
| quota | {a.quota_mib} MiB on a {a.fs_mib} MiB loop-mounted ext4 |
| runs over the quota (packs on disk) | {over} |
| kept set equals the Time Machine schedule, less its oldest (taken by the quota) | {"yes" if policy_ok else "NO"} ({len(kept)} kept; the quota took some: {"yes" if quota_took else "no"}) |
| snapshots at the end: last 24 h / daily / weekly | {daily[-1][1]} / {daily[-1][2]} / {daily[-1][3]} |
| sampled restores bit-identical (oldest, middle, newest) | {sum(g for _, g in restores)} of {len(restores)} |
| `check --read-data` | {"clean" if check else "FAILED"} |
| backup seconds: median, p95, max | {statistics.median(backups):.3f}, {sorted(backups)[int(len(backups) * .95)]:.3f}, {max(backups):.3f} |
| forget --prune seconds: median, max | {statistics.median(prunes):.3f}, {max(prunes):.3f} |
| prunes each reclaim took (of the daily runs that marked packs) | {sum(r == 1 for r in reclaims)} in one, {sum(r > 1 for r in reclaims)} in more |
| backup seconds, first month vs last month (median) | {statistics.median(backups[:720]):.3f} vs {statistics.median(backups[-720:]):.3f} |
| packs at the end | {rows[last][4] / 2**20:.1f} MiB |
"""
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(summary)
    print(summary)
    if not ok:
        sys.exit("the simulated year failed a check (see above)")


if __name__ == "__main__":
    main()
