#!/usr/bin/env python3
"""Many machines, one distributed store: the body of bench/cluster.sh.

32 capsule processes (each its own host name, cache and source tree, 80 %
of their data shared) back up in rounds (test clock, 6 h apart) into one
repository on MinIO in distributed mode, each through its own node, while a
33rd runs `forget --policy timemachine --prune` in a loop. Faults: a node
killed (SIGKILL) at the start of round 2 and back 20 s later; a client
paused (SIGSTOP) in round 3 across two prunes; a drive emptied before round
4. At the end: check --read-data, a restore of every host's newest
snapshot compared with its source, stored bytes against the distinct data,
a client's no-change run beside the same run in a repository of its own,
and round 1's throughput against a plain parallel PUT of the same bytes.
Prints a Markdown table. Run through bench/cluster.sh, which starts the
cluster and passes its coordinates in the environment.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

NOW = 1_795_435_200  # 2026-11-22 12:00 UTC, as the tests' clock
H = 3600


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--mib", type=int, default=20, help="source size per client")
    p.add_argument("--shared", type=float, default=0.8)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--uplink", type=int, default=0, metavar="MBIT",
                   help="shape the clients' one way to the store to MBIT Mbit/s "
                        "(a household's uplink; tbf on the bridge)")
    p.add_argument("--alone", action="store_true",
                   help="back up with --alone: first backups do not meet (no claims)")
    return p.parse_args()


A = parse()
CAPSULE = os.environ["CAPSULE_BIN"]
from cluster_env import BUCKET, CDIR, CTL, KEY, NODES, SECRET  # noqa: E402
BRIDGE = os.environ.get("CLUSTER_BRIDGE", "capbench-br0")
work = tempfile.mkdtemp(prefix="capsule-cluster-bench.")
clock = os.path.join(work, "clock")
client_cpu = []


def log(*a):
    print("cluster-bench:", *a, file=sys.stderr, flush=True)


def ctl(*args):
    subprocess.run([CTL, *map(str, args), CDIR], check=True, capture_output=True)


def signed(service, method, path, *extra):
    r = subprocess.run(
        ["curl", "-sS", "-f", "-X", method, "--aws-sigv4", f"aws:amz:us-east-1:{service}",
         "--user", f"{KEY}:{SECRET}", *extra, f"http://{NODES[0]}/{path}"],
        capture_output=True, text=True)
    return r.returncode == 0


def url(node, prefix):
    return f"s3+http://{NODES[node % len(NODES)]}/{BUCKET}/{prefix}"


def machine_env(name):
    cache = os.path.join(work, "cache-" + name)
    e = {k: v for k, v in os.environ.items() if not k.startswith("CAPSULE_")}
    e.update(CAPSULE_CACHE_DIR=cache, CAPSULE_STATE_DIR=os.path.join(cache, "state"),
             CAPSULE_PASSWORD="bench", CAPSULE_TEST_NOW="@" + clock,
             AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    return e


def capsule(node, name, prefix, *args, popen=False):
    cmd = [*client_cpu, CAPSULE, "--repo", url(node, prefix), *args]
    if popen:
        return subprocess.Popen(cmd, env=machine_env(name), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=machine_env(name), capture_output=True, text=True)


def must(r, what):
    if r.returncode != 0:
        log(f"{what} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        sys.exit(1)
    return r


def minio_pids():
    out = []
    for f in os.listdir(os.path.join(CDIR, "cluster")):
        if f.endswith(".pid"):
            out.append(open(os.path.join(CDIR, "cluster", f)).read().strip())
    return out


# -- the sources: a shared pool (hard links: one copy on this disk) and
#    each client's own files
mib = 1 << 20
shared_total = int(A.mib * A.shared * mib)
own_total = A.mib * mib - shared_total
pool = os.path.join(work, "pool")
os.makedirs(pool)
shared_files = 8
for k in range(shared_files):
    with open(os.path.join(pool, f"shared{k}"), "wb") as f:
        f.write(os.urandom(shared_total // shared_files))
srcs = []
for i in range(A.clients):
    s = os.path.join(work, f"src{i}")
    os.makedirs(os.path.join(s, "shared"))
    for k in range(shared_files):
        os.link(os.path.join(pool, f"shared{k}"), os.path.join(s, "shared", f"shared{k}"))
    for k in range(2):
        with open(os.path.join(s, f"own{k}"), "wb") as f:
            f.write(os.urandom(own_total // 2))
    srcs.append(s)
source_bytes = A.clients * A.mib * mib
log(f"{A.clients} sources of {A.mib} MiB ({A.shared:.0%} shared) in {work}")

def pin_servers():
    """The store's nodes on the last core, as a NAS has a CPU of its own."""
    if A.pin:
        for p in minio_pids():
            subprocess.run(["taskset", "-a", "-cp", str(os.cpu_count() - 1), p], capture_output=True)


