#!/usr/bin/env python3
"""A household's year on a distributed store: the body of bench/fleet-year.sh.

Hosts (a desktop always on, laptops that sleep at night and for holiday
weeks) back up, each from its own source, cache, host name, records and
profile (`retention = { policy = "timemachine" }`), into one repository on
MinIO in distributed mode (4 nodes x 2 drives in network namespaces), under
the test clock, for a simulated year, while a seeded schedule of faults
hits them and the store. Each job is the command the daemon would start
(`capsule --config C --profile P backup|forget|prune --wait|check`),
started by this script at the simulated times: the daemon itself sleeps in
real time, so it cannot be driven through a year in an hour. A prune waits
(as the daemon's does) for the backups its marks wait for: its clock is a
file, moved an hour and a few minutes on once its step's backups have
ended, so the sessions of those killed mid-run run out their lease as they
would have while it waited.

Time is compressed so that the year fits about an hour: every hour, as the
daemon runs it, on the `--sampled-days` (one in the second month, one
mid-year) and on the last `--hourly-days` (1); one run a day (20:00) on the
first `--dense-days` (60) and the week before the hourly ones; in between,
one run on each day a job of the desktop's daemon falls on (the weekly
prune and check, the monthly subset check), about two days a week, each
run then catching up a day or more of changes. Forget runs on every day
that runs, prune and check weekly, `check --read-data-subset next/12`
monthly, a full `check --read-data` at seeded points, all beside the
backups of their step. The summary lists the days run.

Checks, made outside capsule's code (except to list, restore and check):
  * sampled runs that exited 0 restore byte for byte to the manifest (path,
    size, SHA-256) the model kept of the source at that run, and every run
    that exited 0 counted every file of it;
  * every host's kept set is the Time Machine schedule of every snapshot it
    ever had, at the year's end;
  * `check --read-data` clean at the seeded points and at the end;
  * stored bytes (an S3 listing) against the distinct bytes of the kept
    snapshots (whole files by hash, large files by 1 MiB block), after
    every prune;
  * per-run seconds, requests and peak memory by month;
  * the newest snapshot of every host restores as fast as from a fresh
    repository holding only it.
Writes runs.csv, faults.csv, fleet-year.svg and summary.md to --out and
exits 1 when a check fails.
"""
import argparse
import atexit
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_faults  # noqa: E402
import fleet_model  # noqa: E402
from fleet_report import report  # noqa: E402
from year import timemachine_expected  # noqa: E402

H, D = 3600, 86400
START = 1_764_547_200  # 2025-12-01 00:00 UTC: the year ends 2026-12-01


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--capsule", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--hourly-days", type=int, default=1,
                   help="the last N days run every hour")
    p.add_argument("--dense-days", type=int, default=60,
                   help="the first N days (and the week before the hourly ones) run daily; "
                        "the days between run only when a weekly or monthly job falls on them")
    p.add_argument("--sampled-days", default="44,194",
                   help="days (from 0) run every hour besides the last ones: by default one "
                        "in the second month, to compare the last month's runs with, and one "
                        "mid-year")
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--faults", type=int, default=1000)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--read-data-points", type=int, default=3,
                   help="full check --read-data runs during the year (besides the end)")
    p.add_argument("--sample", type=float, default=0.03,
                   help="share of clean runs restored and compared (runs after a fault: all)")
    p.add_argument("--max-outage", type=float, default=80.0,
                   help="longest node outage in seconds")
    p.add_argument("--pin", action="store_true", help="the store's nodes on the last core")
    p.add_argument("--store-wait-steps", type=int, default=6,
                   help="a store fault put off this many steps (the store still healing) is "
                        "applied after waiting for the store, so that every planned fault is; "
                        "0: never wait (a fault still put off at the end is listed as not applied)")
    p.add_argument("--trace-hourly", type=int, default=1,
                   help="1: hourly days' backups write a request trace, and runs.csv counts "
                        "their requests by kind (req_kinds)")
    return p.parse_args()


A = parse_args()
from cluster_env import BUCKET, CDIR, CTL, KEY, NODES, SECRET  # noqa: E402
PREFIX = f"fleet-{A.seed}-{os.getpid()}"
work = tempfile.mkdtemp(prefix="capsule-fleet.")
os.makedirs(A.out, exist_ok=True)
# An earlier run's reports would read as this one's.
for old in os.listdir(A.out):
    if old.startswith(("damage-step", "store-report-step")):
        os.remove(os.path.join(A.out, old))


