# SPDX-License-Identifier: Apache-2.0
"""`diverge serve --tls-listen` (SPEC §2): the self-signed certificate for 127.0.0.1 and
localhost is generated once into the data dir (key 0600) and reused on restart; given PEM
files are served instead; plain HTTP on the TLS port fails without harming the server;
the task API answers over HTTPS with the admin token (and 401 without); `diverge
kubeconfig` finds the listener through <data-dir>/tls-endpoint."""
import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile

from harness import API, DIVERGE_BIN, Server, run_tests

ARGS = ["--sandbox-provider", "none", "--tls-listen", "127.0.0.1:0"]
NS = API + "/namespaces/default/agenttasks"


def endpoint(srv):
    with open(os.path.join(srv.data_dir, "tls-endpoint")) as f:
        return json.load(f)


def https(srv, method, path, cafile, host="127.0.0.1", token=True, body=None,
          content_type="application/json"):
    """One HTTPS request to the TLS listener, the certificate checked against CAFILE."""
    port = int(endpoint(srv)["server"].rsplit(":", 1)[1])
    ctx = ssl.create_default_context(cafile=cafile)
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=30)
    headers = {"Content-Type": content_type} if body is not None else {}
    if token:
        headers["Authorization"] = "Bearer " + srv.token
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers=headers)
    peer = conn.sock.getpeercert(binary_form=True)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None, peer


def test_generated_certificate_once_then_reused():
    data_dir = tempfile.mkdtemp(prefix="diverge-test-")
    try:
        with Server(args=ARGS, data_dir=data_dir) as srv:
            crt = os.path.join(data_dir, "tls.crt")
            key = os.path.join(data_dir, "tls.key")
            assert os.stat(key).st_mode & 0o777 == 0o600, oct(os.stat(key).st_mode)
            ep = endpoint(srv)
            assert ep["server"].startswith("https://127.0.0.1:"), ep
            assert ep["certificateAuthority"] == os.path.realpath(crt), ep
            assert any(l.strip().startswith("HTTPS:") and ep["server"] in l for l in srv.lines), \
                srv.lines
            # The certificate is its own CA, for the IP and for localhost.
            for host in ("127.0.0.1", "localhost"):
                st, body, _ = https(srv, "GET", "/healthz", crt, host=host)
                assert st == 200 and body == {"status": "ok"}, (host, st, body)
            with open(crt) as f:
                first_crt = f.read()
            with open(key) as f:
                first_key = f.read()
        with Server(args=ARGS, data_dir=data_dir) as srv:
            with open(crt) as f:
                assert f.read() == first_crt
            with open(key) as f:
                assert f.read() == first_key
            st, _, peer = https(srv, "GET", "/healthz", crt)
            assert st == 200 and peer == ssl.PEM_cert_to_DER_cert(first_crt)
        # A key others can read is refused, with the fix in the message.
        os.chmod(key, 0o644)
        srv = Server(args=ARGS, data_dir=data_dir)
        try:
            srv.start()
            raise AssertionError("started with a 0644 key")
        except RuntimeError as e:
            assert "chmod 600" in str(e), e
        finally:
            srv.kill()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_given_pem_files_are_served():
    pem_dir = tempfile.mkdtemp(prefix="diverge-pem-")
    try:
        crt = os.path.join(pem_dir, "server.crt")
        key = os.path.join(pem_dir, "server.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=given", "-keyout", key, "-out", crt,
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       check=True, capture_output=True)
        os.chmod(key, 0o644)  # as Kubernetes mounts Secrets: not refused for given files
        with Server(args=ARGS + ["--tls-cert-file", crt, "--tls-key-file", key]) as srv:
            with open(crt) as f:
                given = f.read()
            st, _, peer = https(srv, "GET", "/healthz", crt)
            assert st == 200 and peer == ssl.PEM_cert_to_DER_cert(given)
            assert not os.path.exists(os.path.join(srv.data_dir, "tls.key"))
            assert endpoint(srv)["certificateAuthority"] == os.path.realpath(crt)
            r = srv.cli("kubeconfig", env={"DIVERGE_DATA_DIR": srv.data_dir})
            assert r.returncode == 0, r.stderr
            ca = [l for l in r.stdout.splitlines() if "certificate-authority-data:" in l][0]
            assert base64.b64decode(ca.split(":", 1)[1].strip()).decode() == given
            assert '    token: "%s"' % srv.token in r.stdout and "current-context: diverge" in \
                r.stdout, r.stdout
            r = srv.cli("kubeconfig", "-n", "team-a", env={"DIVERGE_DATA_DIR": srv.data_dir})
            assert '    namespace: "team-a"' in r.stdout, r.stdout
        # Only one of the two: refused.
        srv = Server(args=ARGS + ["--tls-cert-file", crt])
        try:
            srv.start()
            raise AssertionError("started with a certificate and no key")
        except RuntimeError as e:
            assert "--tls-cert-file and --tls-key-file go together" in str(e), e
        finally:
            srv.kill()
            shutil.rmtree(srv.data_dir, ignore_errors=True)
    finally:
        shutil.rmtree(pem_dir, ignore_errors=True)


