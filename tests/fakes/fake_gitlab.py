# SPDX-License-Identifier: Apache-2.0
"""A fake GitLab REST API (v4) on loopback for the integration tests (Python 3 stdlib only).

It serves the subset of https://docs.gitlab.com/api/ that Diverge uses (SPEC sections 5
and 6) with GitLab's paths, status codes, headers and JSON shapes. A project is named by
its numeric id or by its full path URL-encoded as ONE segment (`group%2Fsub%2Fproject`);
a path with a raw '/' where the id belongs is a 404, as on GitLab.

    GET    /api/v4/user                                   (PRIVATE-TOKEN)
    GET    /api/v4/users?username=U
    GET    /api/v4/projects/:id
    GET    /api/v4/projects/:id/merge_requests/:iid
    GET    /api/v4/projects/:id/members/all/:user_id      (404: not a member)
    GET    /api/v4/projects/:id/repository/files/:path/raw?ref=R
    GET    /api/v4/projects/:id/merge_requests/:iid/notes?sort=&order_by=&per_page=&page=
           (x-page, x-per-page, x-next-page, x-total, Link)
    POST   /api/v4/projects/:id/merge_requests/:iid/notes
    PUT|DELETE /api/v4/projects/:id/merge_requests/:iid/notes/:note_id
    POST   /api/v4/projects/:id/merge_requests/:iid/notes/:note_id/award_emoji

A note whose whole body is one emoji becomes an award (as on GitLab); a body over
1,000,000 characters is a 400. Faults: inject(method, path_re, status, headers, body,
times, apply) answers STATUS instead (apply=True: the call takes effect first and its
answer is lost); drop=True closes the connection without an answer.
"""
import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FakeGitLab", "ACCESS"]

ACCESS = {"guest": 10, "reporter": 20, "developer": 30, "maintainer": 40, "owner": 50}
NOTE_MAX = 1000000
EMOJI_ONLY = re.compile(r"^\s*(:[a-z0-9_+-]+:|[^\x00-\x7f]{1,40})\s*$")


class _Rule:
    def __init__(self, method, path_re, status, headers, body, times, apply, drop):
        self.method, self.path_re, self.status = method, re.compile(path_re or ""), status
        self.headers, self.body, self.times = headers or {}, body, times
        self.apply, self.drop, self.hits = apply, drop, 0

    def matches(self, method, path):
        return ((self.method is None or self.method == method) and
                self.path_re.search(path) is not None and
                (self.times is None or self.hits < self.times))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _any(self):
        self.server.fake._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any


