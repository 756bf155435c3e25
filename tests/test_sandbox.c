/* The sandbox (vks_sandbox.h) and code tasks (vks_tasks.h): hostile programs
 * (endless loops, fork bombs, an 8 GB allocation, a flood of output, a
 * network client, writes outside) end with the right result and leave the
 * machine as it was; code task lines, their rewards and reasons; `vkswarm
 * tasks score` end to end. */
#include "test_util.h"
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const py[] = {"/usr/bin/python3", "-I", "main.py", NULL};

static vks_sandbox_job program(const char *code, const char *input) {
    return (vks_sandbox_job){.argv = py, .file_name = "main.py", .file_data = code, .file_len = strlen(code),
                             .input = input, .input_len = input ? strlen(input) : 0};
}

static void run_one(const char *code, const char *input, const vks_sandbox_limits *l, vks_sandbox_result *r) {
    vks_sandbox_job job = program(code, input);
    assert_int_equal(vks_sandbox_run(&job, 1, l, 1, r), VKS_OK);
}

static void test_sandbox_available(void **state) {
    (void)state;
    /* tools/install-deps installs bubblewrap: a machine where it cannot run fails here, saying why */
    if (vks_sandbox_check()) fail_msg("%s", vks_last_error());
}

/* Exit status, standard input and output, and the stderr kept for the reason. */
static void test_sandbox_io(void **state) {
    (void)state;
    vks_sandbox_result r;
    run_one("import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)", "abc\ndef", NULL, &r);
    assert_int_equal(r.end, VKS_SANDBOX_EXITED);
    assert_int_equal(r.code, 3);
    assert_string_equal(r.out, "ABC\nDEF");
    vks_sandbox_results_free(&r, 1);
    run_one("raise ValueError('bad thing')", NULL, NULL, &r);
    char why[300];
    vks_sandbox_describe(&r, NULL, why, sizeof why);
    assert_string_equal(why, "exit status 1: ValueError: bad thing");
    vks_sandbox_results_free(&r, 1);
    /* the program sees its own namespaces: PID 2 (bwrap is PID 1), no host users, an empty environment */
    run_one("import os\nprint(os.getpid(), sorted(os.environ))", NULL, NULL, &r);
    assert_int_equal(r.end, VKS_SANDBOX_EXITED);
    assert_string_equal(r.out, "2 ['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE']\n"); /* PWD: the shell's */
    vks_sandbox_results_free(&r, 1);
}

/* Time: a busy loop hits the CPU limit (SIGXCPU) long before its wall clock (generous: a loaded
 * machine gives it a share of a core), a sleeper the wall clock. */
static void test_sandbox_time(void **state) {
    (void)state;
    vks_sandbox_limits busy = {.cpu_s = 1, .wall_s = 60}, idle = {.cpu_s = 1, .wall_s = 2};
    vks_sandbox_result r;
    run_one("while True: pass", NULL, &busy, &r);
    assert_int_equal(r.end, VKS_SANDBOX_SIGNALED);
    assert_int_equal(r.code, 24 /* SIGXCPU */);
    assert_true(r.wall_s < 60);
    vks_sandbox_results_free(&r, 1);
    run_one("import time\ntime.sleep(60)", NULL, &idle, &r);
    assert_int_equal(r.end, VKS_SANDBOX_TIMEOUT);
    assert_true(r.wall_s >= 2 && r.wall_s < 10);
    vks_sandbox_results_free(&r, 1);
}

/* Memory, processes, output and file size. */
static void test_sandbox_limits(void **state) {
    (void)state;
    vks_sandbox_limits l = {.wall_s = 10, .processes = 16, .output_bytes = 100000, .file_bytes = 1 << 20};
    vks_sandbox_job jobs[4] = {
        program("x = bytearray(8 << 30)\nprint('allocated')", NULL),
        /* a fork bomb: counts what it got; the children wait, so every one is alive at once */
        program("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
                "            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)", NULL),
        program("while True: print('x' * 1000)", NULL),
        program("f = open('/tmp/big', 'wb')\ntry:\n    f.write(b'x' * (4 << 20)); f.flush()\nexcept OSError as e:\n"
                "    print('refused', e.errno)", NULL)};
    vks_sandbox_result r[4];
    assert_int_equal(vks_sandbox_run(jobs, 4, &l, 4, r), VKS_OK);
    assert_int_equal(r[0].end, VKS_SANDBOX_EXITED);
    assert_int_equal(r[0].code, 1);
    assert_non_null(strstr(r[0].err, "MemoryError"));
    assert_int_equal(r[1].end, VKS_SANDBOX_EXITED);
    int forks = atoi(r[1].out);
    assert_true(forks >= 8 && forks < 16); /* 16 processes, the shell's and the program's included */
    assert_int_equal(r[2].end, VKS_SANDBOX_OUTPUT);
    assert_int_equal((int)r[2].out_len, 100000);
    /* RLIMIT_FSIZE (SIGXFSZ is ignored by Python: EFBIG, 27) or the full /tmp (ENOSPC, 28), both 1 MiB */
    assert_int_equal(r[3].end, VKS_SANDBOX_EXITED);
    assert_true(!strcmp(r[3].out, "refused 27\n") || !strcmp(r[3].out, "refused 28\n"));
    vks_sandbox_results_free(r, 4);
}

/* No network: a listener on the host's 127.0.0.1 cannot be reached. No writes outside. */
static void test_sandbox_isolation(void **state) {
    (void)state;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s, 4), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
    char code[1024], outside[600];
    const char *dir = tu_tmpdir();
    snprintf(outside, sizeof outside, "%s/escaped", dir);
    snprintf(code, sizeof code,
             "import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=2)\n    print('connected')\n"
             "except OSError:\n    print('no network')\n"
             "for p in ['%s', '/usr/escaped', '/escaped', '/tmp/inside']:\n"
             "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n    except OSError:\n"
             "        print('refused', p)\n",
             ntohs(a.sin_port), outside);
    vks_sandbox_result r;
    run_one(code, NULL, NULL, &r);
    assert_int_equal(r.end, VKS_SANDBOX_EXITED);
    char want[1200];
    snprintf(want, sizeof want, "no network\nrefused %s\nrefused /usr/escaped\nrefused /escaped\nwrote /tmp/inside\n",
             outside);
    assert_string_equal(r.out, want);
    vks_sandbox_results_free(&r, 1);
    assert_int_not_equal(access(outside, F_OK), 0);
    assert_int_not_equal(access("/usr/escaped", F_OK), 0);
    assert_int_not_equal(access("/tmp/inside", F_OK), 0); /* /tmp inside was its own */
    close(s);
}

