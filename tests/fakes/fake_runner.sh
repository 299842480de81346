#!/bin/sh
# A stand-in for diverge-agent-runner (SPEC §9) used by the sandbox tests: clone the
# mirror (or check out the workspace the server made from it), meter once with the token
# file, run $DIVERGE_AGENT_CMD (the test's control channel), commit and push the working
# branch to the staging repo; exit with the agent command's status (0, or 0 on a 429
# like the real runner).
set -u
echo "fake runner: start iteration ${DIVERGE_START_ITERATION:-1} uid $(id -u)"
if [ -n "${DIVERGE_START_GATE_FD:-}" ]; then
    # Started while the server still makes the workspace: wait for its go, as the runner.
    # One byte at a time from the inherited descriptor itself ("c" and "g" may both be
    # there; /proc/self/fd/N of the server's pipe cannot be opened as the sandbox user,
    # and sh redirects no descriptor above 9: bash's read does).
    gate_byte() {
        bash -c 'IFS= read -r -N 1 -u "$1" c && printf %s "$c"' gate "$DIVERGE_START_GATE_FD"
    }
    go=$(gate_byte)
    if [ "$go" = c ]; then
        # The workspace is made; "g" follows once the task is Active (checked out after).
        go=$(gate_byte)
    fi
    if [ "$go" != g ]; then
        echo "fake runner: the server called this start off before it began"
        exit 2
    fi
    echo "fake runner: start gate opened"
fi
cd "$DIVERGE_WORKSPACE_DIR" || exit 10
if [ -f .git/diverge-prepared ]; then
    # The server made the git directory from the mirror (local provider): check it out.
    rm -f .git/diverge-prepared || exit 11
    git checkout -q -f || exit 12
elif [ ! -d .git ] && [ -n "${DIVERGE_REPO_URL:-}" ]; then
    git clone -q --branch "$DIVERGE_BASE_BRANCH" "$DIVERGE_REPO_URL" . || exit 11
    git checkout -q -B "$DIVERGE_WORKING_BRANCH" || exit 12
fi
meter() {
    it=$1
    # Through the server's unix socket when there is one (sandboxes without network).
    set -- "$DIVERGE_METER_URL"
    if [ -n "${DIVERGE_METER_SOCKET:-}" ]; then
        set -- --unix-socket "$DIVERGE_METER_SOCKET" "http://localhost/api/v1/agenttask/meter"
    fi
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(cat "$DIVERGE_TOKEN_FILE")" \
        -H 'Content-Type: application/json' \
        -d "{\"requestId\":\"$DIVERGE_TASK_NAME-$it-$$\",\"iteration\":$it,\"tokensUsed\":10,\"costUSD\":0.01}" \
        "$@")
    echo "fake runner: meter $it -> $code${DIVERGE_METER_SOCKET:+ (unix socket)}"
}
meter "${DIVERGE_START_ITERATION:-1}"
if [ "$code" = 429 ]; then exit 0; fi
if [ -n "${DIVERGE_START_GATE_FD:-}" ]; then
    # The gate is closed before the agent runs, as the runner closes it (bash: sh closes
    # no descriptor above 9).
    bash -c 'g=$1; exec {g}<&-; unset DIVERGE_START_GATE_FD; exec sh -c "$DIVERGE_AGENT_CMD"' \
        agent "$DIVERGE_START_GATE_FD"
else
    sh -c "$DIVERGE_AGENT_CMD"
fi
rc=$?
echo "fake runner: agent exited $rc"
[ $rc -eq 0 ] || exit $rc
if [ -d .git ]; then
    git -c user.name=runner -c user.email=runner@example.invalid add -A
    git -c user.name=runner -c user.email=runner@example.invalid commit -q -m "fix($DIVERGE_TASK_NAME): $DIVERGE_OBJECTIVE" || true
    git push -q "$DIVERGE_PUSH_URL" "HEAD:refs/heads/$DIVERGE_WORKING_BRANCH" || exit 13
fi
echo "fake runner: done"
exit 0
