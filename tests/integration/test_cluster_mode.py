# SPDX-License-Identifier: Apache-2.0
"""`diverge serve --store kubernetes` (SPEC §11, docs/cluster-mode.md): two replicas against
tests/fakes/fake_kube.py and tests/fakes/fake_github.py, with short Lease durations (test
knobs DIVERGE_LEASE_*_MS). One replica leads (Lease diverge-leader) and runs the controller
and the bot/outbox/notifier workers; both serve the API, webhooks and the meter. SIGKILL of
the leader hands over once the Lease expired; across the handover no task is reconciled
twice (its phase transitions in the API server's history, and the replicas' "reconciled"
log lines), no sticky comment is duplicated (webhooks delivered to the follower), and no
meter charge is lost or doubled (request ids spread over both replicas, retries included).
SIGTERM releases the Lease. The `local` SCM is refused with a clear 422."""
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

from github_helpers import BOT, comment_payload, deliver, new_fake, wait, SECRET, TOKEN
from harness import API, Server, run_tests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from fake_kube import FakeKube  # noqa: E402

KTOKEN = "cluster-token"
KNS = "diverge"
NS = API + "/namespaces/default/agenttasks"
GH_NS = API + "/namespaces/octo-repo/agenttasks"
METER = "/api/v1/agenttask/meter"
MARKER = "<!-- diverge-agent-task -->"
LEASE_ENV = {"DIVERGE_LEASE_DURATION_MS": "3000", "DIVERGE_LEASE_RENEW_DEADLINE_MS": "2500",
             "DIVERGE_LEASE_RETRY_MS": "300"}


