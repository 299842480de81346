# SPDX-License-Identifier: Apache-2.0
"""Lease leader election between processes (kube/lease.c through tests/kube/kube_elector)
against tests/fakes/fake_kube.py: one of two electors leads; SIGKILL of the holder (it just
stops renewing) hands the lease to the other once it expired; SIGTERM releases it, so the
other takes over long before a one-hour lease would expire."""
import datetime
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from harness import BUILD_DIR, run_tests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_kube import FakeKube  # noqa: E402

ELECTOR = os.path.join(BUILD_DIR, "tests", "kube_elector")
TOKEN = "elector-token"
WAIT = 60  # polling budget for an expected line (a failure, not a timing assertion)


def parse_time(s):
    return datetime.datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


class Elector:
    def __init__(self, kubeconfig, lease, identity, duration):
        self.identity = identity
        self.proc = subprocess.Popen([ELECTOR, kubeconfig, lease, identity, str(duration)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, want):
        while True:
            line = self.lines.get(timeout=WAIT)
            if line == want:
                return

    def quiet_for(self, seconds):
        """No line arrives within SECONDS (used only to see a follower keeps following)."""
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError("%s printed %r" % (self.identity, line))

    def stop(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=WAIT)


class Setup:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="diverge-lease-")
        self.fake = FakeKube(token=TOKEN)
        self.fake.start()
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write("current-context: c\n"
                    "clusters: [{name: k, cluster: {server: '%s'}}]\n"
                    "contexts: [{name: c, context: {cluster: k, user: u, namespace: ha}}]\n"
                    "users: [{name: u, user: {tokenFile: token}}]\n" % self.fake.url)
        with open(os.path.join(self.dir, "token"), "w") as f:
            f.write(TOKEN + "\n")

    def lease(self, name):
        with self.fake.lock:
            return self.fake.get("leases", "ha", name)["spec"]

    def close(self):
        self.fake.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_killed_holder_is_replaced_after_expiry():
    s = Setup()
    a = b = None
    try:
        a = Elector(s.kubeconfig, "killed", "replica-a", 4)
        a.expect("leader")
        b = Elector(s.kubeconfig, "killed", "replica-b", 4)
        assert b.quiet_for(1.0)
        before = s.lease("killed")
        assert before["holderIdentity"] == "replica-a", before
        a.stop(signal.SIGKILL)
        b.expect("leader")
        after = s.lease("killed")
        assert after["holderIdentity"] == "replica-b", after
        assert after["leaseTransitions"] == before["leaseTransitions"] + 1, (before, after)
        # b took it only after a's lease had expired (a renewal of a's after BEFORE was read
        # only moves the expiry later, so the bound holds either way)
        assert parse_time(after["acquireTime"]) > parse_time(before["renewTime"]) + \
            datetime.timedelta(seconds=4), (before, after)
    finally:
        for e in (a, b):
            if e is not None:
                e.stop(signal.SIGKILL)
        s.close()


def test_sigterm_releases_for_an_immediate_handover():
    s = Setup()
    a = b = None
    try:
        a = Elector(s.kubeconfig, "released", "replica-a", 3600)
        a.expect("leader")
        b = Elector(s.kubeconfig, "released", "replica-b", 3600)
        assert b.quiet_for(1.0)
        before = s.lease("released")
        a.stop(signal.SIGTERM)
        a.expect("stopped")
        b.expect("leader")
        after = s.lease("released")
        assert after["holderIdentity"] == "replica-b", after
        assert after["leaseTransitions"] == before["leaseTransitions"] + 1, (before, after)
        assert parse_time(after["acquireTime"]) < parse_time(before["renewTime"]) + \
            datetime.timedelta(seconds=3600), (before, after)
    finally:
        for e in (a, b):
            if e is not None:
                e.stop(signal.SIGKILL)
        s.close()


if __name__ == "__main__":
    run_tests([test_killed_holder_is_replaced_after_expiry,
               test_sigterm_releases_for_an_immediate_handover])
