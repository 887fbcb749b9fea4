#!/usr/bin/env python3
"""The measurements of bench/history.sh (see there); prints Markdown."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

CAPSULE = os.environ["CAPSULE_BIN"]
WORK = os.environ["WORK"]
S3_AT = os.environ["S3_AT"]  # host:port, through the latency proxy
S3_DIRECT = os.environ["CAPSULE_TEST_S3_UPSTREAM"]
KEY = os.environ["CAPSULE_TEST_S3_KEY"]
SECRET = os.environ["CAPSULE_TEST_S3_SECRET"]
MC = os.environ["MC"]
TAG = os.path.basename(WORK).split(".")[-1].lower()

ENV = dict(
    os.environ,
    CAPSULE_PASSWORD="bench",
    RESTIC_PASSWORD="bench",
    AWS_ACCESS_KEY_ID=KEY,
    AWS_SECRET_ACCESS_KEY=SECRET,
    CAPSULE_CACHE_DIR=os.path.join(WORK, "cache"),
)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, env=None, check=True):
    """Runs cmd; returns (seconds, stdout)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env or ENV, capture_output=True, text=True)
    secs = time.monotonic() - t0
    if check and p.returncode != 0:
        log("FAILED:", " ".join(cmd), p.stdout[-2000:], p.stderr[-2000:])
        sys.exit(1)
    return secs, p.stdout


def capsule(repo, *args, trace=None):
    cmd = [CAPSULE, "-r", repo]
    if trace:
        cmd += ["--trace-requests", trace]
    return run(cmd + list(args))


def s3(bucket, prefix="repo", at=S3_AT):
    return f"s3+http://{at}/{bucket}/{prefix}"


def puts_in(trace):
    """PUT requests and their bytes in a request trace."""
    n = b = 0
    with open(trace) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            # The source's own reading session is not the copy's traffic.
            if len(cols) >= 6 and cols[2] == "put" and "sessions/" not in cols[5]:
                n += 1
                b += int(cols[3] or 0)
    return n, b


MCENV = dict(ENV, MC_CONFIG_DIR=os.path.join(WORK, "mc"))


def drop_bucket(bucket):
    """Removes a bucket and every version in it (the root key may bypass
    governance retention), so that the run fits on this machine's disk."""
    run([MC, "rm", "-r", "--force", "--versions", "--bypass", f"bench/{bucket}"], env=MCENV, check=False)
    run([MC, "rb", "--force", f"bench/{bucket}"], env=MCENV, check=False)