class Cluster:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="diverge-cluster-")
        self.kube = FakeKube(token=KTOKEN, history=100000)
        self.kube.start()
        self.gh = new_fake()
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write("current-context: c\n"
                    "clusters: [{name: k, cluster: {server: '%s'}}]\n"
                    "contexts: [{name: c, context: {cluster: k, user: u, namespace: %s}}]\n"
                    "users: [{name: u, user: {token: %s}}]\n" % (self.kube.url, KNS, KTOKEN))
        self.replicas = []
        # Every replica verifies the tokens any replica minted: one root key (in a cluster,
        # the Secret of sandbox.macaroonSecretRef).
        self.root_key = os.path.join(self.dir, "root-key")
        with open(self.root_key, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(self.root_key, 0o600)

    def replica(self, name):
        env = dict(LEASE_ENV, POD_NAME=name, DIVERGE_NOTIFIER_TOKEN=TOKEN, GITHUB_TOKEN=None,
                   KUBECONFIG=None)
        srv = Server(["--store", "kubernetes", "--kubeconfig", self.kubeconfig,
                      "--macaroon-root-key-file", self.root_key, "--sandbox-provider", "none", "--github-webhook-secret", SECRET,
                      "--github-api-url", self.gh.url, "--notifier-min-interval", "1"],
                     env=env).start()
        srv.name = name
        self.replicas.append(srv)
        return srv

    def holder(self):
        with self.kube.lock:
            try:
                return self.kube.get("leases", KNS, "diverge-leader")["spec"].get("holderIdentity")
            except Exception:  # noqa: BLE001 - not created yet
                return None

    def lease(self):
        with self.kube.lock:
            return json.loads(json.dumps(self.kube.get("leases", KNS, "diverge-leader")["spec"]))

    def phases(self, ns, name):
        """The task's status.phase after each of its changes in the API server's history,
        consecutive repeats collapsed: the phase transitions."""
        out = []
        with self.kube.lock:
            for _, plural, hns, typ, obj in self.kube.history:
                if plural != "agenttasks" or hns != ns or obj["metadata"]["name"] != name:
                    continue
                p = obj.get("status", {}).get("phase")
                if p is not None and (not out or out[-1] != p):
                    out.append(p)
        return out

    def close(self):
        if sys.exc_info()[0] is not None:  # a failure: show what the replicas said
            for r in self.replicas:
                print("--- %s stderr (tail) ---\n%s" % (r.name, "\n".join(
                    r.stderr().splitlines()[-40:])), file=sys.stderr)
        for r in self.replicas:
            r.cleanup()
        self.gh.stop()
        self.kube.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def parse_time(s):
    return datetime.datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def stickies(gh, number=7):
    return [x for x in gh.comments("octo/repo", number)
            if x["user"]["login"] == BOT and x["body"].startswith(MARKER)]


def get(srv, path):
    st, _, b = srv.request("GET", path)
    return b if st == 200 else None


def phase(srv, path):
    b = get(srv, path)
    return b["status"]["phase"] if b else None


def meter(srv, token, rid, tokens=100):
    body = json.dumps({"requestId": rid, "iteration": 1, "tokensUsed": tokens, "costUSD": 0.01})
    return srv.request("POST", METER, body, headers={"Authorization": "Bearer " + token},
                       auth=False)


def reconciled(replicas, name):
    """The actions the controllers of REPLICAS logged as reconciled for task NAME."""
    out = []
    for srv in replicas:
        for line in srv.stderr().splitlines():
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("event") == "reconciled" and j.get("name") == name:
                out.append(j.get("action"))
    return out


def test_two_replicas_handover():
    c = Cluster()
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        b = c.replica("replica-b")
        leader, follower = a, b
        # A task through the follower's API: the leader's controller activates it.
        st, _, body = follower.request("POST", NS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "t1"}, "spec": {"objective": "do it", "budgetUSD": "5.00",
                                                 "budgetTokens": 1000000}})
        assert st == 201, body
        wait(lambda: phase(follower, NS + "/t1") == "Active", what="t1 Active")
        st, _, tok = follower.request("GET", NS + "/t1/token")
        assert st == 200, tok
        tok = tok.strip()
        # A command delivered to the follower: the leader's bot and notifier answer it.
        cm = c.gh.add_comment("octo/repo", 7, user="alice", body="/diverge fix the flaky test")
        st, _, ans = deliver(follower, comment_payload("octo/repo", 7, cm["id"],
                                                       "/diverge fix the flaky test"))
        assert st == 202, (st, ans)
        wait(lambda: get(follower, GH_NS + "/fix-pr-7"), what="task from the comment")
        wait(lambda: stickies(c.gh), what="sticky comment")
        # Meter calls spread over both replicas.
        for i in range(10):
            st, _, ans = meter(a if i % 2 == 0 else b, tok, "r%d" % i)
            assert st == 200, (st, ans)
        # The leader dies without releasing the Lease.
        leader.kill()
        before = c.lease()
        # Charges go on meanwhile on the survivor, retries of ids the dead one took too.
        for i in range(10, 20):
            st, _, ans = meter(follower, tok, "r%d" % i)
            assert st == 200, (st, ans)
        for i in range(0, 10, 2):
            st, _, ans = meter(follower, tok, "r%d" % i)  # a retry: charged once
            assert st == 200, (st, ans)
        wait(lambda: c.holder() == "replica-b", timeout=30, what="replica-b takes over")
        after = c.lease()
        # taken only once the dead holder's Lease expired, as one more transition
        assert parse_time(after["acquireTime"]) > parse_time(before["renewTime"]) + \
            datetime.timedelta(seconds=before["leaseDurationSeconds"]), (before, after)
        assert after["leaseTransitions"] == before["leaseTransitions"] + 1, (before, after)
        # Another command, to the new leader: still one sticky comment.
        cm2 = c.gh.add_comment("octo/repo", 7, user="alice", body="/diverge pause")
        st, _, ans = deliver(follower, comment_payload("octo/repo", 7, cm2["id"],
                                                       "/diverge pause"))
        assert st == 202, (st, ans)
        wait(lambda: phase(follower, GH_NS + "/fix-pr-7") == "Paused", what="paused")
        wait(lambda: "Paused" in stickies(c.gh)[0]["body"], what="sticky shows Paused")
        time.sleep(1.5)  # let any duplicate show up
        assert len(stickies(c.gh)) == 1, stickies(c.gh)
        posts = c.gh.find_requests("POST", r"/issues/7/comments$")
        marker_posts = [p for p in posts if p["body"]["body"].startswith(MARKER)]
        assert len(marker_posts) == 1, marker_posts
        # Every charge exactly once.
        t1 = get(follower, NS + "/t1")
        assert t1["status"]["tokensConsumed"] == 2000, t1["status"]
        assert t1["status"]["costUSD"] == "0.20", t1["status"]
        # No task reconciled twice: each phase reached once, each action logged once.
        for ns, name in (("default", "t1"), ("octo-repo", "fix-pr-7")):
            ph = c.phases(ns, name)
            assert len(ph) == len(set(ph)), (name, ph)
        for name in ("t1", "fix-pr-7"):
            actions = reconciled((a, b), name)
            assert actions and len(actions) == len(set(actions)), (name, actions)
        # SIGTERM releases the Lease (holder cleared at once, not after expiry).
        assert follower.stop() == 0
        wait(lambda: c.holder() == "", what="lease released")
    finally:
        c.close()


def events(srv, name):
    n = 0
    for line in srv.stderr().splitlines():
        if line.startswith("{") and json.loads(line).get("event") == name:
            n += 1
    return n


def test_lost_lease_stops_the_controller_and_regained_restarts_it():
    """Leadership lost (another holder took the Lease) stops the controller: a new task
    stays Pending; given back, the controller runs again and activates it."""
    c = Cluster()
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        wait(lambda: events(a, "leader_elected") >= 1, what="replica-a runs the controller")
        with c.kube.lock:
            lease = json.loads(json.dumps(c.kube.get("leases", KNS, "diverge-leader")))
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        lease["spec"].update(holderIdentity="intruder", renewTime=now, acquireTime=now,
                             leaseDurationSeconds=3600)
        lease["metadata"].pop("resourceVersion", None)
        c.kube.put_object("leases", KNS, lease)
        lost, elected = events(a, "leader_lost"), events(a, "leader_elected")
        wait(lambda: events(a, "leader_lost") > lost, what="replica-a steps down")
        st, _, body = a.request("POST", NS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "t2"}, "spec": {"objective": "do it"}})
        assert st == 201, body
        time.sleep(1.0)  # nobody leads: nothing reconciles it
        assert phase(a, NS + "/t2") == "Pending"
        lease["spec"].update(holderIdentity="", leaseDurationSeconds=1)
        c.kube.put_object("leases", KNS, lease)
        wait(lambda: events(a, "leader_elected") > elected, what="replica-a leads again")
        wait(lambda: phase(a, NS + "/t2") == "Active", what="t2 Active")
    finally:
        c.close()