def log(*a):
    print("fleet-year:", *a, file=sys.stderr, flush=True)


def minio_pids():
    d = os.path.join(CDIR, "cluster")
    return [open(os.path.join(d, f)).read().strip() for f in os.listdir(d) if f.endswith(".pid")]


def server_cpu():
    """CPU seconds the store's servers have used so far (all nodes)."""
    total = 0
    for p in minio_pids():
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])
    return total / os.sysconf("SC_CLK_TCK")


def pin_servers():
    for p in minio_pids():
        subprocess.run(["taskset", "-a", "-cp", str(os.cpu_count() - 1), p], capture_output=True)


CLIENT_CPU = []
if A.pin:
    pin_servers()
    last = os.cpu_count() - 1
    CLIENT_CPU = ["taskset", "-c", "0" if last == 1 else f"0-{last - 1}"]
store = fleet_faults.Store(CTL, CDIR, pin_servers if A.pin else None)


# GNU time measures a run's own peak memory. wait4 cannot: a child forked
# from this (large, growing) Python process starts with its resident pages,
# and the kernel keeps that high-water mark across exec, so wait4 would
# report the harness's memory once it outgrows capsule's.
GNU_TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None


class Proc:
    """A capsule process: output to files (never a full pipe), its peak
    memory from GNU time, in a process group of its own so that a kill
    reaches capsule itself at once."""

    def __init__(self, cmd, env, label):
        self.label = label
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.rss_file = tempfile.NamedTemporaryFile(prefix="rss.") if GNU_TIME else None
        timed = [GNU_TIME, "-f", "%M", "-o", self.rss_file.name] if GNU_TIME else []
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([*timed, *CLIENT_CPU, *cmd], env=env, stdout=self.out,
                                  stderr=self.err, start_new_session=True)
        self.code = self.secs = self.rss_kib = None
        self.stdout = self.stderr = ""

    def kill(self):
        # os.killpg, not Popen.send_signal: that polls, and would reap the
        # child before wait4 could; until it is reaped, its PID (the
        # group's ID) cannot name another process.
        if self.code is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self):
        if self.code is None:
            _, status, ru = os.wait4(self.p.pid, 0)
            self.p.returncode = self.code = os.waitstatus_to_exitcode(status)
            self.secs = time.monotonic() - self.t0
            if self.rss_file:
                # %M is the file's last word (after "Command exited with
                # non-zero status N" when it did); a killed run has none.
                try:
                    lines = open(self.rss_file.name).read().split()
                    self.rss_kib = int(lines[-1]) if lines and lines[-1].isdigit() else 0
                except OSError:
                    self.rss_kib = 0
                self.rss_file.close()
            else:
                self.rss_kib = 0
            for f, attr in ((self.out, "stdout"), (self.err, "stderr")):
                f.seek(0)
                setattr(self, attr, f.read().decode(errors="replace"))
                f.close()
        return self.code

    def json(self):
        try:
            return json.loads(self.stdout)
        except ValueError:
            return None


