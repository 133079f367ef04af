"""Diagram of Thought: the reasoning as a DAG of proposition, critique, refinement and verification nodes.

Each node holds typed sections (text, number, code, rule, cite) and renders to XML, so numbers,
commands and rules stay apart from prose, as seed 000 prescribes. Edges point from the thought a
node builds on to the node; the graph must stay acyclic. A node's parents must already exist, so the
graph is acyclic by construction; it is kept in plain dicts (networkx cost 8 MB and 0.8 s to import).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

NODE_TYPES = ("proposition", "critique", "refinement", "verification")
SECTION_KINDS = ("text", "number", "code", "rule", "cite")
#: which node types may follow which (parent type -> allowed child types)
ALLOWED = {
    "proposition": {"proposition", "critique", "verification", "refinement"},
    "critique": {"refinement", "verification", "proposition"},
    "refinement": {"critique", "verification", "refinement"},
    "verification": {"refinement", "critique", "verification"},
}


@dataclass
class Section:
    kind: str
    value: str
    attrs: dict[str, str] = field(default_factory=dict)


class DiagramOfThought:
    def __init__(self, job: str) -> None:
        self.job = job
        self._data: dict[str, dict[str, Any]] = {}  # node id -> attributes, in insertion order
        self._succ: dict[str, dict[str, None]] = {}  # node id -> children, in edge insertion order
        self._pred: dict[str, dict[str, None]] = {}  # node id -> parents, in edge insertion order
        self._n = 0

    def add(self, kind: str, round_no: int, parents: tuple[str, ...] = (), *, text: str = "",
            numbers: dict[str, tuple[float, str]] | None = None, code: list[str] | None = None,
            rules: list[str] | None = None, cites: list[str] | None = None, author: str = "deterministic") -> str:
        """Add a node and its edges; returns its id. Raises ValueError on a type or cycle violation."""
        if kind not in NODE_TYPES:
            raise ValueError(f"unknown node type {kind}")
        self._n += 1
        nid = f"n{self._n}"
        sections = [Section("text", text)] if text else []
        for name, (val, unit) in (numbers or {}).items():
            sections.append(Section("number", f"{val:g}", {"name": name, "unit": unit}))
        sections += [Section("code", c, {"lang": "argv"}) for c in code or []]
        sections += [Section("rule", r) for r in rules or []]
        sections += [Section("cite", "", {"ref": c}) for c in cites or []]
        for p in parents:
            if p not in self._data:  # a node that does not exist yet (or this one): the edge could close a cycle
                raise ValueError(f"parent {p} does not exist yet: edge would create a cycle")
            ptype = self._data[p]["type"]
            if kind not in ALLOWED[ptype]:
                raise ValueError(f"a {kind} cannot follow a {ptype}")
        self._data[nid] = {"type": kind, "round": round_no, "sections": sections, "author": author}
        self._succ[nid], self._pred[nid] = {}, {}
        for p in parents:
            self._succ[p][nid] = None
            self._pred[nid][p] = None
        return nid

    def nodes(self, kind: str | None = None) -> list[str]:
        return [n for n, d in self._data.items() if kind is None or d["type"] == kind]

    def _topological(self) -> list[str]:
        """Nodes generation by generation (roots first, then the nodes whose parents are all listed),
        each generation in the order its nodes became ready: the order the XML has always had."""
        indegree = {n: len(p) for n, p in self._pred.items() if p}
        ready = [n for n, p in self._pred.items() if not p]
        order: list[str] = []
        while ready:
            order += ready
            nxt = []
            for n in ready:
                for child in self._succ[n]:
                    indegree[child] -= 1
                    if indegree[child] == 0:
                        nxt.append(child)
            ready = nxt
        return order

    def to_xml(self) -> str:
        root = ET.Element("dot", {"job": self.job})
        for nid in self._topological():
            d = self._data[nid]
            el = ET.SubElement(root, d["type"], {"id": nid, "round": str(d["round"]), "author": d["author"]})
            parents = sorted(self._pred[nid], key=lambda x: int(x[1:]))
            if parents:
                el.set("from", " ".join(parents))
            for s in d["sections"]:
                sub = ET.SubElement(el, s.kind, s.attrs)
                if s.value:
                    sub.text = s.value
        ET.indent(root)
        return ET.tostring(root, encoding="unicode")

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [{"id": n, "type": d["type"], "round": d["round"], "author": d["author"],
                       "sections": [{"kind": s.kind, "value": s.value, **s.attrs} for s in d["sections"]]}
                      for n, d in self._data.items()],
            "edges": [[p, c] for p, children in self._succ.items() for c in children],
        }
