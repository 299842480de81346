# SPDX-License-Identifier: Apache-2.0
"""A server killed (SIGKILL) during a gateway call (SPEC §13) still charges it: each call's
reservation record is durable before its answer ends, its charge removes it in the same
transaction, and at start every record left is charged its reservation exactly once, under
the call's own request id, with a task-log line. Killed mid-stream, or after the stream
ended but before its charge committed (held back with the tests-only
DIVERGE_TEST_LLM_SETTLE_DELAY_MS, docs/testing.md), the task's spend includes the
reservation once, also after a second restart; a call whose charge did commit is never
charged again. And a call's charge is capped at its reservation: an upstream reporting more
output than the call was allowed cannot take the task past its budget."""
import concurrent.futures
import contextlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
from decimal import Decimal, ROUND_CEILING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fakes"))

from fake_llm import FakeLLM  # noqa: E402
from harness import Server, run_tests  # noqa: E402
from llm_helpers import KEY_ENV, wait_charges, wait_for  # noqa: E402
from sdk_helpers import NS, start_task  # noqa: E402
from test_llm_gateway import post, stream_raw  # noqa: E402

MSG = "/api/v1/llm/anthropic/v1/messages"
KEY = "sk-ant-server-key-restart-93c1"
MODEL = "claude-sonnet-4-5-20250929"
# The built-in price of claude-sonnet-4*, USD per million tokens: a reservation prices its
# input (the body's bytes) at the dearest input kind (cache write), its output at the limit.
CACHE_WRITE, OUTPUT = Decimal("3.75"), Decimal("15.00")
RESTARTED = "the server restarted during the call; charged the reservation"


def body(max_tokens=100, stream=False):
    return {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "say hello"}]}


def reservation(b, max_tokens):
    """(micro-dollars, tokens) the gateway reserves for the client's body B."""
    n = len(json.dumps(b).encode())
    micros = (Decimal(n) * CACHE_WRITE + max_tokens * OUTPUT).to_integral_value(ROUND_CEILING)
    return int(micros), n + max_tokens


def usd(micros):
    return Decimal(micros) / Decimal(1000000)


def server(data, fake, env=None):
    e = {KEY_ENV["anthropic"]: KEY}
    e.update(env or {})
    return Server(["--sandbox-provider", "none", "--llm-upstream", "anthropic=" + fake.url],
                  env=e, data_dir=data)


def spend(srv, name):
    st, _, b = srv.request("GET", NS + "/" + name)
    assert st == 200, b
    return Decimal(b["status"]["costUSD"]), b["status"]["tokensConsumed"], b["status"]


def records(data):
    """The reservation records in the store (read beside the running server)."""
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "diverge.db"), uri=True)
    try:
        return con.execute("SELECT request_id, namespace, name FROM llm_reservations").fetchall()
    finally:
        con.close()


@contextlib.contextmanager
def data_and_fake():
    """A data dir kept across the server's restarts, and the fake upstream."""
    data = tempfile.mkdtemp(prefix="diverge-test-")
    fake = FakeLLM().start()
    try:
        yield data, fake
    finally:
        fake.stop()
        shutil.rmtree(data, ignore_errors=True)


