"""The distributed store scripts/cluster.sh started, as its cluster.env and
the calling script (CLUSTER_CTL) describe it: shared by bench/cluster.py and
bench/fleet_year.py."""
import os

CTL = os.environ["CLUSTER_CTL"]
CDIR = os.environ["CAPSULE_TEST_CLUSTER_DIR"]
NODES = os.environ["CAPSULE_TEST_CLUSTER_NODES"].split()
KEY = os.environ["CAPSULE_TEST_CLUSTER_KEY"]
SECRET = os.environ["CAPSULE_TEST_CLUSTER_SECRET"]
BUCKET = os.environ["CAPSULE_TEST_CLUSTER"].rsplit("/", 1)[1]