if A.pin:
    last = os.cpu_count() - 1
    pin_servers()
    client_cpu = ["taskset", "-c", "0" if last == 1 else f"0-{last - 1}"]


def restart(n):
    ctl("restart", n)
    pin_servers()

# -- a household's uplink: everything the clients send to the store leaves
#    through the bridge, so one token bucket there is one shared uplink
if A.uplink:
    subprocess.run(["tc", "qdisc", "replace", "dev", BRIDGE, "root", "tbf", "rate",
                    f"{A.uplink}mbit", "burst", "256kb", "latency", "200ms"], check=True)
    log(f"uplink: {A.uplink} Mbit/s (tbf on {BRIDGE})")

# -- the store's own bound: a plain parallel PUT of the same bytes, one
#    stream per client, each through the node that client uses
signed("s3", "DELETE", "capsule-bound", "-H", "x-minio-force-delete: true")
signed("s3", "PUT", "capsule-bound")


def put_all(i):
    for root, _, files in os.walk(srcs[i]):
        for f in files:
            p = os.path.join(root, f)
            subprocess.run(
                [*client_cpu, "curl", "-sS", "-f", "-T", p, "--aws-sigv4", "aws:amz:us-east-1:s3",
                 "--user", f"{KEY}:{SECRET}",
                 f"http://{NODES[i % len(NODES)]}/capsule-bound/c{i}/{f}"], check=True)