/* Many jobs, fewer at once: every result in its place. */
static void test_sandbox_parallel(void **state) {
    (void)state;
    enum { N = 12 };
    vks_sandbox_job jobs[N];
    char inputs[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(inputs[i], sizeof inputs[i], "%d", i);
        jobs[i] = program("print(int(input()) * 7)", inputs[i]);
    }
    vks_sandbox_result r[N];
    assert_int_equal(vks_sandbox_run(jobs, N, NULL, 3, r), VKS_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i].end, VKS_SANDBOX_EXITED);
        assert_int_equal(atoi(r[i].out), 7 * i);
    }
    vks_sandbox_results_free(r, N);
}

static void test_code_block(void **state) {
    (void)state;
    static const struct { const char *text, *block; } cases[] = {
        {"```python\nprint(1)\n```", "print(1)\n"},
        {"first\n```\na\n```\nthen\n```py\nb\nc\n```\nend", "b\nc\n"},
        {"```\na\n```\n```\nunclosed", "a\n"},
        {"  ```\nindented fence\n  ```", "indented fence\n"},
        {"no fence at all", NULL},
        {"```\nnever closed", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t start = 0, len = 0;
        bool found = vks_task_code_block(cases[i].text, strlen(cases[i].text), &start, &len);
        assert_int_equal(found, cases[i].block != NULL);
        if (found) {
            assert_int_equal(len, strlen(cases[i].block));
            assert_memory_equal(cases[i].text + start, cases[i].block, len);
        }
    }
}

static const char *write_file(const char *name, const char *text) {
    static char path[2][600];
    static int k;
    char *p = path[k++ % 2];
    snprintf(p, 600, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static const char code_tasks[] =
    "{\"prompt\": \"double n\", \"task_type\": \"code\", \"tests\": [{\"input\": \"3\\n\", \"output\": \"6\\n\"}, "
    "{\"input\": \"10\", \"output\": \"20\"}, {\"input\": \"-1\", \"output\": \"-2\"}]}\n"
    "{\"prompt\": \"double n, partly\", \"task_type\": \"code\", \"reward\": \"fraction\", \"tests\": [{\"input\": \"3\\n\", "
    "\"output\": \"6\\n\"}, {\"input\": \"10\", \"output\": \"20\"}, {\"input\": \"-1\", \"output\": \"-2\"}]}\n"
    "{\"prompt\": \"add\", \"task_type\": \"code\", \"test_code\": \"assert add(2, 3) == 5\", \"time_limit_s\": 1}\n"
    "\n"
    "{\"prompt\": \"2+2\", \"answer\": \"4\", \"task_type\": \"numeric\"}\n";

/* Rewards and reasons of code tasks (all or nothing, fraction, test_code) beside an answer task. */
static void test_code_task_rewards(void **state) {
    (void)state;
    vks_task *tasks = NULL;
    int64_t n = 0;
    assert_int_equal(vks_task_file_load(write_file("code.jsonl", code_tasks), &tasks, &n), VKS_OK);
    assert_int_equal(n, 4);
    assert_int_equal(tasks[0].verify, VKS_VERIFY_CODE);
    assert_int_equal(tasks[0].code->n_cases, 3);
    assert_string_equal(tasks[0].code->output[1], "20");
    assert_true(tasks[1].code->fraction);
    assert_string_equal(tasks[2].code->test_code, "assert add(2, 3) == 5");
    assert_true(tasks[2].code->time_limit_s == 1);
    assert_int_equal(tasks[3].line, 5);
    assert_null(tasks[3].code);
    assert_ptr_equal(vks_task_first_code(tasks + 3, 1), NULL);
    static const struct { int task; const char *text; double reward; const char *why; } cases[] = {
        {0, "```python\nprint(int(input()) * 2)   \n\n\n```", 1, "all 3 cases passed"},
        {0, "```python\nprint(abs(int(input())) * 2)\n```", 0, "2 of 3 cases passed; case 3: expected '-2', got '2'"},
        {1, "```python\nprint(abs(int(input())) * 2)\n```", 2.0 / 3, "2 of 3 cases passed; case 3: expected '-2', got '2'"},
        {0, "```python\nprint(\n```", 0, "0 of 3 cases passed; case 1: exit status 1: SyntaxError: '(' was never closed"},
        {0, "print(int(input()) * 2)", 0, "no complete ``` code block"},
        {2, "```\ndef add(a, b):\n    return a + b\n```", 1, "passed"},
        {2, "```\ndef add(a, b):\n    return a - b\n```", 0, "test_code failed: exit status 1: AssertionError"},
        {2, "```\ndef add(a, b):\n    while True: pass\n```", 0, "test_code failed: killed by SIGXCPU (over the CPU time limit)"},
        {3, "answer: 4", 1, "answer '4' matches, expected '4'"},
        {3, "answer: 5", 0, "answer '5', expected '4'"},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    const vks_task *which[N];
    const char *texts[N];
    size_t lens[N];
    double rewards[N];
    char why[N][VKS_TASK_MAX_WHY];
    for (int i = 0; i < N; i++) which[i] = &tasks[cases[i].task], texts[i] = cases[i].text, lens[i] = strlen(texts[i]);
    for (int parallel = 1; parallel <= 4; parallel += 3) {
        memset(rewards, 0xff, sizeof rewards); /* poisoned */
        assert_int_equal(vks_task_score_many(which, texts, lens, N, parallel, rewards, why), VKS_OK);
        for (int i = 0; i < N; i++) {
            assert_true(fabs((rewards[i]) - (cases[i].reward)) <= 1e-15);
            assert_string_equal(why[i], cases[i].why);
        }
    }
    /* vks_task_score (one completion) agrees */
    assert_true(fabs((vks_task_score(&tasks[0], texts[0], lens[0])) - (1)) <= 0);
    assert_true(fabs((vks_task_score(&tasks[0], texts[1], lens[1])) - (0)) <= 0);
    vks_task_free(tasks, n);
}

/* Malformed code task lines are refused with the file, the line and the problem. */
static void test_code_task_errors(void **state) {
    (void)state;
    static const struct { const char *line, *error; } cases[] = {
        {"{\"prompt\": \"p\", \"task_type\": \"code\"}", "a code task needs \"tests\" or \"test_code\" (one of them)"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"tests\": [], \"test_code\": \"x\"}",
         "a code task needs \"tests\" or \"test_code\" (one of them)"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"tests\": []}",
         "\"tests\" is not an array of 1 to 256 {\"input\", \"output\"} cases"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"tests\": [{\"input\": \"1\"}]}",
         "\"tests\"[0].output is not a string"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"tests\": [3]}", "\"tests\"[0] is not an object"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"test_code\": \"x\", \"time_limit_s\": 0}",
         "\"time_limit_s\" is not a number above 0 and at most 60"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"test_code\": \"x\", \"memory_mb\": 100000}",
         "\"memory_mb\" is not an integer from 32 to 16384"},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"test_code\": \"x\", \"reward\": \"half\"}",
         "\"reward\" is not \"all\" or \"fraction\""},
        {"{\"prompt\": \"p\", \"task_type\": \"code\", \"test_code\": \"x\", \"answer\": \"1\"}",
         "a code task has tests, not an \"answer\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024], want[1200];
        snprintf(text, sizeof text, "{\"prompt\": \"ok\", \"task_type\": \"code\", \"test_code\": \"pass\"}\n%s\n",
                 cases[i].line);
        const char *path = write_file("bad.jsonl", text);
        vks_task *tasks = (vks_task *)1;
        int64_t n = 1;
        assert_int_equal(vks_task_file_load(path, &tasks, &n), VKS_ERR_FORMAT);
        assert_null(tasks);
        snprintf(want, sizeof want, "%s: line 2: %s", path, cases[i].error);
        assert_string_equal(vks_last_error(), want);
    }
}

/* `vkswarm tasks score`: one JSON line per completion; a bad completions file refused whole (status 2). */
static void test_cli_tasks_score(void **state) {
    (void)state;
    char tasks[600], comps[600], cmd[2000];
    snprintf(tasks, sizeof tasks, "%s", write_file("t.jsonl", code_tasks));
    snprintf(comps, sizeof comps, "%s",
             write_file("c.jsonl", "{\"task\": 1, \"id\": \"a\", \"completion\": \"```\\nprint(int(input())*2)\\n```\"}\n"
                                   "{\"task\": 5, \"id\": 7, \"completion\": \"answer: 3\"}\n"
                                   "{\"task\": 3, \"completion\": \"```\\nimport os\\nos.system('echo hi')\\n```\"}\n"));
    snprintf(cmd, sizeof cmd, "%s tasks score --task %s --completions %s --parallel 2", tu_bin(), tasks, comps);
    char *out = NULL;
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out,
                        "{\"id\": \"a\", \"line\": 1, \"task\": 1, \"reward\": 1, \"why\": \"all 3 cases passed\"}\n"
                        "{\"id\": 7, \"line\": 2, \"task\": 5, \"reward\": 0, \"why\": \"answer '3', expected '4'\"}\n"
                        "{\"line\": 3, \"task\": 3, \"reward\": 0, \"why\": \"test_code failed: exit status 1: "
                        "NameError: name 'add' is not defined\"}\n");
    free(out);
    /* a line naming no task: nothing scored, nothing on stdout */
    snprintf(comps, sizeof comps, "%s",
             write_file("c2.jsonl", "{\"task\": 1, \"completion\": \"x\"}\n{\"task\": 4, \"completion\": \"x\"}\n"));
    snprintf(cmd, sizeof cmd, "%s tasks score --task %s --completions %s 2>&1 >/dev/null", tu_bin(), tasks, comps);
    assert_int_equal(tu_run(cmd, &out), 2);
    char want[1400];
    snprintf(want, sizeof want, "vkswarm: tasks score: %s: line 2: \"task\": line 4 of the task file holds no task\n",
             comps);
    assert_string_equal(out, want);
    free(out);
}

/* The built-in code task: golden instances (a change of the generator shows here), its worked
 * completion passes its own tests, a wrong program is named with the first x it gets wrong. */
static void test_builtin_code_task(void **state) {
    (void)state;
    vks_task_spec spec;
    vks_task t;
    assert_int_equal(vks_task_parse("code", &spec), VKS_OK);
    assert_int_equal(vks_task_generate(&spec, 0, 0, &t), VKS_OK);
    assert_string_equal(t.prompt, "Write a Python function f(x) that returns 7*x+6. Reply with the code in a ```python "
                                  "block.\n");
    assert_string_equal(t.answer, "def f(x): return 7*x+6");
    assert_int_equal(t.verify, VKS_VERIFY_CODE);
    assert_null(t.code);
    assert_ptr_equal(vks_task_first_code(&t, 1), &t);
    char worked[512];
    assert_int_equal(vks_task_worked_completion(&t, worked, sizeof worked), VKS_OK);
    assert_string_equal(worked, "```python\ndef f(x):\n    return 7*x+6\n```");
    vks_task u;
    assert_int_equal(vks_task_parse("code:2:short", &spec), VKS_OK);
    assert_int_equal(vks_task_generate(&spec, 0, 0, &u), VKS_OK);
    assert_string_equal(u.prompt, "python f(x)=4*x*x+3*x+9\n");
    char worked_u[512];
    assert_int_equal(vks_task_worked_completion(&u, worked_u, sizeof worked_u), VKS_OK);
    const vks_task *which[4] = {&t, &t, &u, &u};
    const char *texts[4] = {worked, "```python\ndef f(x): return 7*x+6 if x >= 0 else 0\n```", worked_u,
                            "```\ndef f(x): return 4*x*x+3*x+9.5\n```"};
    size_t lens[4];
    for (int i = 0; i < 4; i++) lens[i] = strlen(texts[i]);
    double rewards[4];
    char why[4][VKS_TASK_MAX_WHY];
    assert_int_equal(vks_task_score_many(which, texts, lens, 4, 0, rewards, why), VKS_OK);
    assert_true(rewards[0] == 1 && rewards[1] == 0 && rewards[2] == 1 && rewards[3] == 0);
    assert_string_equal(why[0], "passed");
    assert_string_equal(why[1], "test_code failed: exit status 1: AssertionError: f(-3) = 0, expected -15");
    assert_string_equal(why[3], "test_code failed: exit status 1: AssertionError: f(-3) = 36.5, expected 36");
}

/* A long-lived program: asked a line at a time; one that crashes, hangs, answers twice or writes
 * unasked is named with what it did, and stopped. Sandboxed it runs in its directory (read-only);
 * unsandboxed it may write there. */
static const char rubric_py[] =
    "import json, sys, time\n"
    "print('started', file=sys.stderr, flush=True)\n"
    "for line in sys.stdin:\n"
    "    q = json.loads(line)\n"
    "    c = q['completion']\n"
    "    if c == 'crash': raise RuntimeError('asked to crash')\n"
    "    if c == 'hang': time.sleep(60)\n"
    "    if c == 'twice': print('{}'); print('{}')\n"
    "    if c == 'write':\n"
    "        try:\n"
    "            open('written', 'w').write('x'); print(json.dumps({'reward': 1}), flush=True)\n"
    "        except OSError:\n"
    "            print(json.dumps({'reward': 0}), flush=True)\n"
    "        continue\n"
    "    print(json.dumps({'reward': len(c), 'helper': open('helper.txt').read()}), flush=True)\n";

static void test_sandbox_proc(void **state) {
    (void)state;
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(path, sizeof path, "%s/rubric.py", dir);
    FILE *f = fopen(path, "w");
    fputs(rubric_py, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/helper.txt", dir);
    f = fopen(path, "w");
    fputs("hi", f);
    fclose(f);
    for (int sandboxed = 1; sandboxed >= 0; sandboxed--) {
        vks_sandbox_proc_spec spec = {.command = "python3 rubric.py", .dir = dir, .sandboxed = sandboxed};
        vks_sandbox_proc *p = NULL;
        assert_int_equal(vks_sandbox_proc_start(&spec, NULL, &p), VKS_OK);
        char *reply = NULL;
        for (int i = 0; i < 3; i++) {
            char q[64], want[64];
            snprintf(q, sizeof q, "{\"completion\": \"%.*s\"}", i + 1, "abc");
            assert_int_equal(vks_sandbox_proc_request(p, q, strlen(q), 10, &reply), VKS_OK);
            snprintf(want, sizeof want, "{\"reward\": %d, \"helper\": \"hi\"}", i + 1);
            assert_string_equal(reply, want);
            free(reply);
        }
        const char *w = "{\"completion\": \"write\"}";
        assert_int_equal(vks_sandbox_proc_request(p, w, strlen(w), 10, &reply), VKS_OK);
        assert_string_equal(reply, sandboxed ? "{\"reward\": 0}" : "{\"reward\": 1}");
        free(reply);
        const char *crash = "{\"completion\": \"crash\"}";
        assert_int_equal(vks_sandbox_proc_request(p, crash, strlen(crash), 10, &reply), VKS_ERR_IO);
        assert_null(reply);
        assert_string_equal(vks_last_error(), "'python3 rubric.py' ended: exit status 1; its last words: "
                                              "RuntimeError: asked to crash");
        assert_int_equal(vks_sandbox_proc_request(p, w, strlen(w), 10, &reply), VKS_ERR_IO); /* stopped */
        vks_sandbox_proc_stop(p);
    }
    snprintf(path, sizeof path, "%s/written", dir);
    assert_int_equal(access(path, F_OK), 0); /* the unsandboxed run wrote it */
    static const struct { const char *completion; double timeout_s; int rc; const char *error; } bad[] = {
        {"hang", 1.5, VKS_ERR_TIMEOUT, "'python3 rubric.py' gave no answer in time; its last words: started"},
        {"twice", 20, VKS_ERR_FORMAT, "'python3 rubric.py' answered more than one line; its last words: started"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vks_sandbox_proc_spec spec = {.command = "python3 rubric.py", .dir = dir, .sandboxed = true};
        vks_sandbox_proc *p = NULL;
        assert_int_equal(vks_sandbox_proc_start(&spec, NULL, &p), VKS_OK);
        char q[64], *reply = NULL;
        snprintf(q, sizeof q, "{\"completion\": \"%s\"}", bad[i].completion);
        double t0 = (double)time(NULL);
        int rc = vks_sandbox_proc_request(p, q, strlen(q), bad[i].timeout_s, &reply);
        if (bad[i].rc == VKS_ERR_FORMAT && rc == VKS_OK) { /* the second line came after the first was read */
            free(reply);
            rc = vks_sandbox_proc_request(p, q, strlen(q), bad[i].timeout_s, &reply);
        }
        assert_int_equal(rc, bad[i].rc);
        if (rc == VKS_ERR_FORMAT && strstr(vks_last_error(), "outside a request")) /* the lines came apart */
            assert_string_equal(vks_last_error(), "'python3 rubric.py' wrote to standard output outside a request; "
                                                  "its last words: started");
        else assert_string_equal(vks_last_error(), bad[i].error);
        assert_true((double)time(NULL) - t0 < bad[i].timeout_s + 5);
        vks_sandbox_proc_stop(p);
    }
}


/* Programs of a test, each written to dir/NAME. */
typedef struct {
    const char *name, *code;
} program_file;

static void write_programs(const char *dir, const program_file *programs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", dir, programs[i].name);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(programs[i].code, f);
        fclose(f);
    }
}

/* Reward programs ("task_type": "program"): a Python rubric scores as written, with the line's
 * answer and info passed on; one that crashes, hangs or lies (NaN, text, a reward above 1) is
 * named with the task line after it was started VKS_TASK_PROGRAM_RESTARTS + 1 times; one that
 * fails once is started again and goes on. */
static void test_reward_programs(void **state) {
    (void)state;
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    static const program_file programs[] = {
        {"rubric.py", "import json, sys\n"
                      "for line in sys.stdin:\n"
                      "    q = json.loads(line)\n"
                      "    r = 0.25 * len(q['completion'].split()) + (0.5 if q['answer'] in q['completion'] else 0)\n"
                      "    print(json.dumps({'reward': min(r, 1), 'metrics': {'k': q['info']['k'], 'p': q['prompt']}}),"
                      " flush=True)\n"},
        {"crash.py", "import sys\nsys.stdin.readline()\nraise SystemExit('no way')\n"},
        {"hang.py", "import sys, time\nsys.stdin.readline()\ntime.sleep(60)\n"},
        {"nan.py", "import sys\nfor line in sys.stdin: print('NaN', flush=True)\n"},
        {"text.py", "import sys\nfor line in sys.stdin: print('{\"reward\": \"high\"}', flush=True)\n"},
        {"big.py", "import sys\nfor line in sys.stdin: print('{\"reward\": 1.5}', flush=True)\n"},
        {"half.py", "import sys\nfor line in sys.stdin: print('{\"reward\": 0.5, \"metrics\": {\"h\": 1}}', flush=True)\n"},
        /* unsandboxed, it leaves a mark in its directory: the first start fails, the second answers */
        {"once.py", "import os, sys\n"
                    "if not os.path.exists('mark'):\n    open('mark', 'w').close(); raise SystemExit(3)\n"
                    "for line in sys.stdin: print('{\"reward\": 1}', flush=True)\n"},
    };
    write_programs(dir, programs, sizeof programs / sizeof programs[0]);
    snprintf(path, sizeof path, "%s/tasks.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"prompt\": \"say 42\", \"task_type\": \"program\", \"program\": \"python3 rubric.py\", \"answer\": 42, "
          "\"info\": {\"k\": 7}}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 crash.py\"}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 hang.py\", \"timeout_s\": 1}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 nan.py\"}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 text.py\"}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 big.py\"}\n"
          "{\"prompt\": \"p\", \"task_type\": \"program\", \"program\": \"python3 once.py\", \"sandbox\": false}\n"
          "{\"prompt\": \"say 42\", \"task_type\": \"program\", \"answer\": 42, \"info\": {\"k\": 7}, \"rubric\": "
          "[{\"program\": \"python3 rubric.py\", \"weight\": 3}, {\"program\": \"python3 half.py\", \"weight\": 1}]}\n", f);
    fclose(f);
    vks_task *tasks = NULL;
    int64_t n = 0;
    assert_int_equal(vks_task_file_load(path, &tasks, &n), VKS_OK);
    assert_int_equal(n, 8);
    assert_string_equal(tasks[0].program->dir, dir);
    assert_string_equal(tasks[0].program->info_json, "{\"k\":7}");
    assert_string_equal(tasks[0].answer, "42");
    assert_true(tasks[0].program->sandboxed && !tasks[6].program->sandboxed);
    const vks_task *which[3] = {&tasks[0], &tasks[0], &tasks[6]};
    const char *texts[3] = {"it is 42", "no", "x"};
    size_t lens[3] = {8, 2, 1};
    double rewards[3];
    char why[3][VKS_TASK_MAX_WHY];
    assert_int_equal(vks_task_score_many(which, texts, lens, 3, 0, rewards, why), VKS_OK);
    assert_true(rewards[0] == 1.0 && rewards[1] == 0.25 && rewards[2] == 1.0);
    assert_string_equal(why[0], "reward program: 1; metrics {\"k\":7,\"p\":\"say 42\"}");
    /* a rubric: the weights 3 and 1 become 0.75 and 0.25; rubric.py gives 1 and 0.25, half.py 0.5 */
    const vks_task *rub[2] = {&tasks[7], &tasks[7]};
    assert_int_equal(vks_task_score_many(rub, texts, lens, 2, 0, rewards, why), VKS_OK);
    assert_true(rewards[0] == 0.875 && rewards[1] == 0.3125);
    assert_string_equal(why[0], "rubric: 0.75*1 + 0.25*0.5 = 0.875; metrics {\"k\":7,\"p\":\"say 42\"} {\"h\":1}");
    static const struct { const char *line, *msg; } bad[] = {
        {"\"program\": \"a\", \"rubric\": [{\"program\": \"b\"}]", "a program task has \"program\" or \"rubric\", not both"},
        {"\"rubric\": []", "\"rubric\" is not a list of 1 to 8"},
        {"\"rubric\": [{\"program\": \"b\", \"weight\": -1}]", "rubric entry 1: \"weight\" is not a number above 0"},
        {"\"rubric\": [{\"program\": \"b\"}, {\"program\": \"c\", \"weight\": \"x\"}]", "rubric entry 2: \"weight\" is not"},
        {"\"rubric\": [{\"program\": \"b\", \"weight\": 1, \"w\": 2}]", "rubric entry 1 is not {\"program\": ..., \"weight\": ...}"},
        {"\"rubric\": [{\"weight\": 1, \"x\": 2}]", "rubric entry 1 needs \"program\""},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char bad_path[420];
        snprintf(bad_path, sizeof bad_path, "%s/bad.jsonl", dir);
        FILE *b = fopen(bad_path, "w");
        fprintf(b, "{\"prompt\": \"p\", \"task_type\": \"program\", %s}\n", bad[k].line);
        fclose(b);
        vks_task *bt = NULL;
        int64_t bn = 0;
        assert_int_not_equal(vks_task_file_load(bad_path, &bt, &bn), VKS_OK);
        if (!strstr(vks_last_error(), bad[k].msg)) fail_msg("'%s': '%s'", bad[k].line, vks_last_error());
    }
    static const char *const errors[] = {
        "'python3 crash.py' ended: exit status 1; its last words: no way",
        "'python3 hang.py' gave no answer in time",
        "'python3 nan.py' answered 'NaN', not a JSON object",
        "'python3 text.py' answered '{\"reward\": \"high\"}' without a number \"reward\"",
        "'python3 big.py' answered reward 1.5, not a number from 0 to 1",
    };
    for (int k = 0; k < 5; k++) {
        const vks_task *t = &tasks[1 + k];
        const char *text = "x";
        size_t len = 1;
        double r = -1;
        assert_int_not_equal(vks_task_score_many(&t, &text, &len, 1, 0, &r, NULL), VKS_OK);
        char want[400];
        snprintf(want, sizeof want, "reward program (task line %d; started 3 times): %s", 2 + k, errors[k]);
        assert_string_equal(vks_last_error(), want);
    }
    vks_task_programs_stop();
    vks_task_free(tasks, n);
}

/* The RL config's "reward" scores plain task lines (their own check, exact, gives no metrics) with
 * a rubric; the run's metrics.jsonl carries what its programs answer: "program.NAME", the mean
 * over the step's completions of each number (true as 1); text values and names metrics.jsonl
 * cannot carry left out. Two programs of the rubric naming one metric share its mean. The report
 * draws a curve of each. */
static void test_reward_program_metrics(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[700], cmd[2400];
    static const char *const progs[][2] = {
        {"m1.py", "import json, sys\nfor line in sys.stdin:\n    c = json.loads(line)['completion']\n"
                  "    print(json.dumps({'reward': min(len(c), 20) / 20, 'metrics': {'chars': len(c), 'const': 3, "
                  "'flag': True, 'bad name!': 1, 's': 'text'}}), flush=True)\n"},
        {"m2.py", "import sys\nfor line in sys.stdin: print('{\"reward\": 0.5, \"metrics\": {\"const\": 3}}', flush=True)\n"},
    };
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, progs[i][0]);
        FILE *f = fopen(path, "w");
        fputs(progs[i][1], f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 4; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\", \"task_type\": \"exact\"}\n", i, i, 2 * i);
    fclose(f);
    snprintf(path, sizeof path, "%s/run.json", dir);
    f = fopen(path, "w");
    fputs("{\"reward\": {\"rubric\": [{\"program\": \"python3 m1.py\"}, {\"program\": \"python3 m2.py\"}]}}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --config run.json --init tiny --task t.jsonl --steps 2 --async-level 0 --out o "
             "--set prompts_per_step=2 --set group_size=4 --set max_new_tokens=8 > /dev/null 2> rl.err", dir, tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(path, sizeof path, "%s/o/metrics.jsonl", dir);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(vks_file_read_all(path, 1 << 20, &text, &len), VKS_OK);
    char *grown = realloc(text, len + 1); /* NUL-terminated, for strtok */
    assert_non_null(grown);
    text = grown, text[len] = 0;
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        double chars = -1;
        const char *at = strstr(line, "\"program.chars\":");
        if (at) chars = strtod(at + strlen("\"program.chars\":"), NULL);
        if (!strstr(line, "\"program.const\":3") || !strstr(line, "\"program.flag\":1") || !(chars >= 0 && chars <= 200) ||
            strstr(line, "bad name") || strstr(line, "program.s\""))
            fail_msg("metrics line %d: %s", lines + 1, line);
    }
    assert_int_equal(lines, 2);
    free(text);
    /* the report draws one curve per metric */
    snprintf(path, sizeof path, "%s/o/report.html", dir);
    assert_int_equal(vks_file_read_all(path, 16 << 20, &text, &len), VKS_OK);
    grown = realloc(text, len + 1);
    assert_non_null(grown);
    text = grown, text[len] = 0;
    if (!strstr(text, "data-key=\"program.chars\"") || !strstr(text, "data-key=\"program.const\"") ||
        !strstr(text, "data-key=\"program.flag\"") || strstr(text, "bad name"))
        fail_msg("report.html: the reward programs' curves");
    free(text);
    vks_task_programs_stop();
}

/* examples/rubric (docs/rl.md "Reward programs"): its rubric of two programs scores its three
 * completions as the page says. */
static void test_example_rubric(void **state) {
    (void)state;
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s tasks score --task %s/examples/rubric/tasks.jsonl --completions "
             "%s/examples/rubric/completions.jsonl", tu_bin(), tu_source(), tu_source());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out,
        "{\"id\": \"right\", \"line\": 1, \"task\": 1, \"reward\": 1, \"why\": \"rubric: 0.25*1 + 0.75*1 = 1; metrics "
        "{\\\"formatted\\\":true} {\\\"answered\\\":true,\\\"difference\\\":0}\"}\n"
        "{\"id\": \"close\", \"line\": 2, \"task\": 1, \"reward\": 0.625, \"why\": \"rubric: 0.25*1 + 0.75*0.5 = 0.625; "
        "metrics {\\\"formatted\\\":true} {\\\"answered\\\":true,\\\"difference\\\":1}\"}\n"
        "{\"id\": \"unformatted\", \"line\": 3, \"task\": 2, \"reward\": 0.75, \"why\": \"rubric: 0.25*0 + 0.75*1 = 0.75; "
        "metrics {\\\"formatted\\\":false} {\\\"answered\\\":true,\\\"difference\\\":0}\"}\n");
    free(out);
}

/* Environment programs (vks_tasks.h "Multi-turn environments"): an episode replayed through a
 * program of the user's, one process serving interleaved episodes by name; every way of breaking
 * the protocol named with the program and the task line; bad task lines and completions lines. */
static void test_environment_programs(void **state) {
    (void)state;
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    static const program_file programs[] = {
        /* guess the number info.secret; "higher" / "lower" after a wrong guess */
        {"guess.py", "import json, sys\n"
                     "secret = {}\n"
                     "for line in sys.stdin:\n"
                     "    q = json.loads(line)\n"
                     "    if q['type'] == 'reset':\n"
                     "        secret[q['episode']] = q['task']['info']['secret'] + q['seed']\n"
                     "        a = {'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', "
                     "'content': q['task']['prompt']}]}\n"
                     "    else:\n"
                     "        s, g = secret[q['episode']], int(q['completion'])\n"
                     "        a = {'messages': [] if g == s else [{'role': 'user', 'content': 'higher' if g < s else "
                     "'lower'}], 'done': g == s, 'reward': 1.0 if g == s else None}\n"
                     "    print(json.dumps(a), flush=True)\n"},
        {"empty.py", "import sys\nfor line in sys.stdin: print('{\"messages\": [], \"done\": true}', flush=True)\n"},
        {"role.py", "import sys\nfor line in sys.stdin: print('{\"messages\": [{\"role\": \"assistant\", "
                    "\"content\": \"x\"}]}', flush=True)\n"},
        {"noreward.py", "import json, sys\nfor line in sys.stdin:\n"
                        "    q = json.loads(line)\n"
                        "    print(json.dumps({'messages': [{'role': 'user', 'content': 'go'}]} if q['type'] == "
                        "'reset' else {'messages': [], 'done': True}), flush=True)\n"},
        {"nodone.py", "import json, sys\nfor line in sys.stdin:\n"
                      "    q = json.loads(line)\n"
                      "    print(json.dumps({'messages': [{'role': 'user', 'content': 'go'}]}), flush=True)\n"},
        {"dies.py", "import json, sys\nfor line in sys.stdin:\n"
                    "    if json.loads(line)['type'] == 'step': raise SystemExit('no more')\n"
                    "    print('{\"messages\": [{\"role\": \"user\", \"content\": \"go\"}]}', flush=True)\n"},
        {"slow.py", "import json, sys, time\nfor line in sys.stdin:\n"
                    "    if json.loads(line)['type'] == 'step': time.sleep(60)\n"
                    "    print('{\"messages\": [{\"role\": \"user\", \"content\": \"go\"}]}', flush=True)\n"},
    };
    write_programs(dir, programs, sizeof programs / sizeof programs[0]);
    snprintf(path, sizeof path, "%s/env.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"task_type\": \"environment\", \"environment\": \"python3 guess.py\", \"prompt\": \"Guess.\", \"info\": "
          "{\"secret\": 5}, \"max_turns\": 3}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 empty.py\"}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 role.py\"}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 noreward.py\"}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 nodone.py\"}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 dies.py\", \"sandbox\": false}\n"
          "{\"task_type\": \"environment\", \"environment\": \"python3 slow.py\", \"timeout_s\": 1}\n", f);
    fclose(f);
    vks_task *tasks = NULL;
    int64_t n = 0;
    assert_int_equal(vks_task_file_load(path, &tasks, &n), VKS_OK);
    assert_int_equal(n, 7);
    assert_int_equal(tasks[0].verify, VKS_VERIFY_ENVIRONMENT);
    assert_int_equal(tasks[0].program->max_turns, 3);
    assert_int_equal(tasks[1].program->max_turns, VKS_ENV_DEFAULT_TURNS);
    assert_ptr_equal(vks_task_first_environment(tasks, n), &tasks[0]);
    /* two episodes of one process, interleaved: seed 2 moves the secret to 7 */
    vks_env_episode a, b;
    assert_int_equal(vks_env_reset(&tasks[0], 0, &a), VKS_OK);
    assert_int_equal(vks_env_reset(&tasks[0], 2, &b), VKS_OK);
    assert_string_not_equal(a.id, b.id);
    assert_int_equal(a.n, 2);
    assert_string_equal(a.m[0].role, "system");
    assert_string_equal(a.m[1].content, "Guess.");
    assert_int_equal(vks_env_step(&tasks[0], &a, "6", 1), VKS_OK);
    assert_int_equal(vks_env_step(&tasks[0], &b, "6", 1), VKS_OK);
    assert_string_equal(a.m[a.n - 1].content, "lower");
    assert_string_equal(b.m[b.n - 1].content, "higher");
    assert_int_equal(vks_env_step(&tasks[0], &a, "5", 1), VKS_OK);
    assert_true(a.done && a.reward == 1.0 && a.n == 5);
    assert_int_equal(vks_env_step(&tasks[0], &b, "7", 1), VKS_OK);
    assert_true(b.done && b.reward == 1.0);
    vks_env_episode_free(&a), vks_env_episode_free(&b);
    const char *turns[3] = {"1", "9", "5"};
    size_t lens[3] = {1, 1, 1};
    double r = -1;
    char why[VKS_TASK_MAX_WHY];
    assert_int_equal(vks_env_replay(&tasks[0], 0, turns, lens, 3, &r, why, sizeof why, NULL), VKS_OK);
    assert_true(r == 1.0);
    assert_string_equal(why, "environment: done after 3 turns, reward 1");
    assert_int_equal(vks_env_replay(&tasks[0], 4, turns, lens, 3, &r, why, sizeof why, NULL), VKS_OK); /* 9 */
    assert_true(r == 0.0);
    assert_string_equal(why, "the environment ended after turn 2 of 3");
    static const char *const errors[] = {
        "environment (task line 2; started 3 times): environment 'python3 empty.py' answered a reset: \"messages\" is "
        "not a list of 1 to 16 messages",
        "environment (task line 3; started 3 times): environment 'python3 role.py' answered a reset: message 1: "
        "\"role\" is not system, user or tool",
        "environment (task line 4; started once): environment 'python3 noreward.py' answered a step: done without a "
        "\"reward\" from 0 to 1",
        "environment (task line 5; started once): environment 'python3 nodone.py' answered a step: no \"done\": true "
        "or false",
        "environment (task line 6; started once): 'python3 dies.py' ended: exit status 1; its last words: no more",
        "environment (task line 7; started once): 'python3 slow.py' gave no answer in time",
    };
    for (int k = 0; k < 6; k++) {
        const char *turn = "1";
        size_t len = 1;
        assert_int_not_equal(vks_env_replay(&tasks[1 + k], 0, &turn, &len, 1, &r, why, sizeof why, NULL), VKS_OK);
        assert_string_equal(vks_last_error(), errors[k]);
    }
    vks_task_programs_stop();
    vks_task_free(tasks, n);
    static const struct { const char *line, *msg; } bad[] = {
        {"\"environment\": \"a\", \"program\": \"b\"", "has \"environment\", not \"program\" or \"rubric\""},
        {"\"prompt\": \"p\"", "an environment task needs \"environment\": a command of 1 to 1023 bytes"},
        {"\"environment\": \"a\", \"max_turns\": 0", "\"max_turns\" is not an integer from 1 to 32"},
        {"\"environment\": \"a\", \"max_turns\": 33", "\"max_turns\" is not an integer from 1 to 32"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        FILE *b = fopen(path, "w");
        fprintf(b, "{\"task_type\": \"environment\", %s}\n", bad[k].line);
        fclose(b);
        assert_int_not_equal(vks_task_file_load(path, &tasks, &n), VKS_OK);
        if (!strstr(vks_last_error(), bad[k].msg)) fail_msg("'%s': '%s'", bad[k].line, vks_last_error());
    }
    /* completions lines: turns and seed go with environment tasks only, and not beside "completion" */
    char tasks_path[600], comps[600], cmd[2000], *out = NULL;
    snprintf(tasks_path, sizeof tasks_path, "%s",
             write_file("te.jsonl", "{\"task_type\": \"calc\", \"prompt\": \"2*3?\", \"answer\": 6}\n"
                                    "{\"prompt\": \"2+2\", \"answer\": \"4\", \"task_type\": \"numeric\"}\n"));
    static const struct { const char *line, *msg; } bad_lines[] = {
        {"{\"task\": 2, \"turns\": [\"answer: 4\"]}", "\"turns\" and \"seed\" go with environment tasks; task line 2 "
                                                     "is none"},
        {"{\"task\": 1, \"turns\": [\"answer: 6\"], \"completion\": \"x\"}", "\"completion\" and \"turns\": give one"},
        {"{\"task\": 1, \"turns\": []}", "\"turns\" is not a list of 1 to 32 strings"},
        {"{\"task\": 1, \"turns\": [\"a\", 3]}", "\"turns\"[1] is not a string"},
        {"{\"task\": 1, \"turns\": [\"a\"], \"seed\": -1}", "\"seed\" is not an integer of at least 0"},
        {"{\"task\": 1}", "no \"completion\" string or \"turns\" list"},
    };
    for (size_t k = 0; k < sizeof bad_lines / sizeof bad_lines[0]; k++) {
        char text[300];
        snprintf(text, sizeof text, "{\"task\": 1, \"completion\": \"answer: 6\"}\n%s\n", bad_lines[k].line);
        snprintf(comps, sizeof comps, "%s", write_file("ce.jsonl", text));
        snprintf(cmd, sizeof cmd, "%s tasks score --task %s --completions %s 2>&1 >/dev/null", tu_bin(), tasks_path,
                 comps);
        assert_int_equal(tu_run(cmd, &out), 2);
        char want[1400];
        snprintf(want, sizeof want, "vkswarm: tasks score: %s: line 2: %s", comps, bad_lines[k].msg);
        if (strncmp(out, want, strlen(want))) fail_msg("got '%s', want '%s'", out, want);
        free(out);
    }
}

/* examples/environment (docs/rl.md "Environments"): calc.py, a user's environment in Python, and
 * the built-in calculator (task_type "calc") give the same conversation and reward for each of the
 * same recorded turns: two implementations of one protocol checked against each other; and
 * doublecheck.py, verifiers' example on multiturn.py (its MultiTurnEnv methods, one async), asks
 * "Are you sure?" once and scores the final answer. */
static void test_example_environment(void **state) {
    (void)state;
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s tasks score --task %s/examples/environment/tasks.jsonl --completions "
             "%s/examples/environment/completions.jsonl", tu_bin(), tu_source(), tu_source());
    assert_int_equal(tu_run(cmd, &out), 0);
    char *lines[11], *save = NULL;
    int n = 0;
    for (char *l = strtok_r(out, "\n", &save); l && n < 11; l = strtok_r(NULL, "\n", &save)) lines[n++] = l;
    assert_int_equal(n, 10);
    static const char *const rewards[4] = {"\"reward\": 1,", "\"reward\": 0,", "\"reward\": 1,", "\"reward\": 0,"};
    for (int i = 0; i < 4; i++) {
        assert_non_null(strstr(lines[i], rewards[i]));
        assert_non_null(strstr(lines[i + 4], rewards[i]));
        const char *py = strstr(lines[i], "\"turns\":"), *builtin = strstr(lines[i + 4], "\"turns\":");
        assert_true(py && builtin);
        assert_string_equal(py, builtin); /* the turn count and every message */
    }
    assert_non_null(strstr(lines[0], "\"why\": \"environment: done after 3 turns, reward 1; metrics {\\\"calls\\\":2}\""));
    assert_non_null(strstr(lines[2], "{\"role\": \"tool\", \"content\": \"= 7/2\"}"));
    assert_non_null(strstr(lines[7], "\"why\": \"not done after 4 turns (max_turns)\""));
    assert_non_null(strstr(lines[8], "\"reward\": 1, \"why\": \"environment: done after 2 turns, reward 1; metrics "
                                     "{\\\"changed_mind\\\":false}\", \"turns\": 2, \"messages\": [{\"role\": \"user\", "
                                     "\"content\": \"What is 6*7? End with the line answer: N\"}, {\"role\": \"assistant\", "
                                     "\"content\": \"answer: 42\"}, {\"role\": \"user\", \"content\": \"Are you sure?\"}, "
                                     "{\"role\": \"assistant\", \"content\": \"Yes.\\nanswer: 42\"}]}"));
    assert_non_null(strstr(lines[9], "\"reward\": 0, \"why\": \"environment: done after 2 turns, reward 0; metrics "
                                     "{\\\"changed_mind\\\":true}\""));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sandbox_available), cmocka_unit_test(test_sandbox_io),
        cmocka_unit_test(test_sandbox_time),      cmocka_unit_test(test_sandbox_limits),
        cmocka_unit_test(test_sandbox_isolation), cmocka_unit_test(test_sandbox_parallel),
        cmocka_unit_test(test_code_block),        cmocka_unit_test(test_code_task_rewards),
        cmocka_unit_test(test_code_task_errors),  cmocka_unit_test(test_cli_tasks_score),
        cmocka_unit_test(test_builtin_code_task), cmocka_unit_test(test_sandbox_proc),
        cmocka_unit_test(test_reward_programs),   cmocka_unit_test(test_reward_program_metrics),
        cmocka_unit_test(test_example_rubric),    cmocka_unit_test(test_environment_programs),
        cmocka_unit_test(test_example_environment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
