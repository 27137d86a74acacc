// oneTBB flow::graph peer of `cargo xtask bench graph` (built and launched by
// crates/strata-graph/benches/graph_dags.rs; one launch per round).
//
// The same three DAGs as strata's, with explicit edges: the program states every
// dependency (no inference from data accesses), so this is a lower bound for a runtime
// that has to find the edges itself. Timed: building the nodes and edges, running, and
// waiting for the graph (the counterpart of strata's submit + run + wait); the nodes'
// destruction is not timed. Two threads: the main thread builds and waits (and works
// while it waits), plus one TBB worker (global_control max_allowed_parallelism = 2).
//
// A second figure re-runs the same graph, already built (only the run and the wait are
// timed): the cost of TBB's scheduling alone, for a DAG built once and run many times.
//
// Usage: tbb_dag chain|fan|wavefront  -> prints "<build+run> <run only>", microseconds
// per task.
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

using namespace oneapi::tbb;
using Node = flow::continue_node<flow::continue_msg>;
using Msg = flow::continue_msg;

static const long CHAIN = 100000;
static const int ROUNDS = 100;
static const int WIDTH = 1000;
static const int WAVE = 300;

static volatile long X, Y[WIDTH];
static volatile long A[WAVE][WAVE];

template <class F> static double timed(long tasks, F f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  auto dt = std::chrono::steady_clock::now() - t0;
  return std::chrono::duration<double, std::micro>(dt).count() / tasks;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: tbb_dag chain|fan|wavefront\n");
    return 2;
  }
  const char *w = argv[1];
  global_control threads(global_control::max_allowed_parallelism, 2);
  flow::graph g;
  std::vector<std::unique_ptr<Node>> nodes;
  double us;
  Node *first = nullptr;
  long tasks = 0;
  if (!strcmp(w, "chain")) {
    nodes.reserve(CHAIN);
    us = timed(CHAIN, [&] {
      for (long i = 0; i < CHAIN; i++) {
        nodes.emplace_back(new Node(g, [](const Msg &) { X = X + 1; }));
        if (i > 0) flow::make_edge(*nodes[i - 1], *nodes[i]);
      }
      nodes[0]->try_put(Msg());
      g.wait_for_all();
    });
    tasks = CHAIN;
  } else if (!strcmp(w, "fan")) {
    nodes.reserve(ROUNDS * (WIDTH + 2));
    us = timed(ROUNDS * (WIDTH + 2), [&] {
      Node *prev_sink = nullptr;
      for (int r = 0; r < ROUNDS; r++) {
        Node *root = new Node(g, [](const Msg &) { X = X + 1; });
        nodes.emplace_back(root);
        if (prev_sink) flow::make_edge(*prev_sink, *root);
        Node *sink = new Node(g, [](const Msg &) {
          long s = 0;
          for (int i = 0; i < WIDTH; i++) s += Y[i];
          X = X + (s > 0);
        });
        for (int i = 0; i < WIDTH; i++) {
          Node *leaf = new Node(g, [i](const Msg &) { Y[i] = X; });
          nodes.emplace_back(leaf);
          flow::make_edge(*root, *leaf);
          flow::make_edge(*leaf, *sink);
        }
        nodes.emplace_back(sink);
        if (r == 0) root->try_put(Msg());
        prev_sink = sink;
      }
      g.wait_for_all();
    });
    tasks = ROUNDS * (WIDTH + 2);
  } else if (!strcmp(w, "wavefront")) {
    nodes.reserve(WAVE * WAVE);
    us = timed(WAVE * WAVE, [&] {
      for (int i = 0; i < WAVE; i++)
        for (int j = 0; j < WAVE; j++) {
          nodes.emplace_back(new Node(g, [i, j](const Msg &) {
            long v = (i > 0 ? A[i - 1][j] : 0) + (j > 0 ? A[i][j - 1] : 0);
            A[i][j] = v > 0 ? v : 1;
          }));
          if (i > 0) flow::make_edge(*nodes[(i - 1) * WAVE + j], *nodes.back());
          if (j > 0) flow::make_edge(*nodes[i * WAVE + j - 1], *nodes.back());
        }
      nodes[0]->try_put(Msg());
      g.wait_for_all();
    });
    tasks = WAVE * WAVE;
  } else {
    fprintf(stderr, "unknown dag %s\n", w);
    return 2;
  }
  first = nodes[0].get();
  double again = timed(tasks, [&] {
    first->try_put(Msg());
    g.wait_for_all();
  });
  printf("%f %f\n", us, again);
  return 0;
}