class Host:
    def __init__(self, i, rng, library):
        self.i, self.name, self.desktop = i, f"h{i}", i == 0
        self.rng = random.Random(rng.random())
        root = os.path.join(work, self.name)
        self.src = fleet_model.Source(os.path.join(root, "src"), self.rng, library, self.desktop)
        self.cache = os.path.join(root, "cache")
        self.state = os.path.join(root, "state")
        os.makedirs(self.cache)
        # The cache on a small file system of its own, so that it can be
        # filled (a full disk) without filling this machine's.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", self.cache], check=True)
        self.config = os.path.join(root, "capsule.toml")
        node = NODES[i % len(NODES)]
        with open(self.config, "w") as f:
            f.write(f"""[profiles.{self.name}]
sources = ["{self.src.root}"]
repository = "s3+http://{node}/{BUCKET}/{PREFIX}"
password-command = "echo fleet"
retention = {{ policy = "timemachine" }}
schedule = {{ backup = "hourly", forget = "daily", prune = "weekly", check = "weekly", check-read-data = "every 30d", check-read-data-subset = "next/12" }}
""")
        # Laptops sleep 23:00-08:00 and for two holiday weeks a year.
        self.holidays = set()
        if not self.desktop:
            for _ in range(2):
                d0 = self.rng.randrange(0, max(1, A.days - 7))
                self.holidays.update(range(d0, d0 + 7))
        self.last_when = None
        self.last_secs = 1.0

    def awake(self, when):
        if self.desktop:
            return True
        day, hour = (when - START) // D, (when % D) // H
        return day not in self.holidays and 8 <= hour < 23

    def env(self, when):
        e = {k: v for k, v in os.environ.items() if not k.startswith("CAPSULE_")}
        e.update(CAPSULE_CONFIG=self.config, CAPSULE_CACHE_DIR=self.cache,
                 CAPSULE_STATE_DIR=self.state, CAPSULE_TEST_NOW=str(when), TZ="UTC",
                 AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
        return e

    def capsule(self, when, *args, label="", clock=None):
        env = self.env(when)
        if clock:
            with open(clock, "w") as f:
                f.write(str(when))
            env["CAPSULE_TEST_NOW"] = "@" + clock
        return Proc([A.capsule, "--profile", self.name, *args], env, label or args[-1])


def cache_kib(path):
    """What the host's cache disk holds (its own tmpfs), KiB."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024


def s3_stored():
    """The repository's bytes on the store, from an S3 listing (not capsule)."""
    total, token = 0, None
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    for _ in range(10_000):
        node = NODES[store.up_node() - 1]
        # In sorted order: curl signs the query as given.
        q = (f"continuation-token={token}&" if token else "") + f"list-type=2&prefix={PREFIX}%2F"
        r = subprocess.run(["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3",
                            "--user", f"{KEY}:{SECRET}", f"http://{node}/{BUCKET}?{q}"],
                           capture_output=True)
        if r.returncode != 0:
            return None
        root = ET.fromstring(r.stdout)
        total += sum(int(c.findtext(f"{ns}Size")) for c in root.iter(f"{ns}Contents"))
        if root.findtext(f"{ns}IsTruncated") != "true":
            return total
        token = urllib_quote(root.findtext(f"{ns}NextContinuationToken"))
    return None


def in_use(when):
    """Bytes of packs the kept snapshots use (a dry-run prune's count): what
    the store holds beyond it is waiting for the sweep."""
    p = hosts[0].capsule(when, "--json", "prune", "--dry-run", label="prune -n")
    if p.wait() != 0:
        return None
    return ((p.json() or {}).get("prune") or {}).get("bytes_in_use_packs")


def urllib_quote(s):
    from urllib.parse import quote
    return quote(s, safe="")


def tree_matches(root, manifest, skip=()):
    """Does the restored tree hold exactly the manifest's files, byte for byte?"""
    got = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                got[os.path.relpath(p, root)] = fleet_model.sha(fh.read())
    want = {k for k in manifest if k not in skip}
    have = {k for k in got if k not in skip}
    if want != have:
        return f"{len(want - have)} files missing, {len(have - want)} extra (e.g. {sorted(want ^ have)[:3]})"
    bad = [k for k in want if not manifest[k].accepts(got[k])]
    return f"{len(bad)} files differ (e.g. {bad[:3]})" if bad else None


# -- the year's steps: (simulated time, hourly day?)
rng = random.Random(A.seed)
sampled = {int(d) for d in A.sampled_days.split(",") if d.strip()}
steps = []
hourly_days = {d for d in range(A.days) if d >= A.days - A.hourly_days or d in sampled}


def job_day(d):
    """A day the desktop's daemon starts a weekly or monthly job."""
    return d % 7 in (3, 6) or d % 30 == 10


for d in range(A.days):
    hourly = d in hourly_days
    daily = d < A.dense_days or d >= A.days - A.hourly_days - 7 or job_day(d)
    if hourly or daily:
        for h in (range(24) if hourly else [20]):
            steps.append(START + d * D + h * H)
library = fleet_model.Library(os.path.join(work, "library"), rng)
library.add(100)
hosts = []


def unmount():
    for h in hosts:
        subprocess.run(["umount", h.cache], capture_output=True)


atexit.register(unmount)
# SIGTERM (a run stopped by hand) ends through sys.exit, so atexit unmounts.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
for i in range(A.hosts):
    hosts.append(Host(i, rng, library))
plan = fleet_faults.schedule(rng, steps, A.faults, lambda w: [h.i for h in hosts if h.awake(w)])
for fs in plan.values():
    for f in fs:
        f.get("secs") and f.update(secs=min(f["secs"], A.max_outage))
read_data_steps = set(rng.sample(range(len(steps) // 4, len(steps)), A.read_data_points))
log(f"{len(steps)} steps, {A.hosts} hosts, {sum(len(v) for v in plan.values())} faults planned "
    f"(seed {A.seed}); work in {work}")

# -- the records the checks read
runs = []            # one dict per process run (backups and jobs)
faults = []          # one dict per fault, with what it did
manifests = {}       # run id -> manifest, while its snapshot may be live
committed = {}       # run id -> {host, time, exit} of every snapshot seen
ever = {}            # host -> {snapshot time} of every snapshot ever seen
problems = []        # every failed check: lost data, exit 0 with less, ...
storage = []         # (when, stored, distinct, live snapshots) after each prune
held_ahead = []      # clocks of killed runs whose clock ran ahead: their sessions
store_reports = []   # checks that passed but named index files the store lists and cannot give
tiers = []           # (when, last 24 h, daily, weekly) per day
run_serial = [0]


def run_id():
    run_serial[0] += 1
    return f"r{run_serial[0]}"


def listing(when, host=None):
    """The live snapshots (capsule's listing): remembers every one seen, and
    forgets the manifests of runs whose snapshot is gone."""
    p = (host or hosts[0]).capsule(when, "--json", "snapshots", label="snapshots")
    if p.wait() != 0:
        return None
    live = {}
    for s in p.json() or []:
        sn = s["snapshot"]
        rid = next((t for t in sn.get("tags") or [] if t.startswith("r")), None)
        if rid is None:
            continue
        live[rid] = (sn["hostname"], sn["time_unix"], s["id"])
        committed.setdefault(rid, {"host": sn["hostname"], "time": sn["time_unix"]})
        ever.setdefault(sn["hostname"], set()).add(sn["time_unix"])
    for rid in list(manifests):
        if rid not in live and rid in committed:
            del manifests[rid]
    return live


def sample_restore(h, rid, snap, manifest, when, skip=()):
    target = os.path.join(work, "restore")
    shutil.rmtree(target, ignore_errors=True)
    p = h.capsule(when, "restore", snap, "--target", target, label="restore")
    if p.wait() == 14:
        # The store was out for longer than a run waits: once it is back.
        for _ in range(300):
            if not store.any_out():
                break
            time.sleep(0.5)
        shutil.rmtree(target, ignore_errors=True)
        p = h.capsule(when, "restore", snap, "--target", target, label="restore")
        p.wait()
    if p.code != 0:
        problems.append(f"{rid} ({h.name}): restore exited {p.code}: {p.stderr.strip()[-300:]}")
        return False
    why = tree_matches(os.path.join(target, h.src.root.lstrip("/")), manifest, skip)
    shutil.rmtree(target, ignore_errors=True)
    if why:
        problems.append(f"{rid} ({h.name}): LOST: the restore differs from the source: {why}")
    return why is None


def fill(path):
    """Fills the file system at path; returns the filler to remove."""
    filler = os.path.join(path, "filler")
    # Unbuffered: a buffered file keeps what a short write left over and
    # raises ENOSPC again when it is closed.
    block = b"\0" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(1 << 16):
            try:
                if os.write(fd, block) == 0:
                    break
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def backup(h, when, step, rid, env_when, label="backup", trace=None):
    traced = ["--trace-requests", trace] if trace else []
    return Proc([A.capsule, "--profile", h.name, *traced, "--json", "backup", "--host", h.name,
                 "--tag", rid], h.env(env_when), label)


def request_kinds(trace):
    """A run's requests by operation and top-level prefix, from its trace:
    "get:index=7 list:snapshots=1 ..." (what grows when requests do)."""
    counts = {}
    try:
        with open(trace) as f:
            next(f, None)
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) < 6:
                    continue
                name = cols[5].split(PREFIX + "/", 1)[-1]
                key = f"{cols[2]}:{name.split('/', 1)[0] if '/' in name else name}"
                counts[key] = counts.get(key, 0) + 1
        os.remove(trace)
    except OSError:
        return ""
    return " ".join(f"{k}={n}" for k, n in sorted(counts.items()))


LEASE = 3600  # capsule's session lease (capsule_engine::session::LEASE_SECS)


def job(h, when, *args):
    # A waiting prune's clock is a file, moved on once the step's backups end.
    clock = os.path.join(work, "prune-clock") if "--wait" in args else None
    return h.capsule(when, "--json", *args, label=" ".join(args), clock=clock)


init = hosts[0].capsule(steps[0], "init", label="init")
if init.wait() != 0:
    sys.exit(f"init failed: {init.stderr}")
t_start = time.monotonic()
pending_store = []
for s, when in enumerate(steps):
    day = (when - START) // D
    awake = [h for h in hosts if h.awake(when)]
    my_faults = plan.get(s, [])
    for f in my_faults:
        f["when"] = when
        faults.append(f)
    hourly_day = day in hourly_days
    job_step = (when % D) // H == (3 if hourly_day else 20)
    # Before the day's forget: the listing that sees every snapshot made
    # since the last one.
    if job_step:
        live = listing(when)
        if live is not None:
            by = {}
            for hn, t, _ in live.values():
                by.setdefault(hn, []).append(when - t)
            ages = [a for v in by.values() for a in v]
            tiers.append((when, sum(a <= D for a in ages), sum(D < a <= 30 * D for a in ages),
                          sum(a > 30 * D for a in ages)))
    # The shared library grows now and then: every host has the new photos.
    if rng.random() < 0.004 * (24 if not hourly_day else 1):
        names = library.add(rng.randrange(5, 20))
        for h in hosts:
            h.src.library_added(names)
    procs = []   # (kind, host, proc, rid, extra)
    timers = []
    # Jobs the daemon of the desktop (always on) would start now.
    jobs = []
    if job_step:
        jobs.append("forget")
        if day % 7 == 6:
            jobs.append("prune")
        if day % 7 == 3:
            jobs.append("check")
        if day % 30 == 10:
            jobs.append("check-subset")
    if s in read_data_steps:
        jobs.append("check-read-data")
    for f in my_faults:
        extra = {"kill-prune": "prune", "kill-check": "check", "kill-forget": "forget",
                 "node-kill-prune": "prune"}.get(f["kind"])
        if extra and extra not in jobs:
            jobs.append(extra)
    job_args = {"forget": ["forget"], "prune": ["prune", "--wait"], "check": ["check"],
                "check-subset": ["check", "--read-data-subset", "next/12"],
                "check-read-data": ["check", "--read-data"]}
    for j in jobs:
        p = job(hosts[0], when, *job_args[j])
        procs.append((j, hosts[0], p, None, {}))
        family = j.split("-")[0]  # check-subset and check-read-data are checks
        f = next((f for f in my_faults if f["kind"] == f"kill-{family}" and "target" not in f), None)
        if f:
            f["target"] = j
            timers.append(threading.Timer(f["delay"] * 2, p.kill))
    # Store faults, one at a time (a busy store puts them off).
    pending_store += [f for f in my_faults if f["kind"] in
                      ("node-kill", "link-down", "node-kill-prune", "drive-wipe")]
    if (pending_store and A.store_wait_steps and store.busy()
            and s - pending_store[0]["step"] >= A.store_wait_steps):
        # Put off for long enough: wait for the store to heal rather than
        # leave the fault out (the wait is listed with it).
        pending_store[0]["waited"] = round(store.wait_calm(300), 1)
    if pending_store and not store.busy():
        f = pending_store.pop(0)
        f["applied_at"] = when
        if f["kind"] == "drive-wipe":
            store.wipe(f["node"], 1 + (f["step"] % 2))
        elif f["kind"] == "link-down":
            timers.append(threading.Timer(f["delay"], store.cut, args=(f["node"], f["secs"])))
        else:
            timers.append(threading.Timer(f["delay"], store.kill, args=(f["node"], f["secs"])))
    # The backups of the hosts awake now.
    changers = {}
    for h in awake:
        hf = [f for f in my_faults if f.get("host") == h.i and f["kind"] in fleet_faults.HOST_KINDS]
        kinds = {f["kind"] for f in hf}
        hours = 24 if h.last_when is None else max(1, (when - h.last_when) // H)
        h.src.change(hours)
        if "replaced" in kinds:
            subprocess.run(["sh", "-c", f'rm -rf "{h.cache}"/* "{h.state}"'], check=True)
        filler = fill(h.cache) if "cache-full" in kinds else None
        jump = next((f["jump"] for f in hf if f["kind"] == "clock-jump"), 0)
        rid = run_id()
        stop = threading.Event()
        change = None
        if h.rng.random() < 0.03:
            change = fleet_model.changing_while_read(h.src, h.rng, stop)
        trace = (os.path.join(work, f"trace-{rid}.tsv")
                 if A.trace_hourly and hourly_day else None)
        p = backup(h, when, s, rid, when + jump, trace=trace)
        if change:
            th = threading.Thread(target=change[3])
            th.start()
            changers[rid] = (change, stop, th)
        procs.append(("backup", h, p, rid, {"faults": sorted(kinds), "filler": filler,
                                            "jump": jump, "trace": trace}))
        if "kill-backup" in kinds:
            t = threading.Timer(hf[0]["delay"] / 1.5 * h.last_secs, p.kill)
            timers.append(t)
        if "two-at-once" in kinds:
            rid2 = run_id()
            procs.append(("backup", h, backup(h, when, s, rid2, when, "second"), rid2,
                          {"faults": ["two-at-once"], "second": True}))
        h.last_when = when
    for t in timers:
        t.start()
    # Wait, stopping each changer when its run ends; a waiting prune last,
    # its clock moved past the lease of whatever this step killed (what an
    # hour of waiting would do).
    # A killed run whose clock ran ahead (a clock-jump fault) left a session
    # dated in the future: its lease runs out only once the prune's clock
    # passes that date (by the destination's clock it would after an hour,
    # but the store's clock is real time, an hour here too), so the prune's
    # clock moves past the furthest such session still held.
    for kind, h, p, rid, extra in sorted(procs, key=lambda r: r[0] == "prune"):
        if kind == "prune" and p.code is None:
            with open(os.path.join(work, "prune-clock"), "w") as f:
                f.write(str(max([when] + held_ahead) + LEASE + 300))
        p.wait()
        if kind == "backup" and p.code == -9 and extra.get("jump", 0) > 0:
            held_ahead.append(when + extra["jump"])
        if kind == "prune" and p.code == 0:
            # Revoked by it (past their lease by its clock), or ended.
            held_ahead.clear()
        if rid in changers:
            (rel, before, written, _), stop, th = changers[rid]
            stop.set()
            th.join()
            fleet_model.settle_changed(h.src, rel, before, written)
            extra["changed"] = rel
    for t in timers:
        t.join()
    # Record what each did.
    for kind, h, p, rid, extra in procs:
        if extra.get("filler"):
            os.remove(extra["filler"])
        v = p.json() if kind == "backup" else None
        dest = (v or {}).get("destination") or {}
        row = {"step": s, "when": when, "host": h.name, "kind": kind, "exit": p.code,
               "secs": round(p.secs, 3), "requests": dest.get("requests", ""),
               "bytes_up": dest.get("bytes_up", ""), "peak_rss_kib": p.rss_kib,
               "faults": "+".join(extra.get("faults", [])), "run": rid or "",
               "hourly": int(hourly_day), "store_out": int(store.any_out()),
               "cache_kib": cache_kib(h.cache)}
        if extra.get("trace"):
            row["req_kinds"] = request_kinds(extra["trace"])
        runs.append(row)
        if kind == "backup" and p.code == 0:
            h.last_secs = p.secs
        if kind != "backup":
            if p.code == 12:
                # The whole report beside the outputs: the summary keeps a
                # tail only, and the store is gone once the run ends.
                keep = os.path.join(A.out, f"damage-step{s}-{kind}.txt")
                with open(keep, "w") as fh:
                    fh.write(f"step {s} day {day} store_out {int(store.any_out())}\n"
                             f"{p.stdout}\n--- stderr\n{p.stderr}\n")
                problems.append(f"step {s}: {kind} found damage (all of it in {os.path.basename(keep)}): "
                                f"{p.stdout.strip()[-600:]} {p.stderr.strip()[-600:]}")
            elif p.code not in (0, -9, 14):
                row["note"] = p.stderr.strip()[-200:]
            gone = ((p.json() or {}).get("report") or {}).get("index_files_gone") or []
            if kind.startswith("check") and p.code == 0 and gone:
                # Not damage (every snapshot's blobs were found): the
                # store's own inconsistency, kept beside the outputs.
                keep = os.path.join(A.out, f"store-report-step{s}-{kind}.txt")
                with open(keep, "w") as fh:
                    fh.write(f"step {s} day {day} store_out {int(store.any_out())}\n"
                             f"{p.stdout}\n--- stderr\n{p.stderr}\n")
                store_reports.append((s, day, gone))
            continue
        manifest = h.src.manifest()
        if p.code in (0, 3) or p.code == -9:
            manifests[rid] = manifest
        if p.code in (0, 3) and v:
            committed[rid] = {"host": h.name}
            files = (v.get("summary") or {}).get("files")
            if p.code == 0 and files is not None and files != len(manifest):
                problems.append(f"{rid} ({h.name}): exit 0 with {files} files of {len(manifest)}")
            if p.code == 3 and not extra.get("changed"):
                problems.append(f"{rid} ({h.name}): exit 3 without a file changing: {p.stderr.strip()[-300:]}")
            if p.code == 0 or extra.get("changed"):
                # Half the runs a fault of their own hit; a fifth of those
                # during a store outage; a sample of the rest.
                chance = 0.5 if extra.get("faults") else 0.2 if row["store_out"] else A.sample
                if h.rng.random() < chance:
                    skip = (extra["changed"],) if p.code == 3 else ()
                    row["sampled"] = 1
                    sample_restore(h, rid, v["snapshot_id"], manifest, when, skip)
        elif p.code in (2, 10, 11):
            problems.append(f"{rid} ({h.name}): exit {p.code}: {p.stderr.strip()[-300:]}")
        elif p.code not in (-9, 14, 22, 16):
            row["note"] = p.stderr.strip()[-300:]
    for h in hosts:
        fleet_model.fresh(h.src.files)
    if len(problems) > 20:
        log("more than 20 problems: the year stops here")
        break
    if s % 200 == 0:
        log(f"step {s}/{len(steps)} day {day}: {len(runs)} runs, {len(faults)} faults, "
            f"{len(problems)} problems, {time.monotonic() - t_start:.0f} s")
    # After a prune: what the store holds against what the kept snapshots hold.
    if any(k == "prune" and p.code == 0 for k, _, p, _, _ in procs):
        live = listing(when)
        stored = s3_stored()
        if live is not None and stored is not None:
            kept = [manifests[r] for r in live if r in manifests]
            storage.append((when, stored, fleet_model.distinct_bytes(kept), len(live),
                            in_use(when)))

# -- the year's end: every node back, then the checks
store.settle()
for f in pending_store:
    f["skipped"] = "the store was never free again"
now = steps[-1] + H // 2
year_secs = time.monotonic() - t_start
final = job(hosts[0], now, "forget")
final.wait()
if final.code != 0:
    problems.append(f"the final forget exited {final.code}: {final.stderr.strip()[-400:]}")
prune = job(hosts[0], now, "prune")
prune.wait()
live = listing(now) or {}
stored = s3_stored()
kept_manifests = [manifests[r] for r in live if r in manifests]
if stored is not None:
    storage.append((now, stored, fleet_model.distinct_bytes(kept_manifests), len(live),
                    in_use(now)))
missing = [r for r in live if r not in manifests]
if missing:
    problems.append(f"{len(missing)} live snapshots of runs without a manifest: {missing[:5]}")
# The kept set of every host is its Time Machine schedule.
policy = {}
for h in hosts:
    kept = sorted(t for hn, t, _ in live.values() if hn == h.name)
    expected = sorted(timemachine_expected(ever.get(h.name, set()), now))
    policy[h.name] = (len(kept), len(expected), kept == expected)
    if kept != expected:
        extra = sorted(set(kept) - set(expected))[:3]
        gone = sorted(set(expected) - set(kept))[:3]
        problems.append(f"{h.name}: kept {len(kept)} snapshots, the schedule keeps {len(expected)} "
                        f"(kept beyond it: {extra}; missing: {gone})")
# Sampled kept snapshots of every host restore to their manifests.
end_restores = 0
for h in hosts:
    mine = sorted((t, r, sid) for r, (hn, t, sid) in live.items() if hn == h.name)
    for t, r, sid in {mine[0], mine[len(mine) // 2], mine[-1]} if mine else ():
        end_restores += sample_restore(h, r, sid, manifests[r], now)
check = job(hosts[1 % len(hosts)], now, "--no-cache", "check", "--read-data")
check.wait()
if check.code != 0:
    problems.append(f"the final check --read-data exited {check.code}: {check.stdout[-800:]} {check.stderr[-800:]}")


# The newest snapshot of every host restored, against the same tree from a
# fresh repository (median of three each, in turns).
def restore_secs(h, repo_args, sid, conns=None):
    """Seconds of one restore and what it fetched (requests, bytes, packs)."""
    target = os.path.join(work, "restore")
    shutil.rmtree(target, ignore_errors=True)
    e = dict(h.env(now), CAPSULE_PASSWORD="fleet")
    more = ["--connections", str(conns)] if conns else []
    cpu0 = server_cpu()
    p = Proc([A.capsule, *repo_args, *more, "--json", "restore", sid, "--target", target], e,
             "restore")
    p.wait()
    cpu = server_cpu() - cpu0
    shutil.rmtree(target, ignore_errors=True)
    if p.code != 0:
        log(f"{h.name}: restore for the speed check exited {p.code}: {p.stderr[-300:]}")
        return None
    f = (p.json() or {}).get("fetch", {})
    # The servers' CPU seconds beside the wall seconds: a store whose
    # core(s) are busy the whole restore bounds it, whatever the client does.
    return (p.secs, f.get("requests", 0), f.get("bytes_fetched", 0), f.get("packs", 0),
            f.get("bytes_needed", 0), (f.get("bound") or {}).get("kind", ""), cpu)


speed = []
speed16 = []
control = []
fresh_repo = ["--repo", f"s3+http://{NODES[0]}/{BUCKET}/{PREFIX}-fresh", "--cache-dir",
              os.path.join(work, "fresh-cache")]
fresh_env_host = hosts[0]
if Proc([A.capsule, *fresh_repo, "init"], dict(hosts[0].env(now), CAPSULE_PASSWORD="fleet"),
        "init").wait() == 0:
    for h in hosts:
        newest = max(((t, sid) for hn, t, sid in live.values() if hn == h.name), default=None)
        e = dict(h.env(now), CAPSULE_PASSWORD="fleet")
        b = Proc([A.capsule, *fresh_repo, "--json", "backup", "--host", h.name, h.src.root], e, "fresh")
        if newest is None or b.wait() != 0:
            log(f"{h.name}: no restore speed: backup to a fresh repository exited {b.code}: {b.stderr[-300:]}")
            continue
        fsid = b.json()["snapshot_id"]
        old, new = [], []
        for _ in range(3):
            old.append(restore_secs(h, ["--profile", h.name], newest[1]))
            new.append(restore_secs(h, [*fresh_repo], fsid))
        if None not in old and None not in new:
            # The median run by time, with what it fetched.
            mo = sorted(old)[1]
            mn = sorted(new)[1]
            speed.append((h.name, mo[0], mn[0], mo[1:], mn[1:]))
            log(f"{h.name}: restore {mo} (year-old) against {mn} (fresh)")
        # The same with twice the reads in flight: is the year-old
        # repository's extra cost round trips that more of them hide?
        old, new = [], []
        for _ in range(3):
            old.append(restore_secs(h, ["--profile", h.name], newest[1], 16))
            new.append(restore_secs(h, [*fresh_repo], fsid, 16))
        if None not in old and None not in new:
            mo, mn = sorted(old)[1], sorted(new)[1]
            speed16.append((h.name, mo[0], mn[0], mo[1:], mn[1:]))
    # Per-run cost against the repository's age alone: the same sources and
    # the same hour of changes, backed up to the year-old repository (each
    # host's profile and cache) and then to the fresh one, three rounds;
    # the month-12 sources are larger than month 2's, and this separates
    # what the source costs from what the repository's age does.
    # Each host a cache of its own for the fresh repository too, as it has
    # for the year-old one (a cache shared by all hosts holds what the
    # others wrote, which a host's own cache must fetch), warmed by a run
    # that changes nothing.
    def fresh_of(h):
        return ["--repo", fresh_repo[1], "--cache-dir", os.path.join(work, f"fresh-cache-{h.name}")]
    for h in hosts:
        Proc([A.capsule, *fresh_of(h), "backup", "-q", "--host", h.name, h.src.root],
             dict(h.env(now), CAPSULE_PASSWORD="fleet"), "warm").wait()
    for rnd in range(3):
        later = now + (rnd + 1) * H
        for h in hosts:
            h.src.change(1)
            e = dict(h.env(later), CAPSULE_PASSWORD="fleet")
            a = Proc([A.capsule, "--profile", h.name, "--json", "backup", "--host", h.name],
                     h.env(later), "control-old")
            a.wait()
            b = Proc([A.capsule, *fresh_of(h), "--json", "backup", "--host", h.name, h.src.root],
                     e, "control-fresh")
            b.wait()
            if a.code == 0 and b.code == 0:
                ra = ((a.json() or {}).get("destination") or {}).get("requests", 0)
                rb = ((b.json() or {}).get("destination") or {}).get("requests", 0)
                control.append((h.name, a.secs, b.secs, ra, rb, a.rss_kib, b.rss_kib))
            else:
                log(f"{h.name}: control backups exited {a.code} / {b.code}: "
                    f"{a.stderr[-200:]} {b.stderr[-200:]}")
            fleet_model.fresh(h.src.files)

report(A, out=A.out, runs=runs, faults=faults, storage=storage, tiers=tiers, policy=policy,
       problems=problems, speed=speed, speed16=speed16, control=control, check_code=check.code, end_restores=end_restores,
       year_secs=year_secs, steps=steps, start=START, prefix=PREFIX, store_reports=store_reports)
unmount()
shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if problems else 0)