def test_task_applied_without_status():
    """An AgentTask written straight to the API server (kubectl apply: no status, the API
    server drops it on create) reads as Pending and the leader's controller runs it."""
    c = Cluster()
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        c.kube.put_object("agenttasks", "default", {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "applied"},
            "spec": {"objective": "do it", "budgetUSD": "5.00", "budgetTokens": 1000,
                     "maxIterations": 3, "suspended": False}})
        wait(lambda: phase(a, NS + "/applied") == "Active", what="applied Active")
    finally:
        c.close()


def test_phase_changes_are_events():
    """Every phase change of a task is a core/v1 Event on it (what `kubectl describe
    agenttask` lists): reason the new phase, involvedObject the AgentTask."""
    c = Cluster()
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")
        st, _, body = a.request("POST", NS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "t4"}, "spec": {"objective": "do it"}})
        assert st == 201, body
        wait(lambda: phase(a, NS + "/t4") == "Active", what="t4 Active")
        uid = get(a, NS + "/t4")["metadata"]["uid"]

        def evs():
            with c.kube.lock:
                out = [json.loads(json.dumps(o)) for (p, ns, _), o in c.kube.objects.items()
                       if p == "events@v1" and ns == "default" and
                       o.get("involvedObject", {}).get("name") == "t4"]
            return sorted(out, key=lambda e: int(e["involvedObject"]["resourceVersion"]))
        wait(lambda: [e["reason"] for e in evs()] == c.phases("default", "t4"),
             what="one Event per phase change")
        assert c.phases("default", "t4")[0] == "Pending", c.phases("default", "t4")
        for e in evs():
            assert e["involvedObject"]["apiVersion"] == "divergedev.com/v1alpha1", e
            assert e["involvedObject"]["kind"] == "AgentTask", e
            assert e["involvedObject"]["namespace"] == "default", e
            assert e["involvedObject"]["uid"] == uid, e
            assert e["type"] == "Normal" and e["source"] == {"component": "diverge"}, e
            assert e["count"] == 1 and e["firstTimestamp"] == e["lastTimestamp"], e
            assert e["message"].startswith("phase "), e
    finally:
        c.close()


def test_create_meets_a_status_written_first():
    """Another writer may change a task between its create and the initial status the
    creating request writes next (the API server drops a create's status): the leader's
    controller, woken by the ADDED event, writing the status first, or any write of the main
    resource. The create still answers 201 with the task as stored, never 409 "already
    exists" for a task it made; a status written first stands, and after a write that left
    the status unset the initial one is written on the fresh object."""
    c = Cluster()
    try:
        a = c.replica("replica-a")
        wait(lambda: c.holder() == "replica-a", what="replica-a leads")

        def first(plural, ns, obj):
            name = obj["metadata"]["name"]
            if plural != "agenttasks" or name not in ("raced", "relabelled"):
                return
            if name == "raced":
                obj["status"] = {"phase": "Pending", "reason": "", "message": "written first",
                                 "iteration": 0, "tokensConsumed": 0, "costUSD": "0.00"}
                c.kube.write(plural, ns, name, obj, "status", True)
            else:
                obj["metadata"]["labels"] = {"touched": "yes"}
                c.kube.write(plural, ns, name, obj, None, True)
        c.kube.after_create = first
        bodies = {}
        for name in ("raced", "relabelled"):
            st, _, body = a.request("POST", NS, {
                "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
                "metadata": {"name": name}, "spec": {"objective": "do it"}})
            assert st == 201, (name, st, body)
            bodies[name] = body
        assert bodies["raced"]["status"]["message"] == "written first", bodies["raced"]
        assert bodies["relabelled"]["metadata"]["labels"] == {"touched": "yes"}, bodies
        assert bodies["relabelled"]["status"]["phase"] == "Pending", bodies["relabelled"]
        for name in ("raced", "relabelled"):
            wait(lambda: phase(a, NS + "/" + name) == "Active", what=name + " Active")
        assert c.phases("default", "relabelled")[0] == "Pending", c.phases("default",
                                                                            "relabelled")
        assert "task_create_status_taken" in a.stderr(), "the raced create took the status"
    finally:
        c.close()


def test_local_scm_refused():
    c = Cluster()
    try:
        a = c.replica("replica-a")
        r = a.cli("local", "comment", "octo/repo#1", "/diverge help")
        assert r.returncode != 0, r
        assert "local scm" in (r.stderr + r.stdout), r
    finally:
        c.close()


if __name__ == "__main__":
    run_tests([test_two_replicas_handover,
               test_lost_lease_stops_the_controller_and_regained_restarts_it,
               test_task_applied_without_status, test_phase_changes_are_events,
               test_create_meets_a_status_written_first, test_local_scm_refused])