t0 = time.monotonic()
threads = [threading.Thread(target=put_all, args=(i,)) for i in range(A.clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
bound_secs = time.monotonic() - t0
signed("s3", "DELETE", "capsule-bound", "-H", "x-minio-force-delete: true")
log(f"parallel PUT bound: {source_bytes / mib:.0f} MiB in {bound_secs:.1f} s")

# -- the rounds, with prune beside them
with open(clock, "w") as f:
    f.write(str(NOW))
must(capsule(0, "admin", "bench", "init"), "init")
stop = threading.Event()
prunes = []  # (exit code, forgotten, seconds)
prune_failures = []


def pruner():
    n = 0
    while not stop.is_set() and n < 500:
        t = time.monotonic()
        r = capsule(3, "pruner", "bench", "--json", "forget", "--policy", "timemachine",
                    "--group-by", "host", "--prune")
        n += 1
        forgotten = 0
        if r.returncode == 0:
            try:
                forgotten = len(json.loads(r.stdout)["forget"]["forgotten"] or [])
            except (ValueError, KeyError, TypeError):
                pass
        else:
            prune_failures.append(r.stderr.strip()[-1000:])
        prunes.append((r.returncode, forgotten, time.monotonic() - t))


pt = threading.Thread(target=pruner)
pt.start()
made, failed, rounds, faults = [], [], [], []
newest = [None] * A.clients
for rnd in range(A.rounds):
    with open(clock, "w") as f:
        f.write(str(NOW + rnd * 6 * H))
    if rnd > 0:
        for i, s in enumerate(srcs):
            with open(os.path.join(s, f"new{rnd}"), "wb") as f:
                f.write(os.urandom(256 << 10))
    restarter = None
    if rnd == 1:
        ctl("kill", 2)
        faults.append("node 2 killed (SIGKILL) as round 2 began, back after 20 s")
        restarter = threading.Timer(20, restart, args=(2,))
        restarter.start()
    if rnd == 3:
        ctl("wipe", 3, 1)
        faults.append("node 3's drive 1 emptied before round 4 (healed by the store)")
    t0 = time.monotonic()
    alone = ["--alone"] if A.alone else []
    procs = [capsule(i, f"m{i}", "bench", "--json", "backup", *alone, "--host", f"m{i}", srcs[i],
                     popen=True)
             for i in range(A.clients)]
    if rnd == 2:
        time.sleep(1.0)
        base = len(prunes)
        procs[0].send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 300
        while len(prunes) < base + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        procs[0].send_signal(signal.SIGCONT)
        faults.append(f"client 0 paused (SIGSTOP) in round 3 across {len(prunes) - base} prunes")
    sent, retries = 0, 0
    for i, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode != 0:
            failed.append(f"round {rnd + 1} m{i}: exit {p.returncode}: {err.strip()[-600:]}")
            continue
        v = json.loads(out)
        made.append(v["snapshot_id"])
        newest[i] = v["snapshot_id"]
        sent += v["destination"]["bytes_up"]
        retries += v["destination"]["retries"]
    secs = time.monotonic() - t0
    if restarter:
        restarter.join()
    rounds.append((secs, sent, retries))
    log(f"round {rnd + 1}: {secs:.1f} s, {sent / mib:.1f} MiB sent, {retries} retries, "
        f"{len(failed)} failed runs so far, {len(prunes)} prunes so far")
stop.set()
pt.join()

# -- nothing lost
final = [must(capsule(0, "admin", "bench", "--json", "forget", "--policy", "timemachine",
                      "--group-by", "host", "--prune"), "final prune")]
stored = json.loads(must(capsule(0, "admin", "bench", "--json", "quota", "show"), "quota").stdout)["stored"]
check = capsule(1, "admin", "bench", "--no-cache", "check", "--read-data")
restored_ok = 0
for i in range(A.clients):
    if newest[i] is None:
        continue
    target = os.path.join(work, f"restore{i}")
    r = capsule(i + 1, "admin", "bench", "restore", newest[i], "--target", target)
    if r.returncode == 0 and subprocess.run(
            ["diff", "-r", "-q", srcs[i], target + srcs[i]], capture_output=True).returncode == 0:
        restored_ok += 1
    subprocess.run(["rm", "-rf", target])
live = json.loads(must(capsule(0, "admin", "bench", "--json", "snapshots"), "snapshots").stdout)
live_ids = {s["id"] for s in (live if isinstance(live, list) else live.get("snapshots", []))}

# distinct data: the pool once, each client's own files and new files
distinct = shared_total + A.clients * (own_total + (A.rounds - 1) * (256 << 10))

# -- a no-change run with 32 hosts in the repository against one alone
def no_change(prefix, name):
    out = []
    for _ in range(3):
        t = time.monotonic()
        r = must(capsule(0, name, prefix, "--json", "backup", "--host", "m0", srcs[0]), "no-change run")
        v = json.loads(r.stdout)
        out.append((time.monotonic() - t, v["destination"]["requests"], v["destination"]["bytes_down"]))
    return (statistics.median(x[0] for x in out), statistics.median(x[1] for x in out),
            statistics.median(x[2] for x in out))


shared_nc = no_change("bench", "m0")
must(capsule(0, "alone", "alone", "init"), "init alone")
must(capsule(0, "alone", "alone", "backup", "--host", "m0", srcs[0]), "backup alone")
alone_nc = no_change("alone", "alone")

def heals():
    out = []
    for n in range(1, 5):
        try:
            for line in open(os.path.join(CDIR, "cluster", f"n{n}.log")):
                if "Healing of drive" in line and "finished" in line:
                    out.append(line.strip())
        except OSError:
            pass
    return out


# The store heals an emptied drive in the background: wait for it (at most
# two minutes), so that the report says whether it did.
deadline = time.monotonic() + 120
while not heals() and time.monotonic() < deadline:
    time.sleep(1)
heal = heals()

r1_secs, r1_sent, _ = rounds[0]
r1_distinct = shared_total + A.clients * own_total
tput = source_bytes / r1_secs / mib
bound = source_bytes / bound_secs / mib
lost = 0 if check.returncode == 0 else "check failed"
print(f"""
| | {'pinned: servers on their own core' if A.pin else 'unpinned'} |
|---|---|
| clients × rounds | {A.clients} × {A.rounds} (test clock 6 h apart), {len(prunes)} `forget --policy timemachine --prune` beside them ({sum(1 for p in prunes if p[0] == 0)} succeeded, {sum(p[1] for p in prunes)} snapshots forgotten) |
| faults | {'; '.join(faults)} |
| snapshots made / runs failed | {len(made)} / {len(failed)} |
| lost | {lost}: `check --read-data` {'clean' if check.returncode == 0 else 'FAILED'}, {restored_ok}/{A.clients} hosts' newest snapshots restored equal to their sources, {len(live_ids)} live snapshots |
| stored after prune | {stored / mib:.1f} MiB for {distinct / mib:.1f} MiB distinct ({stored / distinct:.2f}×; sources hold {source_bytes / mib:.0f} MiB before the rounds' new files) |
| round 1 (all first backups at once) | {r1_secs:.1f} s, {tput:.1f} MiB/s of source, {r1_sent / mib:.1f} MiB sent for {r1_distinct / mib:.1f} MiB distinct (**{r1_sent / r1_distinct:.2f}×**) |
| parallel PUT of the same {source_bytes / mib:.0f} MiB ({A.clients} streams) | {bound_secs:.1f} s, {bound:.1f} MiB/s |
| throughput / bound | **{tput / bound:.2f}** |
| no-change run, {A.clients} hosts vs alone (median of 3) | {shared_nc[0]:.2f} s vs {alone_nc[0]:.2f} s ({shared_nc[0] / alone_nc[0]:.2f}×); {shared_nc[1]:.0f} vs {alone_nc[1]:.0f} requests ({shared_nc[1] / max(alone_nc[1], 1):.2f}×); {shared_nc[2] / 1024:.0f} vs {alone_nc[2] / 1024:.0f} KiB read |
| drive healed | {len(heal)} heal(s) finished: {heal[-1][:120] if heal else 'none seen'} |
""")
for f in failed:
    print("failed run:", f)
for f in prune_failures[:5]:
    print("failed prune:", f)
if check.returncode != 0:
    print("check:", check.stdout[-2000:], check.stderr[-2000:])
subprocess.run(["rm", "-rf", work])
sys.exit(1 if failed or check.returncode != 0 or restored_ok != A.clients else 0)
