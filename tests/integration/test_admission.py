# SPDX-License-Identifier: Apache-2.0
"""The validating admission webhook (SPEC §3): POST /api/v1/admission/validate with
AdmissionReview v1 requests shaped as the API server sends them (the Kubernetes docs'
example: userInfo, kind, resource, requestKind, requestResource, dryRun, options), no
auth. The validation is the task API's: the same objects are also sent to the task API,
which must agree."""
import copy
import json

from harness import API, Server, run_tests

PATH = "/api/v1/admission/validate"
GVK = {"group": "divergedev.com", "version": "v1alpha1", "kind": "AgentTask"}
GVR = {"group": "divergedev.com", "version": "v1alpha1", "resource": "agenttasks"}
OPTIONS = {
    "CREATE": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions",
               "fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"},
    "UPDATE": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions",
               "fieldManager": "kubectl-edit", "fieldValidation": "Strict"},
    "DELETE": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
               "propagationPolicy": "Background"},
}


def task(name="fix-latency", ns="team-a", status=None, **spec):
    s = {"objective": "Diagnose and fix N+1 query in /api/v1/checkout",
         "repository": {"url": "https://github.com/myorg/checkout-service",
                        "baseBranch": "main"},
         "maxIterations": 8, "budgetUSD": "5.00", "budgetTokens": 200000}
    s.update(spec)
    obj = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
           "metadata": {"name": name, "namespace": ns,
                        "annotations": {"divergedev.com/preview-enabled": "true"},
                        # What the API server has already filled in by admission time.
                        "uid": "3a0e1f2c-5b6d-4e7f-8a9b-0c1d2e3f4a5b", "generation": 1,
                        "creationTimestamp": "2026-11-29T10:00:00Z",
                        "managedFields": [{"manager": "kubectl-client-side-apply",
                                           "operation": "Update",
                                           "apiVersion": "divergedev.com/v1alpha1",
                                           "time": "2026-11-29T10:00:00Z",
                                           "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:spec": {}}}]},
           "spec": s}
    if status is not None:
        obj["status"] = status
    return obj


def review(operation, obj=None, old=None, uid="705ab4f5-6393-11e8-b7cc-42010a800002",
           ns="team-a", kind=GVK, resource=GVR, sub=None):
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    req = {"uid": uid, "kind": kind, "resource": resource, "requestKind": kind,
           "requestResource": resource, "name": name, "namespace": ns,
           "operation": operation,
           "userInfo": {"username": "admin", "uid": "014fbff9a07c",
                        "groups": ["system:authenticated", "my-admin-group"],
                        "extra": {"some-key": ["some-value1", "some-value2"]}},
           "object": obj, "oldObject": old, "dryRun": False,
           "options": OPTIONS.get(operation)}
    if sub:
        req["subResource"] = sub
        req["requestSubResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def admit(srv, body):
    st, h, r = srv.request("POST", PATH, body=body, auth=False)
    assert st == 200, (st, r)
    assert h["content-type"].startswith("application/json"), h
    assert r["apiVersion"] == "admission.k8s.io/v1" and r["kind"] == "AdmissionReview", r
    assert r["response"]["uid"] == body["request"]["uid"], r
    return r["response"]


def denied(resp, *fields):
    assert resp["allowed"] is False, resp
    st = resp["status"]
    assert st["code"] == 422 and st["reason"] == "Invalid", st
    for f in fields:
        assert f in st["message"], (f, st["message"])
    causes = [c["field"] for c in st["details"]["causes"]]
    assert sorted(causes) == sorted(fields), (causes, fields)
    return st


def test_create_is_validated_like_the_task_api():
    with Server() as srv:
        resp = admit(srv, review("CREATE", task()))
        assert resp == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}, resp
        bad = task(budgetUSD="five dollars", maxIterations=-1, sandbox={"provider": "vm"},
                   capabilities=["gpt", ""], budget="5.00")
        st = denied(admit(srv, review("CREATE", bad, uid="u-2")), "spec.budgetUSD",
                    "spec.maxIterations", "spec.capabilities[1]", "spec.sandbox.provider",
                    "spec.budget")
        assert st["message"].startswith('AgentTask.divergedev.com "fix-latency" is invalid: '), st
        # The task API refuses the same object, naming the first of those fields.
        body = copy.deepcopy(bad)
        code, _, r = srv.request("POST", "%s/namespaces/team-a/agenttasks" % API, body=body)
        assert code == 422 and r["details"]["causes"][0]["field"] == st["details"]["causes"][0][
            "field"], (r, st)


