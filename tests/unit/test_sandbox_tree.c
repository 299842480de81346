/* SPDX-License-Identifier: Apache-2.0 */
/* sbx_tree_runs (sandbox/procfs.c): whether a sandbox's program runs yet, found in its
 * leader's process tree by command name. A warm slot is claimed only once its runner runs
 * (controller/slot.c): before that, bubblewrap still reaches the bound folders by name. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"
#include "tests/t_check.h"

#define PROGRAM "diverge-agent-runner"

/* A folder holding PROGRAM, a symbolic link to sleep(1) (the kernel names a process after
 * the file it executed, cut to 15 characters: "diverge-agent-r", which PROGRAM matches). */
static char *program_dir(void)
{
    char tmpl[] = "/tmp/diverge-tree-XXXXXX";
    char *dir = mkdtemp(tmpl), *link;

    CHECK(dir != NULL);
    dir = strdup(dir);
    if (asprintf(&link, "%s/%s", dir, PROGRAM) < 0) {
        abort();
    }
    CHECK_OK(symlink("/bin/sleep", link));
    free(link);
    return dir;
}

static void remove_dir(char *dir)
{
    char *link;

    if (asprintf(&link, "%s/%s", dir, PROGRAM) >= 0) {
        (void)unlink(link);
        free(link);
    }
    (void)rmdir(dir);
    free(dir);
}

/* Starts `sh -c SCRIPT` in a process group of its own, with $D the folder. */
static pid_t start(const char *script, const char *dir)
{
    pid_t pid = fork();

    if (pid == 0) {
        setpgid(0, 0);
        setenv("D", dir, 1);
        execl("/bin/sh", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    CHECK(pid > 0);
    return pid;
}

static void stop(pid_t pid)
{
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Whether PID's tree runs PROGRAM within MS milliseconds. */
static bool runs_within(pid_t pid, int ms)
{
    struct timespec step = {0, 10 * 1000 * 1000};

    for (int waited = 0; waited <= ms; waited += 10) {
        if (sbx_tree_runs(pid, PROGRAM)) {
            return true;
        }
        nanosleep(&step, NULL);
    }
    return false;
}

TEST(tree_runs_only_once_the_program_is_executed)
{
    char *dir = program_dir();
    /* The program two levels down (a child's child), as the runner under bubblewrap's
     * pid 1; not before the wait. */
    pid_t pid = start("sleep 0.5; sh -c '\"$D\"/" PROGRAM " 30 & wait' & wait", dir);

    CHECK(!sbx_tree_runs(pid, PROGRAM));
    CHECK(!runs_within(pid, 200));
    CHECK(runs_within(pid, 10000));
    stop(pid);
    remove_dir(dir);
}

TEST(tree_runs_when_the_leader_itself_is_the_program)
{
    char *dir = program_dir();
    pid_t pid = start("exec \"$D\"/" PROGRAM " 30", dir);

    CHECK(runs_within(pid, 10000));
    stop(pid);
    remove_dir(dir);
}

TEST(tree_of_another_program_or_a_gone_process_does_not_run_it)
{
    char *dir = program_dir();
    pid_t pid = start("sleep 30 & wait", dir);

    CHECK(!runs_within(pid, 300));
    stop(pid);
    CHECK(!sbx_tree_runs(pid, PROGRAM));
    remove_dir(dir);
}

T_MAIN
