"""Replay files are checked whole at load (dart_core.ui.record_schema): a damaged file fails there with one
exception type and a located message, and a file that loads renders every step of the page. No model:
the page is built around a stand-in target (rendering reads only the record)."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402
from dart_core.page.tabs import TabState  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from dart_core.page.engines import EngineFactory  # noqa: E402
from dart_core.ui.record import RunRecord  # noqa: E402
from dart_core.ui.record_schema import ReplayError  # noqa: E402

RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded_run.json"
BASE = json.loads(RECORDED.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def page():
    """The real page (Visualiser) with both tree views, around a stand-in target: rendering a record
    needs neither weights nor heads (the heads are placeholders that make the DART / EAGLE-3 columns)."""
    target = SimpleNamespace(name="stand-in", template_name="smollm2", dtype=torch.float32, device="cpu",
                             tokenizer=None)
    factory = EngineFactory(target, dart_head=object(), eagle3_head=object())
    args = app.parse_args(["--max-new-tokens", "32"])
    return Visualiser(target, args, factory)


def render_everything(vis, record: RunRecord) -> None:
    """What the page draws for a replay, then the step view at every answer-token position (the slider),
    plus one past the end; the export of the replayed record must work too."""
    vis.render_all(record)
    for pos in range(record.max_position() + 2):
        vis.render_step_views(record, pos)
    vis.render_step_views(record, None, latest=True)
    json.dumps(record.to_export())


def load(doc) -> RunRecord:
    return RunRecord.from_export(doc if isinstance(doc, str) else json.dumps(doc))


# ---------------------------------------------------------------------------------------------- examples
def _trace(doc, engine="dart", step=1):
    return doc["engines"][engine]["traces"][step - 1]


CASES = [  # (mutation, text the located message must hold)
    (lambda d: _trace(d, step=3)["accepted_nodes"].__setitem__(1, 99),
     "engine 'dart', step 3: accepted_nodes[1] = 99 is not a node of its 17-node tree"),
    (lambda d: _trace(d).__setitem__("node_target_argmax", _trace(d)["node_target_argmax"][:5]),
     "engine 'dart', step 1: node_target_argmax has 5 entries"),
    (lambda d: _trace(d).__setitem__("position", -5), "engine 'dart', step 1: position = -5 is out of range"),
    (lambda d: _trace(d, step=2).__setitem__("position", 99), "engine 'dart', step 2: position = 99, expected"),
    (lambda d: _trace(d)["timings"].__setitem__("verify", "slow"),
     "engine 'dart', step 1: timings['verify'] must be a number, got a string"),
    (lambda d: d.__setitem__("token_text", ["a", "b"]), "token_text must be an object of token id -> text"),
    (lambda d: d.__setitem__("meta", ["x"]), "meta must be an object"),
    (lambda d: d["meta"].__setitem__("target", [[["deep"]]]), "meta['target'] must be text, a number"),
    (lambda d: d.__setitem__("prompt", "a\ud800b"), "prompt holds a lone surrogate (U+D800)"),
    (lambda d: _trace(d, step=2)["accepted_nodes"].__setitem__(1, 2),
     "engine 'dart', step 2: accepted_nodes[1] = 2 is not a child of node 0"),
    (lambda d: _trace(d)["candidates"]["node"].__setitem__(0, 40), "candidates.node[0] = 40 is not a drafted node"),
    (lambda d: _trace(d, "vanilla", 4)["tree"]["parents"].__setitem__(0, 3), "engine 'vanilla', step 4: tree: node 0 must be the root"),
    (lambda d: d["engines"]["dart"]["tokens"].append(5), "engine 'dart': tokens holds 25 answer tokens"),
    (lambda d: d["engines"]["dart"].__setitem__("spans", [["a", "b", "c"]]), "spans[0] must be a [text, label] pair"),
    (lambda d: d.__delitem__("engines"), "the file lacks the field 'engines'"),
    (lambda d: d["engines"].clear(), "engines: the file holds no engine runs"),
    (lambda d: _trace(d).__setitem__("mode", "sampling"), "mode is 'sampling' but the run is greedy"),
    (lambda d: _trace(d).__setitem__("version", 7), "trace version 7 is not supported"),
    (lambda d: _trace(d).__setitem__("extra", 1), "unknown field 'extra' in the step"),
    (lambda d: _trace(d)["tree"].__setitem__("tokens", [2**70] * 17), "tree: tokens[0] = 1180591620717411303424 is "
                                                                      "out of range"),
]


@pytest.mark.parametrize("mutate, message", CASES)
def test_a_damaged_file_fails_at_load_with_a_located_message(mutate, message):
    doc = copy.deepcopy(BASE)
    mutate(doc)
    with pytest.raises(ReplayError) as info:
        load(doc)
    assert message in str(info.value), str(info.value)
    assert info.value.location and ("re-export" in str(info.value) or "choose a file" in str(info.value))


def test_nesting_beyond_the_parser_and_huge_numbers_are_clean_errors():
    for text, message in (("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                          ('{"format": "dart-demo-run", "version": 1, "engines": ' + "9" * 5000 + "}",
                           "not a usable JSON document"),
                          ('{"format": "dart-demo-run", "version": 1, "prompt": "\\ud800", "engines": {}}',
                           "lone surrogate")):
        with pytest.raises(ReplayError, match=message):
            load(text)


def test_the_page_shows_a_damaged_file_and_keeps_the_previous_run(page, tmp_path):
    good = page.replay(TabState(), str(RECORDED))
    tab = good[page.tab]
    doc = copy.deepcopy(BASE)
    _trace(doc, step=12 - 3)["accepted_nodes"][-1] = 99
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    out = page.replay(tab, str(bad))
    assert out[page.status].startswith("⚠ **Cannot replay bad.json:** engine 'dart', step 9: accepted_nodes")
    assert tab.record is not None and tab.record.runs["dart"].traces  # the shown run is untouched
    page.show_step(tab, 5)


def test_the_recorded_run_loads_and_renders_every_position(page):
    render_everything(page, load(BASE))


# ---------------------------------------------------------------------------------------------- property
def _paths(node, prefix=()):
    """Every (container path, key) in the document, for mutations anywhere."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(_paths(v, prefix + (k,)))
    return out