def test_missing_and_malformed_required_fields_are_all_named():
    with Server() as srv:
        obj = task(name="Bad_Name", budgetTokens="lots")
        del obj["spec"]["objective"]
        st = denied(admit(srv, review("CREATE", obj)), "metadata.name", "spec.objective",
                    "spec.budgetTokens")
        assert "Bad_Name" not in st["message"], st  # an invalid name is not quoted
        obj = task()
        obj["metadata"]["annotations"] = {"divergedev.com/guidance": "x" * 20000}
        obj["spec"]["objective"] = ""
        denied(admit(srv, review("CREATE", obj)),
               "metadata.annotations.divergedev.com/guidance", "spec.objective")
        denied(admit(srv, review("CREATE", task(ns="team-a"), ns="team-b")),
               "metadata.namespace")


def test_update_refuses_what_the_task_api_refuses():
    status = {"phase": "Active", "reason": "", "message": "", "iteration": 3,
              "tokensConsumed": 4500, "costUSD": "0.0675", "lastMeterRequestIds": [],
              "previewUrl": "", "startTime": "2026-11-29T10:00:05Z", "completionTime": None}
    old = task(status=status)
    with Server() as srv:
        new = task(status=status, budgetUSD="7.50", suspended=True)
        assert admit(srv, review("UPDATE", new, old))["allowed"] is True
        # Renaming (or moving) is refused, like a PUT that changes metadata.name.
        denied(admit(srv, review("UPDATE", task(name="other", status=status), old)),
               "metadata.name")
        denied(admit(srv, review("UPDATE", task(status=status, budgetTokens=-5,
                                                draftPR="yes"), old)),
               "spec.budgetTokens", "spec.draftPR")
        # Status is not the main resource's business (Kubernetes convention), but an
        # update of the status subresource is checked.
        bad_status = dict(status, phase="Sleeping", costUSD="lots")
        assert admit(srv, review("UPDATE", task(status=bad_status), old))["allowed"] is True
        denied(admit(srv, review("UPDATE", task(status=bad_status), old, sub="status")),
               "status.phase", "status.costUSD")
        # The task API agrees: the same rename through PUT is refused.
        body = copy.deepcopy(task(ns="default"))
        for k in ("uid", "generation", "creationTimestamp", "managedFields"):
            body["metadata"].pop(k)
        code, _, r = srv.request("POST", "%s/namespaces/default/agenttasks" % API, body=body)
        assert code == 201, r
        body["metadata"]["name"] = "renamed"
        code, _, r = srv.request("PUT", "%s/namespaces/default/agenttasks/fix-latency" % API,
                                 body=body)
        assert code == 422 and "metadata.name" in r["message"], r


def test_other_operations_and_kinds_are_allowed():
    with Server() as srv:
        assert admit(srv, review("DELETE", None, task()))["allowed"] is True
        assert admit(srv, review("CONNECT", None, None))["allowed"] is True
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
        r = admit(srv, review("CREATE", pod, kind={"group": "", "version": "v1", "kind": "Pod"},
                              resource={"group": "", "version": "v1", "resource": "pods"}))
        assert r["allowed"] is True, r


def test_malformed_reviews_are_400():
    with Server() as srv:
        good = review("CREATE", task())
        bad = []
        for mutate in (
                lambda b: b.update(apiVersion="admission.k8s.io/v1beta1"),
                lambda b: b.update(kind="Review"),
                lambda b: b.pop("request"),
                lambda b: b["request"].pop("uid"),
                lambda b: b["request"].update(uid=7),
                lambda b: b["request"].pop("operation"),
                lambda b: b["request"].update(object=None),
                lambda b: b["request"].update(operation="UPDATE"),  # no oldObject
        ):
            b = copy.deepcopy(good)
            mutate(b)
            bad.append(b)
        bad += ["[]", "not json", ""]
        for b in bad:
            st, h, r = srv.request("POST", PATH, body=b, auth=False)
            assert st == 400, (b, st, r)
            assert isinstance(r, dict) and r.get("error"), r
        st, _, _ = srv.request("GET", PATH, auth=False)
        assert st == 405


if __name__ == "__main__":
    run_tests([test_create_is_validated_like_the_task_api,
               test_missing_and_malformed_required_fields_are_all_named,
               test_update_refuses_what_the_task_api_refuses,
               test_other_operations_and_kinds_are_allowed, test_malformed_reviews_are_400])
