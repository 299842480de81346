# SPDX-License-Identifier: Apache-2.0
"""The README as a script: every ```sh block, top to bottom, on a fresh data dir, as a
reader on a fresh machine would run them (readme_walk.py says how servers, ports and
/tmp are handled). Blocks marked `<!-- walk: skip (why) -->` need GitHub, GitLab, Docker
or a cluster and are left out. Any command that exits non-zero fails the walk; a few
blocks' results the README promises in its comments are checked too."""
import os
import sys

import npm_pin
import readme_walk
from harness import run_tests

sys.path.insert(0, os.path.dirname(__file__))
from test_kubectl import kubectl_bin  # noqa: E402

# What the README's comments promise, by section: text the section's output must hold.
PROMISED = {
    "First thing to try": ["fix(fix-pr-1): the typo in greeting.txt",
                           "⏳ Queued — position 1 · `fix-pr-1` · run 2", "Pending (queued #1)",
                           "run 2 requested: objective \"say hello once more\""],
    "A task that really runs": ["fix(demo): fix the greeting", "Completed"],
    "Metering from your agent": ["metered: 1500 tokens, 0.0225 USD in total",
                                 "metered: 3000 tokens, 0.045 USD in total"],
    "The demo agent and repository": ["fix(by-hand): fix the greeting"],
    "ConnectRPC": ['"name":"fix-checkout-connect"', '"budgetUSD":"20.00"'],
    "kubectl against a single server": ["agenttask.divergedev.com/fix-checkout-latency created",
                                        'agenttask.divergedev.com "fix-checkout-latency" deleted'],
}


def test_skip_markers_name_a_reason():
    blocks = readme_walk.shell_blocks()
    assert len(blocks) >= 10, blocks
    for b in blocks:
        assert b.skip != "marked", "%r: say why it is skipped" % b


def test_readme_runs_top_to_bottom():
    kubectl_dir = os.path.dirname(kubectl_bin())
    npm_pin.ensure_node()
    ran, out = [], {}
    with readme_walk.Walk(extra_path=[kubectl_dir]) as walk:
        for b in readme_walk.shell_blocks():
            if b.skip:
                print("skip %r: %s" % (b, b.skip), flush=True)
                continue
            text = walk.run(b)
            ran.append(b)
            for key in PROMISED:
                if b.section.startswith(key):
                    out[key] = out.get(key, "") + text
        walk.stop()
        # the npm line leaves nothing but the git-ignored node_modules/ behind
        assert not os.path.exists(os.path.join(walk.dir, "package.json"))
        assert not os.path.exists(os.path.join(walk.dir, "package-lock.json"))
    for key, texts in PROMISED.items():
        for t in texts:
            assert t in out.get(key, ""), (key, t, out.get(key))
    assert walk.servers >= 5, walk.servers
    print("ran %d blocks, started %d servers" % (len(ran), walk.servers))


if __name__ == "__main__":
    run_tests([test_skip_markers_name_a_reason, test_readme_runs_top_to_bottom])
