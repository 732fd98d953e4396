"""The schedule as a Graphviz DOT graph (`ggmlrun dot`). Text only; rendering is the CLI's.

- Every node of the graph, every leaf and every copy is one DOT node, its fill colour the
  backend it runs or lives on (`PALETTE`, by backend index; a legend names them).
- Shapes: ops are rounded boxes (view ops dashed: they compute nothing), weights cylinders,
  graph inputs inverted houses, copies `cds` arrows; outputs get a double border.
- Each split is `subgraph cluster_N` labelled "split N: BACKEND", holding its copies and its
  nodes. Leafs stay outside the clusters (they belong to no split).
- A copy is drawn as its own node (`BACKEND#name`, as the scheduler names it): a dashed,
  bold edge labelled with the bytes moved runs from the source tensor to the copy node, and
  ordinary edges run from the copy to the nodes that read it. So there is one copy edge per
  tensor copied per compute, however many nodes read the copy.
- Every ID is a double-quoted string (names hold dots, dashes and `#`), quotes and
  backslashes escaped.
"""

from __future__ import annotations

from ggmlrun.core.util.fmt import human_bytes as _bytes
from ggmlrun.core.util.fmt import shape_text
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.sched.schedule import Schedule

# ColorBrewer Pastel1/Set3 tones: light enough for black labels, distinct by backend index
PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5",
           "#ffffb3", "#bc80bd", "#ccebc5"]


def backend_colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def quote(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape(t: Tensor) -> str:
    return f"{shape_text(t.shape)} {t.dtype}"


def _attrs(**attrs) -> str:
    return "[" + ", ".join(f"{k}={quote(v)}" for k, v in attrs.items() if v is not None) + "]"


def _node_line(sched: Schedule, t: Tensor, indent: str) -> str:
    b = sched.backend_of[t]
    fill = backend_colour(b)
    if t.role == "copy":
        label = f"{t.name}\ncopy {_bytes(t.nbytes)}"
        attrs = dict(shape="cds", style="filled,dashed", fillcolor=fill, label=label)
    elif t.is_leaf:
        kind = "input" if t.role == "input" else "weight"
        label = f"{t.name}\n{kind} {_shape(t)}"
        attrs = dict(shape="invhouse" if t.role == "input" else "cylinder", style="filled",
                     fillcolor=fill, label=label)
    else:
        view = get_op(t.op).view_op
        label = f"{t.name}\n{t.op} {_shape(t)}"
        attrs = dict(shape="box", style="rounded,filled" + (",dashed" if view else ""),
                     fillcolor=fill, label=label)
    if t.is_output:
        attrs["peripheries"] = "2"
    attrs["tooltip"] = f"{t.name} on {sched.backends[b].name} ({sched.cause.get(t, '')})"
    return f"{indent}{quote(t.name)} {_attrs(**attrs)};"


def to_dot(sched: Schedule) -> str:
    g = sched.graph
    title = (f"{g.name}: {len(sched.splits)} splits, {sched.copy_count} copies, "
             f"{_bytes(sched.copy_bytes)} per compute")
    lines = [f"digraph {quote(g.name)} {{",
             f"  graph {_attrs(label=title, labelloc='t', rankdir='TB', fontname='Helvetica')};",
             f"  node {_attrs(fontname='Helvetica', fontsize='10')};",
             f"  edge {_attrs(fontname='Helvetica', fontsize='9')};"]
    # legend: one swatch per backend
    lines.append("  subgraph cluster_legend {")
    lines.append(f"    graph {_attrs(label='backends', style='rounded')};")
    for i, b in enumerate(sched.backends):
        swatch = _attrs(label=f"{b.name} ({b.kind})", shape="box", style="filled",
                        fillcolor=backend_colour(i))
        lines.append(f"    {quote('backend ' + b.name)} {swatch};")
    lines.append("  }")
    # leafs, outside every split
    for leaf in g.leafs:
        lines.append(_node_line(sched, leaf, "  "))
    # splits
    for k, split in enumerate(sched.splits):
        backend = sched.backends[split.backend].name
        lines.append(f"  subgraph cluster_{k} {{")
        box = _attrs(label=f"split {k}: {backend}", style="rounded", penwidth="2",
                     color=backend_colour(split.backend))
        lines.append(f"    graph {box};")
        for copy in split.copies:
            lines.append(_node_line(sched, copy, "    "))
        for node in split.nodes:
            lines.append(_node_line(sched, node, "    "))
        lines.append("  }")
    # copy edges: source -> copy, dashed, with the bytes moved
    for split in sched.splits:
        for source, copy in zip(split.inputs, split.copies):
            lines.append(f"  {quote(source.name)} -> {quote(copy.name)} "
                         f"{_attrs(style='dashed,bold', label=_bytes(copy.nbytes), color='#555555')};")
    # data edges: each node's sources as it reads them (copies substituted)
    for node in g.nodes:
        for src in sched.srcs_of[node]:
            lines.append(f"  {quote(src.name)} -> {quote(node.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


RENDERED = ("svg", "png", "pdf")     # output suffixes rendered with Graphviz's `dot`


def render(text: str, fmt: str, exe: str) -> bytes:
    """Run Graphviz (`exe -Tfmt`) on DOT text; its output bytes."""
    import subprocess

    from ggmlrun.core.util.errors import RunError

    try:
        proc = subprocess.run([exe, f"-T{fmt}"], input=text.encode(), capture_output=True,
                              timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RunError(f"cannot run {exe} -T{fmt}: {err}") from None
    if proc.returncode != 0:
        why = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise RunError(f"{exe} -T{fmt} failed (exit {proc.returncode}): {why}")
    return proc.stdout
