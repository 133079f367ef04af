"""Diagram of Thought: the reasoning as a DAG of proposition, critique, refinement and verification nodes.

Each node holds typed sections (text, number, code, rule, cite) and renders to XML, so numbers,
commands and rules stay apart from prose, as seed 000 prescribes. Edges point from the thought a
node builds on to the node; the graph must stay acyclic.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

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
        self.graph = nx.DiGraph()
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
        self.graph.add_node(nid, type=kind, round=round_no, sections=sections, author=author)
        for p in parents:
            ptype = self.graph.nodes[p]["type"]
            if kind not in ALLOWED[ptype]:
                self.graph.remove_node(nid)
                raise ValueError(f"a {kind} cannot follow a {ptype}")
            self.graph.add_edge(p, nid)
        if not nx.is_directed_acyclic_graph(self.graph):
            self.graph.remove_node(nid)
            raise ValueError("edge would create a cycle")
        return nid

    def nodes(self, kind: str | None = None) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True) if kind is None or d["type"] == kind]

    def to_xml(self) -> str:
        root = ET.Element("dot", {"job": self.job})
        for nid in nx.topological_sort(self.graph):
            d = self.graph.nodes[nid]
            el = ET.SubElement(root, d["type"], {"id": nid, "round": str(d["round"]), "author": d["author"]})
            parents = sorted(self.graph.predecessors(nid), key=lambda x: int(x[1:]))
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
                      for n, d in self.graph.nodes(data=True)],
            "edges": [list(e) for e in self.graph.edges()],
        }
