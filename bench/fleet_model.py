"""A person's files changing over a year: the source model of bench/fleet_year.py.

Each host's source holds documents (edited, added, deleted, their folders
renamed and moved), photos arriving in bursts (and a few deleted), one large
file rewritten in place (a VM image on the desktop, a mailbox appended to and
compacted on the laptops) and the household's shared photo library, the same
files on every host (hard links to one pool here, so the disk holds it once).

Every change goes through the model, so it keeps a manifest of the source
(path -> size and SHA-256, and for the large file the SHA-256 of each 1 MiB
block) without reading the tree again. The manifest is the ground truth a
restore is compared with, made without capsule's code.
"""
import hashlib
import os
import random

MIB = 1 << 20
BLOCK = MIB  # the chunker's average size: what a rewritten region costs at least


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Entry:
    """One file of a manifest: its size, its hash, and for a large file the
    hashes of its 1 MiB blocks (what the distinct data is counted in).
    `maybe` holds the other contents a file could have been read as, when it
    changed while a run read it."""

    __slots__ = ("size", "sha", "blocks", "maybe")

    def __init__(self, size, digest, blocks=None, maybe=None):
        self.size, self.sha, self.blocks, self.maybe = size, digest, blocks, maybe

    def accepts(self, digest):
        return digest == self.sha or (self.maybe is not None and digest in self.maybe)


class Library:
    """The household's shared photo library: a pool of files every host links."""

    def __init__(self, root, rng):
        self.root, self.rng, self.files, self.serial = root, rng, {}, 0
        os.makedirs(root, exist_ok=True)

    def add(self, n, size_lo=100_000, size_hi=300_000):
        new = []
        for _ in range(n):
            name = f"lib{self.serial:05}.jpg"
            self.serial += 1
            data = self.rng.randbytes(self.rng.randrange(size_lo, size_hi))
            with open(os.path.join(self.root, name), "wb") as f:
                f.write(data)
            self.files[name] = Entry(len(data), sha(data))
            new.append(name)
        return new


