/* StarPU peer of `cargo xtask bench graph` (built and launched by
 * crates/strata-graph/benches/graph_dags.rs; one launch per round).
 *
 * The same three DAGs as strata's in StarPU's sequential task flow: every task is
 * submitted with starpu_task_insert and the access mode of each registered data handle
 * (STARPU_R / STARPU_W / STARPU_RW); StarPU infers the dependencies from the handles, as
 * strata does from its access tags. The fan's sink passes its 1001 handles with
 * STARPU_DATA_MODE_ARRAY. Timed: the submissions and starpu_task_wait_for_all. Not timed:
 * starpu_init and registering the handles. Workers: STARPU_NCPU (set by the bench) CPU
 * workers beside the submitting main thread; the default scheduler unless STARPU_SCHED.
 *
 * Usage: starpu_dag chain|fan|wavefront  -> prints microseconds per task.
 */
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHAIN 100000
#define ROUNDS 100
#define WIDTH 1000
#define WAVE 300

static long X, Y[WIDTH], A[WAVE][WAVE];
static starpu_data_handle_t hx, hy[WIDTH], ha[WAVE][WAVE];

static void noop(void *buffers[], void *arg) {
  (void)buffers;
  (void)arg;
}

static struct starpu_codelet cl = {
    .cpu_funcs = {noop},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "noop",
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "starpu_dag: %s failed: %d\n", what, rc);
    exit(1);
  }
}

static void reg(starpu_data_handle_t *h, long *p) {
  starpu_variable_data_register(h, STARPU_MAIN_RAM, (uintptr_t)p, sizeof(long));
}

static double chain(void) {
  double t0 = now();
  for (long i = 0; i < CHAIN; i++)
    check(starpu_task_insert(&cl, STARPU_RW, hx, 0), "task_insert");
  starpu_task_wait_for_all();
  return (now() - t0) * 1e6 / CHAIN;
}

static double fan(void) {
  static struct starpu_data_descr sink[WIDTH + 1];
  for (int i = 0; i < WIDTH; i++) {
    sink[i].handle = hy[i];
    sink[i].mode = STARPU_R;
  }
  sink[WIDTH].handle = hx;
  sink[WIDTH].mode = STARPU_RW;
  double t0 = now();
  for (int r = 0; r < ROUNDS; r++) {
    check(starpu_task_insert(&cl, STARPU_RW, hx, 0), "task_insert");
    for (int i = 0; i < WIDTH; i++)
      check(starpu_task_insert(&cl, STARPU_R, hx, STARPU_W, hy[i], 0), "task_insert");
    check(starpu_task_insert(&cl, STARPU_DATA_MODE_ARRAY, sink, WIDTH + 1, 0), "task_insert");
  }
  starpu_task_wait_for_all();
  return (now() - t0) * 1e6 / (ROUNDS * (WIDTH + 2.0));
}

static double wavefront(void) {
  double t0 = now();
  for (int i = 0; i < WAVE; i++)
    for (int j = 0; j < WAVE; j++) {
      int rc;
      if (i > 0 && j > 0)
        rc = starpu_task_insert(&cl, STARPU_R, ha[i - 1][j], STARPU_R, ha[i][j - 1], STARPU_W,
                                ha[i][j], 0);
      else if (i > 0)
        rc = starpu_task_insert(&cl, STARPU_R, ha[i - 1][j], STARPU_W, ha[i][j], 0);
      else if (j > 0)
        rc = starpu_task_insert(&cl, STARPU_R, ha[i][j - 1], STARPU_W, ha[i][j], 0);
      else
        rc = starpu_task_insert(&cl, STARPU_W, ha[i][j], 0);
      check(rc, "task_insert");
    }
  starpu_task_wait_for_all();
  return (now() - t0) * 1e6 / (WAVE * WAVE);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: starpu_dag chain|fan|wavefront\n");
    return 2;
  }
  const char *w = argv[1];
  struct starpu_conf conf;
  starpu_conf_init(&conf);
  conf.ncuda = 0;
  conf.nopencl = 0;
  check(starpu_init(&conf), "starpu_init");
  double us;
  if (!strcmp(w, "chain")) {
    reg(&hx, &X);
    us = chain();
    starpu_data_unregister(hx);
  } else if (!strcmp(w, "fan")) {
    reg(&hx, &X);
    for (int i = 0; i < WIDTH; i++) reg(&hy[i], &Y[i]);
    us = fan();
    starpu_data_unregister(hx);
    for (int i = 0; i < WIDTH; i++) starpu_data_unregister(hy[i]);
  } else if (!strcmp(w, "wavefront")) {
    for (int i = 0; i < WAVE; i++)
      for (int j = 0; j < WAVE; j++) reg(&ha[i][j], &A[i][j]);
    us = wavefront();
    for (int i = 0; i < WAVE; i++)
      for (int j = 0; j < WAVE; j++) starpu_data_unregister(ha[i][j]);
  } else {
    fprintf(stderr, "unknown dag %s\n", w);
    starpu_shutdown();
    return 2;
  }
  starpu_shutdown();
  printf("%f\n", us);
  return 0;
}