def test_plain_http_on_the_tls_port_fails_cleanly():
    with Server(args=ARGS) as srv:
        crt = os.path.join(srv.data_dir, "tls.crt")
        port = int(endpoint(srv)["server"].rsplit(":", 1)[1])
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
            s.close()
            assert b"HTTP/1." not in got and b"status" not in got, got
        # The server is unharmed, on both listeners.
        st, body, _ = https(srv, "GET", "/healthz", crt)
        assert st == 200, (st, body)
        st, _, _ = srv.request("GET", "/healthz")
        assert st == 200


def test_task_api_over_https():
    with Server(args=ARGS) as srv:
        crt = os.path.join(srv.data_dir, "tls.crt")
        task = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
                "metadata": {"name": "over-tls"}, "spec": {"objective": "x"}}
        st, body, _ = https(srv, "POST", NS, crt, body=task)
        assert st == 201 and body["metadata"]["name"] == "over-tls", body
        st, body, _ = https(srv, "GET", NS + "/over-tls", crt)
        assert st == 200 and body["spec"]["objective"] == "x", body
        st, body, _ = https(srv, "GET", NS, crt, token=False)
        assert st == 401 and body["kind"] == "Status" and body["reason"] == "Unauthorized", body
        # The same task on the plain listener: one server, two listeners.
        st, _, body = srv.request("GET", NS + "/over-tls")
        assert st == 200 and body["metadata"]["uid"], body
        # Discovery and OpenAPI (no token needed) as kubectl reads them.
        st, body, _ = https(srv, "GET", "/openapi/v3", crt, token=False)
        assert st == 200 and "apis/divergedev.com/v1alpha1" in body["paths"], body
        st, body, _ = https(srv, "GET", "/openapi/v3/apis/divergedev.com/v1alpha1", crt)
        patch = body["paths"][API + "/namespaces/{namespace}/agenttasks/{name}"]["patch"]
        assert {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}} in \
            patch["parameters"], patch
        assert "application/merge-patch+json" in patch["requestBody"]["content"], patch
        schema = body["components"]["schemas"]["com.divergedev.v1alpha1.AgentTask"]
        assert schema["x-kubernetes-group-version-kind"] == [
            {"group": "divergedev.com", "version": "v1alpha1", "kind": "AgentTask"}], schema
        st, _, _ = https(srv, "GET", "/openapi/v2", crt)
        assert st == 404


def test_kubeconfig_needs_a_tls_listener():
    data_dir = tempfile.mkdtemp(prefix="diverge-test-")
    try:
        with Server(args=ARGS, data_dir=data_dir) as srv:
            assert os.path.exists(os.path.join(data_dir, "tls-endpoint"))
        # Restarted without --tls-listen: the stale endpoint is gone, kubeconfig says why.
        with Server(args=["--sandbox-provider", "none"], data_dir=data_dir) as srv:
            assert not os.path.exists(os.path.join(data_dir, "tls-endpoint"))
            r = srv.cli("kubeconfig", env={"DIVERGE_DATA_DIR": data_dir})
            assert r.returncode == 1 and "--tls-listen" in r.stderr, r.stderr
            assert r.stderr.startswith("diverge: ") and r.stdout == "", r
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    r = subprocess.run([DIVERGE_BIN, "kubeconfig", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "tls-endpoint" in r.stdout, r


if __name__ == "__main__":
    run_tests([test_generated_certificate_once_then_reused, test_given_pem_files_are_served,
               test_plain_http_on_the_tls_port_fails_cleanly, test_task_api_over_https,
               test_kubeconfig_needs_a_tls_listener])