class Source:
    """One host's files."""

    def __init__(self, root, rng, library, desktop):
        self.root, self.rng, self.library, self.desktop = root, rng, library, desktop
        self.files = {}  # relative path -> Entry
        self.serial = 0
        self.folders = [f"docs/p{k}" for k in range(6)]
        self.large = "vm/disk.img" if desktop else "mail/inbox.mbox"
        for d in self.folders + ["photos", "library", os.path.dirname(self.large)]:
            os.makedirs(self.path(d), exist_ok=True)
        for _ in range(150):
            self.write(f"{rng.choice(self.folders)}/d{self.next()}.txt",
                       rng.randbytes(rng.randrange(4_000, 64_000)))
        self.burst(40)
        for name in library.files:
            self.link(name)
        size = 48 * MIB if desktop else 8 * MIB
        self.write(self.large, rng.randbytes(size))

    def next(self):
        self.serial += 1
        return self.serial

    def path(self, rel):
        return os.path.join(self.root, rel)

    def write(self, rel, data):
        with open(self.path(rel), "wb") as f:
            f.write(data)
        self.files[rel] = self.entry(rel, data)

    def entry(self, rel, data):
        if rel == self.large:
            blocks = tuple(sha(data[o:o + BLOCK]) for o in range(0, len(data), BLOCK))
            return Entry(len(data), sha(data), blocks)
        return Entry(len(data), sha(data))

    def link(self, name):
        rel = f"library/{name}"
        os.link(os.path.join(self.library.root, name), self.path(rel))
        self.files[rel] = self.library.files[name]

    def burst(self, n):
        month = f"photos/b{self.next()}"
        os.makedirs(self.path(month), exist_ok=True)
        for _ in range(n):
            self.write(f"{month}/img{self.next()}.jpg",
                       self.rng.randbytes(self.rng.randrange(50_000, 400_000)))

    def docs(self):
        return [p for p in self.files if p.startswith("docs/")]

    def change(self, hours):
        """What a person does in `hours` awake hours (at most a day's worth)."""
        rng, hours = self.rng, min(hours, 16)
        docs = self.docs()
        for _ in range(rng.randrange(1, 2 + hours)):
            if docs:
                self.write(rng.choice(docs), rng.randbytes(rng.randrange(4_000, 64_000)))
        for _ in range(rng.randrange(0, 1 + hours // 2)):
            self.write(f"{rng.choice(self.folders)}/d{self.next()}.txt",
                       rng.randbytes(rng.randrange(4_000, 64_000)))
        if docs and rng.random() < 0.04 * hours:
            gone = rng.choice(docs)
            os.remove(self.path(gone))
            del self.files[gone]
        if rng.random() < 0.02 * hours:
            self.burst(rng.randrange(5, 16))
        photos = [p for p in self.files if p.startswith("photos/")]
        if photos and rng.random() < 0.01 * hours:
            gone = rng.choice(photos)
            os.remove(self.path(gone))
            del self.files[gone]
        if rng.random() < 0.01 * hours:
            self.rename_folder()
        self.rewrite_large(hours)

    def rename_folder(self):
        """A folder renamed, or moved into (or out of) the archive."""
        rng = self.rng
        old = rng.choice(self.folders)
        base = os.path.basename(old)
        new = f"docs/{base}-{self.next()}" if old.startswith("docs/archive/") or rng.random() < 0.5 \
            else f"docs/archive/{base}"
        os.makedirs(os.path.dirname(self.path(new)), exist_ok=True)
        os.rename(self.path(old), self.path(new))
        self.folders[self.folders.index(old)] = new
        for rel in [p for p in self.files if p.startswith(old + "/")]:
            self.files[new + rel[len(old):]] = self.files.pop(rel)

    def rewrite_large(self, hours):
        """The VM image: a few 1 MiB extents rewritten in place. The mailbox:
        mail appended, and now and then compacted (its middle rewritten)."""
        rng, p = self.rng, self.path(self.large)
        with open(p, "r+b") as f:
            if self.desktop:
                if rng.random() < 0.5:
                    size = os.fstat(f.fileno()).st_size
                    for _ in range(rng.randrange(1, 2 + min(hours, 3))):
                        f.seek(rng.randrange(size // BLOCK) * BLOCK)
                        f.write(rng.randbytes(BLOCK))
            else:
                f.seek(0, os.SEEK_END)
                f.write(rng.randbytes(rng.randrange(10_000, 40_000) * min(hours, 4)))
                if rng.random() < 0.02:
                    size = f.tell()
                    f.seek(rng.randrange(size // 2))
                    f.write(rng.randbytes(min(2 * MIB, size // 4)))
        with open(p, "rb") as f:
            self.files[self.large] = self.entry(self.large, f.read())

    def library_added(self, names):
        for name in names:
            self.link(name)

    def manifest(self):
        return dict(self.files)


def distinct_bytes(manifests):
    """The content the given manifests hold, each distinct piece once: whole
    files by their hash, the large files by their 1 MiB blocks."""
    seen, total = set(), 0
    for m in manifests:
        for e in m.values():
            if e.blocks is not None:
                for k, b in enumerate(e.blocks):
                    if b not in seen:
                        seen.add(b)
                        total += min(BLOCK, e.size - k * BLOCK)
            elif e.sha not in seen:
                seen.add(e.sha)
                total += e.size
    return total


def changing_while_read(src, rng, stop):
    """A file written in place, again and again, while a run reads the tree
    (a document being saved): returns (path, pre-run entry, contents
    written). The caller stops it with `stop` (a threading.Event)."""
    docs = src.docs()
    rel = rng.choice(docs)
    before = src.files[rel]
    written = []
    # Seeded contents, so the run is the same whatever the timing.
    versions = [rng.randbytes(rng.randrange(4_000, 64_000)) for _ in range(40)]

    def body():
        for data in versions:
            if stop.is_set():
                break
            with open(src.path(rel), "r+b") as f:
                f.truncate(0)
                f.write(data)
            written.append(data)
            stop.wait(0.02)
    return rel, before, written, body


def settle_changed(src, rel, before, written):
    """After the run: the file's entry is its last content, and what a run
    may have read is any content it had while the run ran."""
    last = written[-1] if written else None
    if last is None:
        return
    e = src.entry(rel, last)
    e.maybe = {before.sha} | {sha(d) for d in written}
    src.files[rel] = e


def fresh(entry_map):
    """A manifest for the run after: ambiguity only lasts for one run."""
    for rel, e in list(entry_map.items()):
        if e.maybe is not None:
            entry_map[rel] = Entry(e.size, e.sha, e.blocks)


__all__ = ["Source", "Library", "Entry", "distinct_bytes", "changing_while_read",
           "settle_changed", "fresh", "random"]