class FakeGitLab:
    def __init__(self, host="127.0.0.1", port=0, token="glpat-test", bot="diverge-bot"):
        self.lock = threading.RLock()
        self.token = token
        self.users = {}          # username -> id
        self.projects = {}       # path -> {"id", "path", "mrs": {iid: mr}, "files": {(ref, path): bytes}, "members": {uid: level}}
        self.notes = {}          # note id -> note dict (with "_project", "_iid")
        self.awards = []         # (note id, name, username)
        self.rules = []
        self.log = []            # {"method", "path", "headers", "body", "status"}
        self.next_note = 5000
        self.next_project = 100
        self.bot = bot
        self.add_user(bot)
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.thread = None

    # --- lifecycle ---
    def start(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    # --- state ---
    def add_user(self, username, uid=None):
        with self.lock:
            if username not in self.users:
                self.users[username] = uid if uid is not None else 1000 + len(self.users)
            return self.users[username]

    def add_project(self, path, default_branch="main"):
        with self.lock:
            self.next_project += 1
            self.projects[path] = {"id": self.next_project, "path": path, "mrs": {},
                                   "files": {}, "members": {},
                                   "default_branch": default_branch}
            return self.projects[path]

    def add_mr(self, path, iid, source="feature-x", target="main"):
        with self.lock:
            p = self.projects[path]
            p["mrs"][iid] = {"iid": iid, "source_branch": source, "target_branch": target,
                             "source_project_id": p["id"], "target_project_id": p["id"],
                             "web_url": "https://gitlab.example/%s/-/merge_requests/%d" % (path, iid)}

    def set_access(self, path, username, level):
        with self.lock:
            uid = self.add_user(username)
            if level is None:
                self.projects[path]["members"].pop(uid, None)
            else:
                self.projects[path]["members"][uid] = ACCESS.get(level, level)
            return uid

    def set_file(self, path, ref, file_path, content):
        with self.lock:
            self.projects[path]["files"][(ref, file_path)] = content.encode() \
                if isinstance(content, str) else content

    def add_note(self, path, iid, body, user="alice", system=False):
        with self.lock:
            return self._new_note(self.projects[path], iid, user, body, system)

    def mr_notes(self, path, iid):
        with self.lock:
            return [n for n in sorted(self.notes.values(), key=lambda n: n["id"])
                    if n["_project"] == path and n["_iid"] == iid]

    def inject(self, method=None, path_re=None, status=500, headers=None, body=None, times=1,
               apply=False, drop=False):
        r = _Rule(method, path_re, status, headers, body, times, apply, drop)
        with self.lock:
            self.rules.append(r)
        return r

    def requests(self, method=None, path_re=None):
        with self.lock:
            return [q for q in self.log if (method is None or q["method"] == method) and
                    (path_re is None or re.search(path_re, q["path"]))]

    # --- serving ---
    def _new_note(self, p, iid, user, body, system=False):
        self.next_note += 1
        uid = self.add_user(user)
        n = {"id": self.next_note, "body": body, "system": system, "noteable_iid": iid,
             "noteable_type": "MergeRequest", "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
             "author": {"id": uid, "username": user, "name": user},
             "_project": p["path"], "_iid": iid}
        self.notes[n["id"]] = n
        return n

    def _project(self, seg):
        if "/" in seg:
            return None
        ident = urllib.parse.unquote(seg)
        for p in self.projects.values():
            if ident == p["path"] or ident == str(p["id"]):
                return p
        return None

    def _serve(self, h):
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        entry = {"method": h.command, "path": h.path, "headers": dict(h.headers.items()),
                 "body": raw, "status": None}
        with self.lock:
            self.log.append(entry)
            rule = next((r for r in self.rules if r.matches(h.command, h.path)), None)
            if rule:
                rule.hits += 1
        if rule is not None and rule.apply:
            status, headers, body = self._route(h, raw)
            if rule.drop or rule.status is None:
                entry["status"] = 0
                h.close_connection = True
                h.wfile.flush()
                h.connection.shutdown(2)
                return
        if rule is not None and rule.drop and not rule.apply:
            entry["status"] = 0
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if rule is not None:
            status, headers = rule.status, dict(rule.headers)
            body = rule.body if rule.body is not None else {"message": "%d injected" % status}
        elif not h.headers.get("PRIVATE-TOKEN") == self.token:
            status, headers, body = 401, {}, {"message": "401 Unauthorized"}
        else:
            status, headers, body = self._route(h, raw)
        entry["status"] = status
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/plain" if isinstance(body, bytes) else
                      "application/json")
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, h, raw):
        u = urllib.parse.urlsplit(h.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        parts = u.path.split("/")
        if u.path == "/api/v4/user":
            return 200, {}, {"id": self.users[self.bot], "username": self.bot}
        if u.path == "/api/v4/users":
            name = q.get("username", "")
            return 200, {}, [{"id": self.users[name], "username": name}] \
                if name in self.users else []
        if parts[:4] != ["", "api", "v4", "projects"] or len(parts) < 5:
            return 404, {}, {"message": "404 Not Found"}
        with self.lock:
            p = self._project(parts[4])
            if p is None:
                return 404, {}, {"message": "404 Project Not Found"}
            rest = parts[5:]
            m = h.command
            if not rest and m == "GET":
                return 200, {}, {"id": p["id"], "path_with_namespace": p["path"],
                                 "http_url_to_repo": "https://gitlab.example/%s.git" % p["path"],
                                 "default_branch": p["default_branch"]}
            if rest[:2] == ["members", "all"] and len(rest) == 3 and m == "GET":
                lvl = p["members"].get(int(rest[2])) if rest[2].isdigit() else None
                if lvl is None:
                    return 404, {}, {"message": "404 Not found"}
                name = next(k for k, v in self.users.items() if v == int(rest[2]))
                return 200, {}, {"id": int(rest[2]), "username": name, "access_level": lvl,
                                 "state": "active"}
            if rest[:2] == ["repository", "files"] and len(rest) == 4 and rest[3] == "raw":
                fp = urllib.parse.unquote(rest[2])
                data = p["files"].get((q.get("ref"), fp))
                if data is None:
                    return 404, {}, {"message": "404 File Not Found"}
                return 200, {}, data
            if rest[:1] == ["merge_requests"] and len(rest) >= 2 and rest[1].isdigit():
                return self._mr(h, p, int(rest[1]), rest[2:], q, raw)
        return 404, {}, {"message": "404 Not Found"}

    def _mr(self, h, p, iid, rest, q, raw):
        m = h.command
        mr = p["mrs"].get(iid)
        if mr is None:
            return 404, {}, {"message": "404 Not found"}
        if not rest and m == "GET":
            return 200, {}, dict(mr)
        if rest[:1] != ["notes"]:
            return 404, {}, {"message": "404 Not Found"}
        if len(rest) == 1 and m == "GET":
            notes = [n for n in sorted(self.notes.values(), key=lambda n: n["id"],
                                       reverse=q.get("sort", "desc") != "asc")
                     if n["_project"] == p["path"] and n["_iid"] == iid]
            per, page = min(int(q.get("per_page", 20)), 100), int(q.get("page", 1))
            chunk = notes[(page - 1) * per:page * per]
            last = max(1, (len(notes) + per - 1) // per)
            hdr = {"x-page": page, "x-per-page": per, "x-total": len(notes),
                   "x-next-page": page + 1 if page < last else ""}
            return 200, hdr, [{k: v for k, v in n.items() if not k.startswith("_")}
                              for n in chunk]
        user = self.bot
        if len(rest) == 1 and m == "POST":
            body = json.loads(raw or b"{}").get("body")
            if not isinstance(body, str) or not body.strip():
                return 400, {}, {"message": {"note": ["can't be blank"]}}
            if len(body) > NOTE_MAX:
                return 400, {}, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}}
            if EMOJI_ONLY.match(body):
                self.awards.append((None, body.strip(), user))
                return 201, {}, {"id": None, "name": body.strip()}
            n = self._new_note(p, iid, user, body)
            return 201, {}, {k: v for k, v in n.items() if not k.startswith("_")}
        note = self.notes.get(int(rest[1])) if len(rest) >= 2 and rest[1].isdigit() else None
        if note is None or note["_project"] != p["path"] or note["_iid"] != iid:
            return 404, {}, {"message": "404 Note Not Found"}
        if len(rest) == 2 and m == "PUT":
            body = json.loads(raw or b"{}").get("body")
            if not isinstance(body, str) or len(body) > NOTE_MAX:
                return 400, {}, {"message": "400 Bad request"}
            if note["author"]["username"] != user:
                return 403, {}, {"message": "403 Forbidden"}
            note["body"] = body
            return 200, {}, {k: v for k, v in note.items() if not k.startswith("_")}
        if len(rest) == 2 and m == "DELETE":
            del self.notes[note["id"]]
            return 204, {}, b""
        if rest[2:] == ["award_emoji"] and m == "POST":
            name = json.loads(raw or b"{}").get("name")
            if (note["id"], name, user) in self.awards:
                return 404, {}, {"message": "404 Award Emoji Name has already been taken"}
            self.awards.append((note["id"], name, user))
            return 201, {}, {"id": len(self.awards), "name": name, "user": {"username": user},
                             "awardable_id": note["id"], "awardable_type": "Note"}
        return 404, {}, {"message": "404 Not Found"}
