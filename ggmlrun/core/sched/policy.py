"""Cost-aware placement (`--policy cost`): choose backends to minimise modeled time.

ggml's passes are greedy and never weigh a copy. Here the choice between a device D and the
CPU is a two-label problem solved exactly by a minimum s-t cut:

- each compute node (or the root tensor a view or write belongs to) is a variable, on the
  source side for D and the sink side for the CPU; its compute time on each is a unary cost;
- a tensor is copied to a backend once per compute if any consumer runs there (ggml keeps one
  copy per tensor and backend), a cost shared by all its consumers: a hyperedge, built with
  one auxiliary vertex per tensor and direction;
- pins, ops a backend lacks, weights and writes into weights are fixed or infinite costs.

With more devices the cut is solved for each device against the CPU in turn. The result is
scheduled by the usual passes (assignments made here are never overwritten, like pins) and
kept only if its modeled time beats ggml's and it fits every backend's memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ggmlrun.core.backends import costs
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util.fmt import us_text as _us
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.sched.schedule import Schedule
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.ggml_version import GgmlVersion
from ggmlrun.core.util.notes import note

INF = 1 << 62
MAX_CUT_NODES = 2000
PICO = 1e12  # costs become integer picoseconds for the flow


class MinCut:
    """Dinic's max flow on integer capacities; `source_side` is the minimum cut."""

    def __init__(self, n: int):
        self.adj: list[list[list[int]]] = [[] for _ in range(n)]   # [to, cap, rev]

    def add(self, u: int, v: int, cap: int) -> None:
        if cap <= 0 or u == v:
            return
        self.adj[u].append([v, cap, len(self.adj[v])])
        self.adj[v].append([u, 0, len(self.adj[u]) - 1])

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for v, cap, _ in self.adj[u]:
                if cap > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if level[t] >= 0 else None

    def _push(self, u, t, pushed, level, it) -> int:
        if u == t:
            return pushed
        edges = self.adj[u]
        while it[u] < len(edges):
            edge = edges[it[u]]
            v, cap, rev = edge
            if cap > 0 and level[v] == level[u] + 1:
                got = self._push(v, t, min(pushed, cap), level, it)
                if got:
                    edge[1] -= got
                    self.adj[v][rev][1] += got
                    return got
            it[u] += 1
        return 0

    def source_side(self, s: int, t: int) -> set[int]:
        while (level := self._levels(s, t)) is not None:
            it = [0] * len(self.adj)
            while self._push(s, t, INF, level, it):
                pass
        seen, queue = {s}, deque([s])
        while queue:
            u = queue.popleft()
            for v, cap, _ in self.adj[u]:
                if cap > 0 and v not in seen:
                    seen.add(v)
                    queue.append(v)
        return seen


@dataclass
class PolicyOutcome:
    schedule: Schedule
    ggml_time: tuple[float, float]   # (compute, copy) modeled seconds under ggml's policy
    cost_time: tuple[float, float]   # the same under the cost policy's candidate
    kept: str                        # "cost" or "ggml" (when the cut found nothing better)
    note: str = ""


def owner(t: Tensor) -> Tensor:
    """The tensor whose placement decides this one's: a view's or a write's root."""
    return t.view_src or t


