# SPDX-License-Identifier: Apache-2.0
"""Disk limits of local sandboxes with the real diverge-agent-runner. A task's workspace,
staging repository and state dir share the data dir's filesystem with the database: an
agent that wrote more than --sandbox-disk, or that brought free space under the data dir's
reserve, is stopped and its task fails with reason DiskLimit while other tasks and the API
go on; /readyz answers 503 below the reserve and no sandbox starts there; a push bigger than
--max-push-bytes is not sent (PushTooLarge); and DELETE frees a task's files even when the
full filesystem refuses the database's write. The filesystem tests mount a small tmpfs as
the data dir (root only, as in CI); they say SKIP elsewhere."""
import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile

from harness import API, Server, run_tests
from sandbox_helpers import (bare_repo, create, get, git, leader_pid, task, task_log, wait_log,
                             wait_phase, wait_until)
from test_sandbox_local import usable

MIB = 1024 * 1024
FINISHED = ("Completed", "Failed")


def runner_task(name, repo, command, **spec):
    return task(name, "file://" + repo, runner={"command": command}, **spec)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def tmpfs_data_dir(size):
    """A data dir that is a tmpfs of SIZE bytes (mode 0700, root's)."""
    d = tempfile.mkdtemp(prefix="diverge-test-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % size, "tmpfs", d],
                   check=True, capture_output=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def can_mount():
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "needs root to mount a tmpfs"
    try:
        with tmpfs_data_dir(MIB):
            pass
    except (OSError, subprocess.CalledProcessError) as e:
        return "cannot mount a tmpfs here: %s" % e
    return None


def space_report(top):
    """What holds the space under TOP: statvfs and the largest files (a failure's message)."""
    st = os.statvfs(top)
    sizes = []
    for d, _, names in os.walk(top):
        for n in names:
            try:
                sizes.append((os.lstat(os.path.join(d, n)).st_size, os.path.join(d, n)))
            except OSError:
                pass
    return "%d of %d bytes free; largest: %s" % (free_bytes(top), st.f_blocks * st.f_frsize,
                                               sorted(sizes, reverse=True)[:8])


def fill(path, leave=0, top=None):
    """Writes PATH until its filesystem has at most LEAVE bytes free (or is full)."""
    chunk = b"\0" * MIB
    try:
        # Unbuffered: a write the full filesystem cut short leaves nothing behind for the
        # close to write (and fail on) again.
        f = open(path, "wb", buffering=0)
    except OSError as e:
        # Seen once in a CI run (the tmpfs full before this file): say what filled it.
        raise AssertionError("cannot create %s: %s; %s"
                             % (path, e, space_report(top or os.path.dirname(path))))
    with f:
        try:
            while free_bytes(os.path.dirname(path)) > leave + MIB:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            f.write(b"\0" * max(0, free_bytes(os.path.dirname(path)) - leave))
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def test_task_over_sandbox_disk_fails_with_disk_limit():
    """60 MB written under a 20M limit: the watchdog stops the sandbox, the task fails with
    DiskLimit (its workspace kept), and another task and the API keep working."""
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    hog = "head -c %d /dev/zero > big.bin; echo written; sleep 600" % (60 * MIB)
    with Server(args=["--sandbox-provider", "local", "--sandbox-disk", "20M"]) as srv:
        create(srv, runner_task("hog", repo, hog))
        create(srv, runner_task("small", repo, "echo fine > fine.txt"))
        pid = wait_until(lambda: leader_pid(srv, "hog"), timeout=60, what="the hog's sandbox")
        body = wait_phase(srv, "hog", FINISHED, timeout=120)
        log = task_log(srv, "hog")
        st = body["status"]
        assert st["phase"] == "Failed" and st["reason"] == "DiskLimit", (st, log)
        assert "--sandbox-disk" in st["message"] and "20 MiB" in st["message"], st
        assert "[diverge] disk limit: " in log and "stopping every process" in log, log
        assert "the workspace is kept" in log, log
        wait_until(lambda: not alive(pid), what="the hog's sandbox to be gone")
        # Nothing was lost: the workspace stays until the task is deleted.
        ws = os.path.join(srv.data_dir, "workspaces", "default", "hog")
        assert os.path.exists(os.path.join(ws, "big.bin")), os.listdir(ws)
        # The other task went on, and the API takes new tasks.
        small = wait_phase(srv, "small", FINISHED, timeout=120)
        assert small["status"]["phase"] == "Completed", (small["status"], task_log(srv, "small"))
        assert git("--git-dir", repo, "show", "agent/small:fine.txt") == "fine\n"
        create(srv, runner_task("after", repo, "echo after > after.txt"))
        after = wait_phase(srv, "after", FINISHED, timeout=120)
        assert after["status"]["phase"] == "Completed", after["status"]
        # Deleting it frees its files.
        st_, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/hog")
        assert st_ == 200
        wait_until(lambda: not os.path.exists(ws), what="the workspace to go")
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_push_over_max_push_bytes_is_not_sent():
    """A 3 MB commit under --max-push-bytes 1M stays in staging: the task fails with
    PushTooLarge and the remote has no branch; a small one is pushed as before, though the
    base branch it builds on holds 2 MB the remote already has."""
    repo = bare_repo()
    os.chmod(os.path.dirname(repo), 0o755)
    work = tempfile.mkdtemp(prefix="diverge-work-")
    git("clone", "-q", repo, work)
    with open(os.path.join(work, "base.bin"), "wb") as f:
        f.write(os.urandom(2 * MIB))
    git("add", "base.bin", cwd=work)
    git("commit", "-q", "-m", "a big base", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    shutil.rmtree(work, ignore_errors=True)
    big = "head -c %d /dev/urandom > blob.bin" % (3 * MIB)
    with Server(args=["--sandbox-provider", "local", "--max-push-bytes", "1M"]) as srv:
        create(srv, runner_task("bigpush", repo, big))
        create(srv, runner_task("smallpush", repo, "echo small > small.txt"))
        body = wait_phase(srv, "bigpush", FINISHED, timeout=120)
        log = task_log(srv, "bigpush")
        st = body["status"]
        assert st["phase"] == "Failed" and st["reason"] == "PushTooLarge", (st, log)
        assert "--max-push-bytes" in st["message"] and "refs/heads/agent/bigpush" in st["message"]
        assert "[diverge] push failed: refusing to push refs/heads/agent/bigpush" in log, log
        assert "[diverge] pushed" not in log, log
        assert "agent/bigpush" not in git("--git-dir", repo, "branch"), "the big push was sent"
        # The commit is kept in the task's staging repository.
        staging = os.path.join(srv.data_dir, "staging", "default", "bigpush.git")
        assert "blob.bin" in git("--git-dir", staging, "ls-tree", "--name-only",
                                 "agent/bigpush")
        small = wait_phase(srv, "smallpush", FINISHED, timeout=120)
        assert small["status"]["phase"] == "Completed", (small["status"],
                                                         task_log(srv, "smallpush"))
        assert git("--git-dir", repo, "show", "agent/smallpush:small.txt") == "small\n"
    shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_readyz_and_starts_below_the_reserve():
    """With the default reserve (256M) on a 320M data dir: ready; once less than the reserve
    is free, /readyz answers 503 saying so and a new task does not start (DiskLimit); ready
    again once space is freed."""
    with tmpfs_data_dir(320 * MIB) as data:
        with Server(args=["--sandbox-provider", "local"], data_dir=data) as srv:
            st, _, body = srv.request("GET", "/readyz", auth=False)
            assert st == 200, (st, body)
            filler = os.path.join(data, "filler")
            fill(filler, leave=200 * MIB)
            st, _, body = srv.request("GET", "/readyz", auth=False)
            assert st == 503, (st, body)
            assert body["reason"] == "LowDisk", body
            assert "less than the reserve of 256 MiB" in body["error"], body
            repo = bare_repo()
            os.chmod(os.path.dirname(repo), 0o755)
            create(srv, runner_task("late", repo, "echo late > late.txt"))
            late = wait_phase(srv, "late", FINISHED, timeout=60)
            assert late["status"]["reason"] == "DiskLimit", late["status"]
            assert "no sandbox starts" in late["status"]["message"], late["status"]
            assert leader_pid(srv, "late") is None
            assert "no sandbox starts" in task_log(srv, "late")
            shutil.rmtree(os.path.dirname(repo), ignore_errors=True)
            os.unlink(filler)
            st, _, body = srv.request("GET", "/readyz", auth=False)
            assert st == 200, (st, body)


def test_writer_under_the_reserve_is_stopped():
    """No per-task limit, but the agent takes the data dir's filesystem under the reserve:
    the biggest running task is stopped (DiskLimit), the database keeps its room and the
    API keeps answering."""
    with tmpfs_data_dir(320 * MIB) as data:
        repo = bare_repo()
        os.chmod(os.path.dirname(repo), 0o755)
        hog = "head -c %d /dev/zero > big.bin; echo written; sleep 600" % (100 * MIB)
        args = ["--sandbox-provider", "local", "--sandbox-disk", "0"]
        with Server(args=args, data_dir=data) as srv:
            create(srv, runner_task("filler", repo, hog))
            body = wait_phase(srv, "filler", FINISHED, timeout=120)
            st = body["status"]
            assert st["phase"] == "Failed" and st["reason"] == "DiskLimit", (
                st, task_log(srv, "filler"))
            assert "reserve of 256 MiB" in st["message"] and "the biggest" in st["message"], st
            # The database still writes: a task is created and deleted.
            create(srv, task("other"))
            code, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/other")
            assert code == 200
            # Deleting the writer frees the space: ready again.
            code, _, _ = srv.request("DELETE", API + "/namespaces/default/agenttasks/filler")
            assert code == 200
            wait_until(lambda: srv.request("GET", "/readyz", auth=False)[0] == 200,
                       what="ready again")
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def delete_on_a_full_filesystem(provider):
    with tmpfs_data_dir(48 * MIB) as data:
        args = ["--sandbox-provider", provider, "--data-dir-reserve", "0", "--sandbox-disk", "0"]
        repo = bare_repo()
        os.chmod(os.path.dirname(repo), 0o755)
        ws = os.path.join(data, "workspaces", "default", "full")
        with Server(args=args, data_dir=data) as srv:
            create(srv, runner_task("full", repo, "echo holding; sleep 600"))
            pid = None
            if provider == "local":
                wait_log(srv, "full", "holding", timeout=60)
                pid = leader_pid(srv, "full")
            else:
                os.makedirs(ws)  # what an external agent left, say
            # What a runaway agent does: its workspace takes every byte.
            fill(os.path.join(ws, "big.bin"), top=data)
            # A write can still find room after the fill: the last page of a file the server
            # had open, or space freed while the fill ran (one fresh-clone CI run stored the
            # first create with 201). Each such create is a write that fit; fill what freed
            # and try again until the database cannot write.
            for i in range(8):
                code, _, body = srv.request("POST", API + "/namespaces/default/agenttasks",
                                            task("cannot%d" % i))
                if code != 201:
                    break
                fill(os.path.join(ws, "more%d.bin" % i), top=data)
            assert code == 500 and "full" in body["error"], (code, body, space_report(data))
            code, _, body = srv.request("DELETE", API + "/namespaces/default/agenttasks/full")
            assert code == 200, (code, body)
            assert not os.path.exists(ws)
            code, _, _ = srv.request("GET", API + "/namespaces/default/agenttasks/full")
            assert code == 404
            if pid is not None:
                wait_until(lambda: not alive(pid), what="the sandbox to be gone")
            # Space is back: the database writes again.
            create(srv, task("again"))
        shutil.rmtree(os.path.dirname(repo), ignore_errors=True)


def test_delete_frees_files_when_the_database_cannot_write():
    """The task's files filled the data dir's filesystem (no reserve configured): writes
    fail, yet DELETE of the task removes its files and succeeds (its sandbox stopped)."""
    delete_on_a_full_filesystem("local")
    delete_on_a_full_filesystem("none")


if __name__ == "__main__":
    why = usable()
    if why:
        print("SKIP test_sandbox_disk: " + why)
        sys.exit(0)
    tests = [test_task_over_sandbox_disk_fails_with_disk_limit,
             test_push_over_max_push_bytes_is_not_sent]
    why = can_mount()
    if why:
        print("SKIP the tmpfs tests of test_sandbox_disk: " + why)
    else:
        tests += [test_readyz_and_starts_below_the_reserve, test_writer_under_the_reserve_is_stopped,
                  test_delete_frees_files_when_the_database_cannot_write]
    run_tests(tests)