def _trimmed(doc):
    """The recorded run cut to its first steps (the page then renders in a fraction of the time; every
    field kind and both engines stay)."""
    d = copy.deepcopy(doc)
    for e in d["engines"].values():
        e["traces"] = e["traces"][:3]
        n = e["traces"][-1]["position"] + len(e["traces"][-1]["emitted_tokens"])
        e["tokens"] = e["tokens"][:n]
        e["spans"] = e["spans"][:n]
    return d


SMALL = _trimmed(BASE)
PATHS = _paths(SMALL)
# places that are not items of the long number lists (tree and candidate arrays, token ids): mutations here
# keep more records loadable, so more of them reach the renderer
FIELDS = [p for p in PATHS if isinstance(p[-1], str) or p[-2:-1] in (("traces",), ("spans",), ("accepted_nodes",),
                                                                    ("emitted_tokens",))]
NEST = "\x00nest\x00"

weird_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([-1, 0, 1, 2, 5, 16, 17, 99, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.just("\ud800"),
    st.lists(st.integers(-3, 40), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(NEST),
)


@st.composite
def mutated(draw):
    doc = copy.deepcopy(SMALL)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS) | st.sampled_from(FIELDS))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            key = path[-1]
            parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this place
        kind = draw(st.sampled_from(["delete", "replace", "same type", "same type", "int", "grow", "nest"]))
        if kind == "same type":  # often still valid: odd texts, numbers and flags must render
            old = parent[key]
            parent[key] = draw(st.text(max_size=30) if isinstance(old, str) else
                               st.booleans() if isinstance(old, bool) else
                               st.integers(0, 50) if isinstance(old, int) else
                               st.floats(0, 1) if isinstance(old, float) else st.just(old))
        elif kind == "delete":
            if isinstance(parent, list):
                parent.pop(key)
            else:
                del parent[key]
        elif kind == "replace":
            parent[key] = draw(weird_values)
        elif kind == "int":
            old = parent[key]
            base = old if isinstance(old, int) and not isinstance(old, bool) else 0
            parent[key] = base + draw(st.sampled_from([-base - 1, -1, 1, 7, 2**31, -2**40]))
        elif kind == "grow":
            old = parent[key]
            parent[key] = (old * draw(st.integers(2, 200)) if isinstance(old, list) and old
                           else [old] * draw(st.integers(0, 20_000)))
        else:
            parent[key] = NEST
    text = json.dumps(doc, ensure_ascii=False, allow_nan=True)
    depth = draw(st.sampled_from([2, 50, 3000]))
    return text.replace(json.dumps(NEST), "[" * depth + "0" + "]" * depth)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=mutated())
def test_any_mutated_record_fails_cleanly_at_load_or_renders_every_step(page, text):
    try:
        record = RunRecord.from_export(text)
    except ReplayError as exc:
        assert exc.location and exc.problem
        event("refused at load")
        return
    event("loaded and rendered")
    render_everything(page, record)