def count_files(d):
    n = size = 0
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                n += 1
                size += os.path.getsize(p)
    return n, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--rtt", type=int, default=2)
    ap.add_argument("--objects", type=int, default=100_000)
    a = ap.parse_args()

    data = a.data
    if not data:
        data = os.path.join(WORK, "toolchain")
        shutil.copytree(os.path.expanduser("~/.rustup/toolchains"), data, symlinks=True)
    files, size = count_files(data)
    log(f"data: {files} files, {size / 2**20:.0f} MiB")
    subprocess.run(["sync"])
    time.sleep(2)

    rows = []
    run([MC, "alias", "set", "bench", f"http://{S3_DIRECT}", KEY, SECRET], env=MCENV)

    # --- what object lock costs a backup: plain, then locked, then plain
    # again (the same data, the same run; the median of the plain ones).
    plain, locked = [], []
    for i, kind in enumerate(["plain", "lock", "plain2"]):
        url = s3(f"hist-{TAG}-{kind}")
        if kind == "lock":
            capsule(url, "init", "--object-lock", "30d")
        else:
            capsule(url, "init")
        secs, out = capsule(url, "--json", "backup", data)
        v = json.loads(out)
        (locked if kind == "lock" else plain).append((secs, v["destination"]["requests"]))
        log(f"backup to S3 ({kind}): {secs:.1f} s, {v['destination']['requests']} requests")
        drop_bucket(f"hist-{TAG}-{kind}")
    # The mean of the two unlocked runs, one before and one after the
    # locked one, so a drift in the machine's speed affects both sides.
    plain_secs = sum(s for s, _ in plain) / len(plain)
    lock_secs = locked[0][0]
    rows.append(("backup to S3, no lock (mean of the runs before and after)", f"{plain_secs:.1f} s", f"{plain[0][1]} requests", ""))
    rows.append((
        "backup to S3, `init --object-lock 30d`",
        f"{lock_secs:.1f} s",
        f"{locked[0][1]} requests",
        f"{lock_secs / plain_secs:.2f}× the unlocked",
    ))

    # --- capsule copy: local repository → S3, against backup → S3.
    local = os.path.join(WORK, "local")
    capsule(local, "init")
    secs_local, _ = capsule(local, "backup", data)
    log(f"backup to local disk: {secs_local:.1f} s")
    dst = s3(f"hist-{TAG}-copy")
    capsule(dst, "init", "--copy-chunker-params-from", local)
    trace1 = os.path.join(WORK, "copy1.trace")
    secs_copy, out = capsule(local, "--json", "copy", "--to", dst, trace=trace1)
    first = json.loads(out)
    trace2 = os.path.join(WORK, "copy2.trace")
    secs_again, out = capsule(local, "--json", "copy", "--to", dst, trace=trace2)
    again = json.loads(out)
    p1, b1 = puts_in(trace1)
    p2, b2 = puts_in(trace2)
    log(f"copy: {secs_copy:.1f} s; again {secs_again:.1f} s, {p2} puts, {b2} bytes")
    rows.append((
        "`capsule copy` local → S3 (shared chunker parameters)",
        f"{secs_copy:.1f} s",
        f"{p1} PUTs, {b1 / 2**20:.0f} MiB",
        f"{plain_secs / secs_copy:.2f}× the speed of backup to S3",
    ))
    rows.append((
        "`capsule copy` again, nothing new",
        f"{secs_again:.1f} s",
        f"{p2} PUTs, {b2} bytes",
        f"{len(again['copied'])} copied, {again['already_there']} already there",
    ))
    _, _ = capsule(dst, "check")
    drop_bucket(f"hist-{TAG}-copy")

    # --- restic copy, where restic runs here.
    if shutil.which("restic"):
        rlocal = os.path.join(WORK, "restic-local")
        run(["restic", "-r", rlocal, "init", "-q"])
        run(["restic", "-r", rlocal, "backup", "-q", data])
        rdst = f"s3:http://{S3_AT}/hist-{TAG}-restic/repo"
        renv = dict(ENV, RESTIC_FROM_PASSWORD="bench")
        run(["restic", "-r", rdst, "init", "-q", "--from-repo", rlocal, "--copy-chunker-params"], env=renv)
        t_rc, _ = run(["restic", "-r", rdst, "copy", "-q", "--from-repo", rlocal], env=renv)
        t_rc2, _ = run(["restic", "-r", rdst, "copy", "-q", "--from-repo", rlocal], env=renv)
        log(f"restic copy: {t_rc:.1f} s; again {t_rc2:.1f} s")
        drop_bucket(f"hist-{TAG}-restic")
        shutil.rmtree(rlocal)
        rows.append(("`restic copy` local → S3 (`--copy-chunker-params`)", f"{t_rc:.1f} s", "",
                     f"capsule copy is {t_rc / secs_copy:.2f}× as fast"))
        rows.append(("`restic copy` again, nothing new", f"{t_rc2:.1f} s", "",
                      f"capsule: {secs_again:.1f} s"))
    else:
        rows.append(("`restic copy`", "not run", "", "restic could not be installed"))
    rows.append(("`kopia repository sync-to`", "not run", "",
                 "the Go module proxy refuses github.com/kopia/kopia here"))

    # --- object lock's maintenance for N objects: a locked repository
    # with N extra objects, then `prune --extend-retention` (--objects 0
    # leaves it out).
    if a.objects == 0:
        return finish(rows, files, size, secs_local, a.rtt)
    bucket = f"hist-{TAG}-many"
    url = s3(bucket)
    capsule(url, "init", "--object-lock", "30d")
    many = os.path.join(WORK, "many")
    os.makedirs(many)
    for i in range(a.objects):
        d = os.path.join(many, f"{i % 256:02x}")
        if i < 256:
            os.makedirs(d)
        with open(os.path.join(d, f"{i:08d}"), "wb") as f:
            f.write(b"x" * 64)
    shutil.rmtree(local)
    t_up, _ = run([MC, "mirror", "-q", many, f"bench/{bucket}/repo/extra"], env=MCENV)
    log(f"{a.objects} objects written in {t_up:.0f} s")
    secs_m, out = capsule(url, "--json", "prune", "--extend-retention")
    m = json.loads(out)["prune"]["object_lock"]
    pages = -(-m["objects"] // 1000)
    rows.append((
        f"prune extending the retention of {m['extended']:,} objects",
        f"{secs_m:.1f} s",
        f"{m['extended']:,} PutObjectRetention + {pages} list pages + {pages} version-list pages",
        f"{m['extended'] / secs_m:,.0f} objects/s",
    ))
    secs_m2, out = capsule(url, "--json", "prune")
    m2 = json.loads(out)["prune"]["object_lock"]
    rows.append((
        "the next prune (nothing due: extended less than half a period ago)",
        f"{secs_m2:.1f} s",
        f"{m2['extended']} extended",
        "",
    ))
    drop_bucket(bucket)
    finish(rows, files, size, secs_local, a.rtt)


def finish(rows, files, size, secs_local, rtt):
    pinned = "pinned (servers and proxy on the last core)" if os.environ.get("PINNED") == "1" else "unpinned"
    print(f"Data: {files:,} files, {size / 2**20:,.0f} MiB; MinIO at {rtt} ms round trip; {pinned}; "
          f"capsule to the local disk took {secs_local:.1f} s.\n")
    print("| run | time | requests | comparison |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
