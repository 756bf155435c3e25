/* cpu_threads.c: a parallel loop on short-lived pthreads. Each call starts
 * threads-1 helpers; the work per call (a layer's attention, a weight panel)
 * is large next to the cost of starting them. */
#include "cpu/cpu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

typedef struct {
    cpu_task_fn fn;
    void *ctx;
    int n, grain;
    atomic_int next, workers;
} parallel_loop;

static void *run_items(void *arg) {
    parallel_loop *p = arg;
    int worker = atomic_fetch_add(&p->workers, 1);
    for (;;) {
        int begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n) break;
        int end = p->n - begin < p->grain ? p->n : begin + p->grain;
        p->fn(p->ctx, begin, end, worker);
    }
    return NULL;
}

static void run_items_as_caller(parallel_loop *p) {
    for (;;) {
        int begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n) break;
        p->fn(p->ctx, begin, p->n - begin < p->grain ? p->n : begin + p->grain, 0);
    }
}

enum { CPU_MAX_THREADS = 256 };

void vks_cpu_parallel_for(int threads, int n, int grain, cpu_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int want = threads < 1 ? 1 : threads > CPU_MAX_THREADS ? CPU_MAX_THREADS : threads;
    int useful = (n + grain - 1) / grain;
    if (want > useful) want = useful;
    parallel_loop p = {.fn = fn, .ctx = ctx, .n = n, .grain = grain};
    atomic_init(&p.next, 0);
    atomic_init(&p.workers, 1); /* the caller is worker 0 */
    pthread_t tid[CPU_MAX_THREADS];
    int started = 0;
    while (started < want - 1 && pthread_create(&tid[started], NULL, run_items, &p) == 0) started++;
    run_items_as_caller(&p);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
}

int vks_cpu_thread_count(int threads) {
    if (threads > 0) return threads > CPU_MAX_THREADS ? CPU_MAX_THREADS : threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > CPU_MAX_THREADS ? CPU_MAX_THREADS : (int)cores;
}

typedef struct {
    void (*fn)(void *ctx, int begin, int end);
    void *ctx;
} public_task;

static void run_public_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    public_task *t = ctx;
    t->fn(t->ctx, begin, end);
}

void vks_cpu_parallel(const vks_cpu *c, int n, void (*fn)(void *ctx, int begin, int end), void *ctx) {
    public_task t = {fn, ctx};
    vks_cpu_parallel_for(c ? c->threads : 1, n, 1, run_public_task, &t);
}