def task_log(data, name):
    try:
        with open(os.path.join(data, "logs", "default", name + ".log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def restart_twice_and_check(data, fake, name, micros, tokens):
    """Restarts the server twice on DATA: after the first start the task's spend is MICROS
    and TOKENS and the log says so once; the second start adds nothing."""
    for _ in range(2):
        with server(data, fake) as srv:
            cost, used, status = spend(srv, name)
            assert cost == usd(micros) and used == tokens, (status, micros, tokens)
            assert records(data) == []
            assert task_log(data, name).count(RESTARTED) == 1, task_log(data, name)


def test_killed_mid_stream_charges_the_reservation_once():
    with data_and_fake() as (data, fake):
        srv = server(data, fake).start()
        tok = start_task(srv, "midway", budgetUSD="5.00")
        paused, resume = threading.Event(), threading.Event()
        # message_start and the text block's start go out; the rest (the usage) never does.
        fake.script.append({"pause_after": 2, "paused": paused, "resume": resume})
        b = body(max_tokens=200, stream=True)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            seen = threading.Event()
            f = ex.submit(stream_raw, srv, MSG, b, {"x-api-key": tok}, (b"message_start", seen))
            assert paused.wait(30), "the stream never reached the fake"
            assert seen.wait(30), "the stream's first events never reached the client"
            wait_for(lambda: len(records(data)) == 1, "the call's reservation record")
            assert spend(srv, "midway")[0] == 0
            srv.kill()
            resume.set()
            st, got, err = f.result()
        assert st == 200 and b"message_start" in got and err is not None, (st, got, err)
        srv.cleanup()
        micros, tokens = reservation(b, 200)
        restart_twice_and_check(data, fake, "midway", micros, tokens)
        line = [ln for ln in task_log(data, "midway").splitlines() if RESTARTED in ln]
        assert line[0].endswith("llm anthropic %s: %s tokens=%d usd=%s"
                                % (MODEL, RESTARTED, tokens, usd(micros).normalize())), line


def test_killed_after_the_answers_ended_before_their_charge():
    """The answers (a stream's last chunk, a whole body) waited only for the records: with
    the charges held back, a kill then leaves both calls to the next start, which charges
    each its reservation, once (not their usage: it was never recorded)."""
    with data_and_fake() as (data, fake):
        srv = server(data, fake, {"DIVERGE_TEST_LLM_SETTLE_DELAY_MS": "600000"}).start()
        tok = start_task(srv, "ended", budgetUSD="5.00")
        sb, wb = body(max_tokens=150, stream=True), body(max_tokens=120)
        st, got, err = stream_raw(srv, MSG, sb, {"x-api-key": tok})
        assert st == 200 and err is None and b"message_stop" in got, (st, got, err)
        st, _, raw = post(srv, MSG, wb, {"x-api-key": tok})
        assert st == 200 and json.loads(raw)["usage"]["output_tokens"] == 50, raw
        # Both answers are whole, neither charge committed; both records are durable.
        assert len(records(data)) == 2
        assert spend(srv, "ended")[0] == 0
        srv.kill()
        srv.cleanup()
        m1, t1 = reservation(sb, 150)
        m2, t2 = reservation(wb, 120)
        for _ in range(2):
            with server(data, fake) as srv:
                cost, used, status = spend(srv, "ended")
                assert cost == usd(m1 + m2) and used == t1 + t2, (status, m1 + m2)
                assert records(data) == []
                assert task_log(data, "ended").count(RESTARTED) == 2


def test_a_committed_charge_is_not_charged_again():
    with data_and_fake() as (data, fake):
        srv = server(data, fake).start()
        tok = start_task(srv, "settled", budgetUSD="5.00")
        st, got, err = stream_raw(srv, MSG, body(stream=True), {"x-api-key": tok})
        assert st == 200 and err is None, (st, got, err)
        wait_charges(srv, "settled", 1)
        real = 100 * 3 + 50 * 15  # the fake's usage: 100 in, 50 out
        assert spend(srv, "settled")[0] == usd(real)
        assert records(data) == []
        srv.kill()
        srv.cleanup()
        with server(data, fake) as srv:
            cost, used, status = spend(srv, "settled")
            assert cost == usd(real) and used == 150, status
            assert RESTARTED not in task_log(data, "settled")


def test_charge_capped_at_the_reservation():
    """An upstream reporting 5000 output tokens for calls allowed 100 is charged no more
    than each call's reservation; the task log says the charge was capped; a task whose
    budget holds only a few such calls never passes it."""
    with data_and_fake() as (data, fake):
        with server(data, fake) as srv:
            tok = start_task(srv, "capped", budgetUSD="0.01")
            fake.usage = {"input": 20, "output": 5000, "cache_write": 0, "cache_read": 0}
            total, tokens, ok = 0, 0, 0
            for stream in (False, True, False, True, False, True, False, True):
                b = body(max_tokens=100, stream=stream)
                if stream:
                    st, got, _ = stream_raw(srv, MSG, b, {"x-api-key": tok})
                else:
                    st, got, _ = post(srv, MSG, b, {"x-api-key": tok})
                if st != 200:
                    assert st in (402, 401), (st, got)
                    continue
                ok += 1
                sent = fake.requests[-1]["body"]["max_tokens"]
                m, t = reservation(b, sent)
                total, tokens = total + m, tokens + t
                wait_charges(srv, "capped", ok)
            assert ok >= 2, ok
            cost, used, status = spend(srv, "capped")
            assert cost == usd(total) and used == tokens, (status, total, tokens)
            assert cost <= Decimal("0.01"), status
            log = task_log(data, "capped")
            assert log.count("output=5000 cache_write=0 cache_read=0 usd=") == ok, log
            assert log.count("(capped at the call's reservation: the upstream reported more "
                             "than the call was allowed)") == ok, log


if __name__ == "__main__":
    run_tests([test_killed_mid_stream_charges_the_reservation_once,
               test_killed_after_the_answers_ended_before_their_charge,
               test_a_committed_charge_is_not_charged_again,
               test_charge_capped_at_the_reservation])
