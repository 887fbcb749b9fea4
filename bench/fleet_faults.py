"""The seeded fault schedule of bench/fleet_year.py, and the hands that
cause faults on the store (a node killed, its link cut, a drive wiped).

The schedule is drawn before the year starts from the seed alone: which
step, which kind, which host or node, after how long. So one seed gives the
same faults on any machine; only what they hit (how far a killed run got)
depends on timing, and the output lists what each did.
"""
import os
import subprocess
import threading
import time

# Kinds, with their share of the faults. Store outages (a node killed, a
# link cut) cost their length in wall time, so they are rarer than faults
# of one run.
KINDS = [
    ("kill-backup", 0.43),     # a client SIGKILLed at a random point of a backup
    ("two-at-once", 0.13),     # a second run of the same host started beside the first
    ("cache-full", 0.11),      # the client's disk (its cache) full for the run
    ("clock-jump", 0.104),     # the client's clock hours or days ahead or behind
    ("kill-prune", 0.07),      # a prune SIGKILLed at a random point
    ("kill-check", 0.07),      # a check SIGKILLed at a random point
    ("kill-forget", 0.04),     # a forget SIGKILLed at a random point
    # The store heals a minute after a node is back and three after a
    # drive is replaced before the next store fault (Store.calm_at): a
    # compressed year of about an hour has room for some thirty of them.
    ("node-kill", 0.012),      # a store node SIGKILLed, back after seconds to a minute
    ("link-down", 0.012),      # a store node's network link cut, restored later
    ("node-kill-prune", 0.004),  # a store node SIGKILLed while a prune runs
    ("drive-wipe", 0.004),     # a drive emptied (replaced); the store heals it
    ("replaced", 0.014),       # a machine replaced: its cache and records gone
]
HOST_KINDS = {"kill-backup", "two-at-once", "cache-full", "clock-jump", "replaced"}


def schedule(rng, steps, faults, awake):
    """`faults` faults over `steps` (a list of step times): {step: [fault]}.

    A fault is a dict: kind, host (for a host's fault: one awake then),
    node, delay (seconds into the step), and for outages their length."""
    kinds = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    out = {}
    # Every kind at least once, the rest by their shares.
    drawn = kinds[:faults] + rng.choices(kinds, weights, k=max(0, faults - len(kinds)))
    for kind in drawn:
        for _attempt in range(100):
            s = rng.randrange(1, len(steps))
            hosts = awake(steps[s])
            if kind in HOST_KINDS and not hosts:
                continue
            # One store outage at a time: erasure coding survives one node
            # of four, and the schedule never takes two.
            if kind.startswith(("node", "link", "drive")) and any(
                    f["kind"].startswith(("node", "link", "drive"))
                    for t in range(max(0, s - 3), s + 4) for f in out.get(t, [])):
                continue
            break
        f = {"kind": kind, "step": s, "host": rng.choice(hosts) if hosts else None,
             "node": rng.randrange(1, 5), "delay": rng.uniform(0.0, 1.5)}
        if kind in ("node-kill", "link-down", "node-kill-prune"):
            # Mostly seconds; one in twenty longer than a run waits (60 s):
            # those runs give up (exit 14) and the next catches up.
            f["secs"] = rng.uniform(65, 80) if rng.random() < 0.05 else rng.uniform(2, 15)
        if kind == "clock-jump":
            hours = rng.choice([-1, 1]) * rng.uniform(2, 120)
            f["jump"] = int(hours * 3600) + 1800
        out.setdefault(s, []).append(f)
    return out


# Seconds after a node is back, and after a drive is replaced, before the
# next store fault (see Store.calm_at).
NODE_HEAL_SECS = 60
DRIVE_HEAL_SECS = 180


class Store:
    """The cluster's hands: scripts/cluster.sh for nodes and drives, `ip`
    in the node's namespace for its link."""

    def __init__(self, ctl, cdir, pin=None):
        self.ctl, self.cdir, self.pin = ctl, cdir, pin
        names = dict(line.strip().split("=", 1)
                     for line in open(os.path.join(cdir, "cluster", "names")) if "=" in line)
        self.tag = names.get("CAPSULE_CLUSTER_TAG", "capsule")
        self.out = set()
        self.lock = threading.Lock()
        self.timers = []
        # Until then the store is healing, and no other store fault is
        # applied: a node back heals the objects written while it was away
        # (a minute), a replaced drive is rebuilt from the others (longer).
        # Without it, a compressed year once stacked two node outages and
        # three drive wipes (both drives of one node) inside a minute, and
        # objects written during the outages, with six shards of eight,
        # lost a third: the store's loss, more than its parity (EC:4)
        # tolerates, and not a fault a household's store meets.
        self.calm_at = 0.0

    def _healing(self, secs):
        with self.lock:
            self.calm_at = max(self.calm_at, time.monotonic() + secs)

    def run(self, *args):
        subprocess.run([self.ctl, *map(str, args), self.cdir], check=True,
                       capture_output=True)

    def _link(self, node, state):
        subprocess.run(["ip", "-n", f"{self.tag}-n{node}", "link", "set",
                        f"{self.tag}-v{node}n", state], check=True)

    def kill(self, node, secs):
        with self.lock:
            self.out.add(node)
        self.run("kill", node)
        self._later(secs, self._restart, node)

    def _restart(self, node):
        self.run("restart", node)
        if self.pin:
            self.pin()
        with self.lock:
            self.out.discard(node)
        self._healing(NODE_HEAL_SECS)

    def cut(self, node, secs):
        with self.lock:
            self.out.add(node)
        self._link(node, "down")
        self._later(secs, self._restore, node)

    def _restore(self, node):
        self._link(node, "up")
        with self.lock:
            self.out.discard(node)
        self._healing(NODE_HEAL_SECS)

    def wipe(self, node, drive):
        self.run("wipe", node, drive)
        self._healing(DRIVE_HEAL_SECS)

    def _later(self, secs, fn, node):
        t = threading.Timer(secs, fn, args=(node,))
        t.start()
        self.timers.append(t)

    def any_out(self):
        """A node down or cut off now."""
        with self.lock:
            return bool(self.out)

    def busy(self):
        with self.lock:
            return bool(self.out) or time.monotonic() < self.calm_at

    def wait_calm(self, limit):
        """Waits until the store is free for a fault (at most `limit`
        seconds); returns the seconds waited."""
        t0 = time.monotonic()
        for _ in range(int(limit * 2)):
            if not self.busy():
                break
            time.sleep(0.5)
        return time.monotonic() - t0

    def settle(self):
        """Every node back (timers run out), before the year's checks."""
        for t in self.timers:
            t.join()
        self.timers.clear()

    def up_node(self):
        """A node that is up now, for requests made from outside capsule."""
        with self.lock:
            return next(n for n in range(1, 5) if n not in self.out)