class CostPolicy:
    def __init__(self, backends: list[BackendSpec], ggml: GgmlVersion | str | None = None):
        self.backends = backends
        self.ggml = ggml
        self.cpu = len(backends) - 1

    def place(self, graph: Graph, fits=None) -> PolicyOutcome:
        base = Scheduler(self.backends, ggml=self.ggml).schedule(graph)
        if len(graph.nodes) > MAX_CUT_NODES:
            # Dinic's flow in Python grows about quadratically on long chains (10k nodes:
            # two minutes where ggml's passes take seconds), so past the bound ggml's policy
            ggml_time = costs.modeled_time(base)
            why = (f"{len(graph.nodes):,} nodes > {MAX_CUT_NODES:,}: ggml's placement kept "
                   "without the min-cut search")
            note(f"--policy cost: {why}")
            return PolicyOutcome(base, ggml_time, ggml_time, "ggml", why)
        labels = {t: b for t, b in base.backend_of.items() if t.role != "copy"}
        fixed = self._fixed(graph, base)
        for _ in range(2):
            changed = False
            for device in range(self.cpu):
                changed |= self._cut(graph, labels, fixed, device)
            if not changed:
                break
        # every free node is decided, moved or not: otherwise the passes would spread the moved
        # ones to neighbours the cut kept where they were
        decided, moved = {}, []
        for node in graph.nodes:
            if get_op(node.op).view_op or owner(node) in fixed or node in fixed:
                continue
            b = labels[owner(node)]
            if b != base.backend_of[node]:
                moved.append(node)
            decided[node] = (b, "cost" if b != base.backend_of[node] else base.cause[node])
        candidate = Scheduler(self.backends, ggml=self.ggml).schedule(graph, decided)
        self._explain(candidate, base, moved)
        ggml_time, cost_time = costs.modeled_time(base), costs.modeled_time(candidate)
        if not moved or sum(cost_time) >= sum(ggml_time):
            return PolicyOutcome(base, ggml_time, ggml_time, "ggml",
                                 "ggml's placement is already the cheapest the cut found")
        if fits is not None and not fits(candidate) and fits(base):
            return PolicyOutcome(base, ggml_time, ggml_time, "ggml",
                                 "the cheaper placement does not fit in memory")
        return PolicyOutcome(candidate, ggml_time, cost_time, "cost")

    # --- what may not move ------------------------------------------------------------------
    def _fixed(self, graph: Graph, base: Schedule) -> set[Tensor]:
        fixed = set(graph.leafs)
        for node in graph.nodes:
            cause = base.cause.get(node, "")
            if cause == "usr" or cause == "1.dst" or owner(node).is_leaf:
                fixed.add(owner(node))
        return fixed

    # --- one device against the CPU -----------------------------------------------------------
    def _cut(self, graph: Graph, labels: dict, fixed: set, device: int) -> bool:
        """Move the free nodes between `device` and the CPU by a minimum cut: each node's
        compute on either side (_compute_costs), the copies between them (_copy_edges)."""
        cpu = self.cpu
        free = [n for n in graph.nodes
                if n is owner(n) and n not in fixed and not get_op(n.op).view_op
                and labels[n] in (device, cpu)]
        if not free:
            return False
        net = _Network({n: i + 2 for i, n in enumerate(free)})
        self._compute_costs(graph, net, device)
        self._copy_edges(graph, net, labels, device)
        device_side = net.solve()
        changed = False
        for node, v in net.index.items():
            b = device if v in device_side else cpu
            changed |= labels[node] != b
            labels[node] = b
        for node in graph.nodes:                 # views and writes follow their root
            if owner(node) in net.index:
                labels[node] = labels[owner(node)]
        return changed

    def _compute_costs(self, graph: Graph, net: _Network, device: int) -> None:
        """Every compute node's time, charged to the variable owning it, on either side."""
        spec, cpu = self.backends, self.cpu
        for node in graph.nodes:
            if get_op(node.op).view_op or owner(node) not in net.index:
                continue
            v = net.index[owner(node)]
            runs = spec[device].supports_node(node)
            net.on_d[v] += ps(costs.compute_s(spec[device], node)) if runs else INF
            net.on_c[v] += ps(costs.compute_s(spec[cpu], node))

    def _copy_edges(self, graph: Graph, net: _Network, labels: dict, device: int) -> None:
        """A copy once per tensor and destination backend: charged to the tensor's variable
        for a fixed consumer elsewhere, else through an auxiliary vertex its users share."""
        spec, cpu, s, t, index = self.backends, self.cpu, net.S, net.T, net.index
        consumers: dict[Tensor, set[Tensor]] = {}
        for node in graph.nodes:
            if get_op(node.op).view_op:
                continue
            for src in node.src:
                if owner(src) is not owner(node):
                    consumers.setdefault(src, set()).add(owner(node))
        for tensor, users in consumers.items():
            nbytes = tensor.nbytes
            x = owner(tensor)
            var_users = [index[u] for u in users if u in index]
            fixed_at = {labels[u] for u in users if u not in index}
            if x in index:
                xv = index[x]
                to_d = ps(costs.copy_s(spec[cpu], spec[device], nbytes))
                to_c = ps(costs.copy_s(spec[device], spec[cpu], nbytes))
                for label in fixed_at:          # a fixed consumer elsewhere: a copy whenever x differs
                    if label != device:
                        net.on_d[xv] += ps(costs.copy_s(spec[device], spec[label], nbytes))
                    if label != cpu:
                        net.on_c[xv] += ps(costs.copy_s(spec[cpu], spec[label], nbytes))
                if var_users and device not in fixed_at:   # x on CPU, some user on the device
                    w = net.aux()
                    net.edges += [(u, w, INF) for u in var_users] + [(w, xv, to_d)]
                if var_users and cpu not in fixed_at:      # x on the device, some user on the CPU
                    w = net.aux()
                    net.edges += [(xv, w, to_c)] + [(w, u, INF) for u in var_users]
            elif var_users:
                home = labels[x]
                if home != device and device not in fixed_at:   # any user on the device pays
                    w = net.aux()
                    net.edges += [(u, w, INF) for u in var_users]
                    net.edges.append((w, t, ps(costs.copy_s(spec[home], spec[device], nbytes))))
                if home != cpu and cpu not in fixed_at:         # any user on the CPU pays
                    w = net.aux()
                    net.edges.append((s, w, ps(costs.copy_s(spec[home], spec[cpu], nbytes))))
                    net.edges += [(w, u, INF) for u in var_users]

    # --- causes --------------------------------------------------------------------------------
    def _explain(self, sched: Schedule, base: Schedule, moved: list[Tensor]) -> None:
        for node in moved:
            here, there = sched.backend_of[node], base.backend_of[node]
            now = costs.compute_s(self.backends[here], node)
            before = costs.compute_s(self.backends[there], node)
            why = (f"compute {_us(now)} here vs {_us(before)} on {self.backends[there].name}")
            if now >= before:
                why += "; keeps copies away"
            sched.reasons[node] = why


def ps(seconds: float) -> int:
    """Seconds as whole picoseconds: the cut's capacities are integers."""
    return int(round(seconds * PICO))


class _Network:
    """The cut's graph: source 0 (the device side), sink 1 (the CPU side), a vertex per free
    node (`index`), auxiliary vertices for shared copies; `on_d` / `on_c` each variable's cost
    on the device / the CPU."""
    S, T = 0, 1

    def __init__(self, index: dict):
        self.index = index
        self.n_vertices = 2 + len(index)
        self.on_d = [0] * self.n_vertices
        self.on_c = [0] * self.n_vertices
        self.edges: list[tuple[int, int, int]] = []

    def aux(self) -> int:
        self.n_vertices += 1
        return self.n_vertices - 1

    def solve(self) -> set[int]:
        """The vertices on the device's side of a minimum cut."""
        flow = MinCut(self.n_vertices)
        for v in range(2, len(self.index) + 2):
            flow.add(v, self.T, min(self.on_d[v], INF))
            flow.add(self.S, v, min(self.on_c[v], INF))
        for u, v, cap in self.edges:
            flow.add(u, v, cap)
        return flow.source_side(self.S, self.T)
