from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from explain.reasoning.dot import DiagramOfThought


def test_typed_sections_render_as_xml() -> None:
    d = DiagramOfThought("job<1>")
    p = d.add("proposition", 1, text="GPU 5 is hot & slow", numbers={"temp": (91.0, "C")}, cites=["E2"])
    c = d.add("critique", 2, (p,), text="confirm with clocks", code=["nvidia-smi -i 5"], rules=["gpu.thermal"])
    v = d.add("verification", 3, (c,), text="91 C, throttled", cites=["P1"])
    d.add("refinement", 3, (v, p), text="thermal throttling")
    root = ET.fromstring(d.to_xml())
    assert root.get("job") == "job<1>"
    assert [el.tag for el in root] == ["proposition", "critique", "verification", "refinement"]
    number, code, refinement, text = (root.find(path) for path in
                                      ("proposition/number", "critique/code", "refinement", "proposition/text"))
    assert number is not None and code is not None and refinement is not None and text is not None
    assert number.get("unit") == "C"
    assert code.text == "nvidia-smi -i 5"
    assert refinement.get("from") == "n1 n3"
    assert text.text == "GPU 5 is hot & slow"


def test_type_rules_and_acyclicity() -> None:
    d = DiagramOfThought("j")
    p = d.add("proposition", 1, text="x")
    with pytest.raises(ValueError):
        d.add("summary", 1, text="?")
    v = d.add("verification", 3, (p,), text="v")
    with pytest.raises(ValueError):
        d.add("proposition", 1, (v,), text="a verification cannot spawn a proposition")
    assert d.nodes("proposition") == [p]
    assert d.to_dict()["edges"] == [[p, v]]


def test_xml_lists_nodes_generation_by_generation() -> None:
    """Roots first, then each node once its parents are listed (not insertion order): the order the
    XML had with networkx's topological sort, so saved diagnoses keep their shape."""
    d = DiagramOfThought("j")
    p = d.add("proposition", 1, text="a")
    c = d.add("critique", 2, (p,), text="b")
    r = d.add("refinement", 3, (c,), text="c")
    q = d.add("proposition", 1, text="d")  # a second root, added last
    assert [el.get("id") for el in ET.fromstring(d.to_xml())] == [p, q, c, r]
    assert d.to_dict()["edges"] == [[p, c], [c, r]]


def test_a_parent_must_exist_before_its_child() -> None:
    d = DiagramOfThought("j")
    p = d.add("proposition", 1, text="x")
    with pytest.raises(ValueError, match="does not exist"):
        d.add("critique", 2, (p, "n2"), text="names itself as a parent")
    with pytest.raises(ValueError):
        d.add("critique", 2, ("n9",), text="a node not yet made")
    assert d.nodes() == [p]
    assert d.to_dict()["edges"] == []
