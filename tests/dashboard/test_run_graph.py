"""The run page's drawing of a run's steps: the layout on its own, then the page that draws it."""

from __future__ import annotations

import bisect
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import psycopg
from flask.testing import FlaskClient

from tests.dashboard.seeding import Seeded, one
from treadle.dashboard.run_graph import (
    COLUMN_GAP,
    LABEL_CELLS,
    MARGIN,
    MIN_NODE_WIDTH,
    NODE_HEIGHT,
    ROW_GAP,
    Node,
    RunGraph,
    Step,
    cells,
    label,
    lay_out,
    step_kind,
)

# a -> b, a -> c, (b, c) -> d, a -> e; f runs after a and d, past two columns
DIAMOND: list[Step] = [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]), ("e", ["a"]), ("f", ["a", "d"])]


def places(graph: RunGraph) -> list[tuple[int, int]]:
    return [(n.column, n.row) for n in graph.nodes]


def arrows(graph: RunGraph) -> list[tuple[int, int]]:
    return [(e.source, e.target) for e in graph.edges]


def points_along(path: str) -> list[tuple[float, float]]:
    """Points every twentieth of the way along each piece of an edge's path (M, C and H only)."""
    points: list[tuple[float, float]] = []
    x, y = 0.0, 0.0
    for command, numbers in re.findall(r"([MCH])([-\d ]+)", path):
        values = [float(v) for v in numbers.split()]
        if command == "M":
            x, y = values
            points.append((x, y))
        elif command == "H":
            points += [(x + (values[0] - x) * k / 20, y) for k in range(1, 21)]
            x = values[0]
        else:  # a cubic curve: two control points, then its end
            xs, ys = [x, *values[0::2]], [y, *values[1::2]]
            for k in range(1, 21):
                t = k / 20
                weights = [(1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t**3]
                points.append(
                    (
                        sum(w * v for w, v in zip(weights, xs, strict=True)),
                        sum(w * v for w, v in zip(weights, ys, strict=True)),
                    )
                )
            x, y = xs[-1], ys[-1]
    return points


def box_finder(graph: RunGraph) -> Callable[[tuple[float, float]], Node | None]:
    """A lookup of the box a point falls strictly inside, by the column and row it is in."""
    columns = sorted({(n.x, n.width, n.column) for n in graph.nodes})
    lefts = [left for left, _, _ in columns]
    at = {(n.column, n.row): n for n in graph.nodes}

    def box_at(point: tuple[float, float]) -> Node | None:
        x, y = point
        i = bisect.bisect_left(lefts, x) - 1  # the last column that starts left of x
        if i < 0 or x >= columns[i][0] + columns[i][1]:
            return None
        node = at.get((columns[i][2], int((y - MARGIN) // (NODE_HEIGHT + ROW_GAP))))
        return node if node is not None and node.y < y < node.y + node.height else None

    return box_at


def assert_drawn_cleanly(graph: RunGraph) -> None:
    """No two boxes overlap, the drawing holds them all, and no arrow crosses a box."""
    assert len({(n.column, n.row) for n in graph.nodes}) == len(graph.nodes)
    assert max((n.x + n.width for n in graph.nodes), default=MARGIN) + MARGIN == graph.width
    assert max((n.y + n.height for n in graph.nodes), default=MARGIN) + MARGIN == graph.height
    box_at = box_finder(graph)
    for edge in graph.edges:
        source, target = graph.nodes[edge.source], graph.nodes[edge.target]
        assert source.column < target.column, "an arrow points right"
        along = points_along(edge.path)
        # from the middle of source's right side to the middle of target's left side
        assert [along[0], along[-1]] == [
            (source.x + source.width, source.y + NODE_HEIGHT / 2),
            (target.x, target.y + NODE_HEIGHT / 2),
        ]
        assert all(box_at(p) is None for p in along), f"the arrow {edge} crosses a box"


def test_a_linear_list_is_a_row_with_an_arrow_from_each_step_to_the_next() -> None:
    """Steps without `after` each run after the one before: one row, one column each."""
    graph = lay_out([("reserve", None), ("charge", None), ("ship", None)])
    assert places(graph) == [(0, 0), (1, 0), (2, 0)]
    assert arrows(graph) == [(0, 1), (1, 2)]
    assert {n.y for n in graph.nodes} == {MARGIN}
    assert graph.height == NODE_HEIGHT + 2 * MARGIN
    assert graph.width == 3 * MIN_NODE_WIDTH + 2 * COLUMN_GAP + 2 * MARGIN
    assert_drawn_cleanly(graph)


def test_a_step_sits_one_column_past_the_deepest_step_it_runs_after() -> None:
    """Columns are depths; a column's steps stack in step order; an arrow per dependency."""
    graph = lay_out(DIAMOND)
    assert places(graph) == [(0, 0), (1, 0), (1, 1), (2, 0), (1, 2), (3, 0)]
    assert arrows(graph) == [(0, 1), (0, 2), (1, 3), (2, 3), (0, 4), (0, 5), (3, 5)]
    assert_drawn_cleanly(graph)


def test_an_arrow_past_a_column_runs_between_rows() -> None:
    """f runs after a, two columns back: its arrow leaves the row, so it does not pass behind b
    or d and read as a -> b -> d -> f."""
    graph = lay_out(DIAMOND)
    (skip,) = [e for e in graph.edges if (e.source, e.target) == (0, 5)]
    heights = {round(y) for _, y in points_along(skip.path)}
    assert min(heights) < MARGIN  # the lane above the first row
    assert "H" in skip.path


def test_a_step_listed_before_the_steps_it_runs_after_still_sits_right_of_them() -> None:
    """Step order is not an order of dependencies: columns come from `after` alone."""
    graph = lay_out([("report", ["load", "clean"]), ("clean", ["load"]), ("load", [])])
    assert places(graph) == [(2, 0), (1, 0), (0, 0)]
    assert arrows(graph) == [(2, 0), (1, 0), (2, 1)]
    assert_drawn_cleanly(graph)


def test_steps_that_run_at_the_start_stack_in_one_column() -> None:
    graph = lay_out([("check", []), ("score", []), ("approve", []), ("ship", ["check", "score", "approve"])])
    assert places(graph) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert graph.height == 2 * MARGIN + 3 * NODE_HEIGHT + 2 * (graph.nodes[1].y - graph.nodes[0].y - NODE_HEIGHT)
    assert_drawn_cleanly(graph)


def test_names_the_database_would_refuse_draw_what_they_can() -> None:
    """An unknown step, a repeated one, the step itself and a cycle are left out or placed
    anyway: the drawing never fails the page."""
    graph = lay_out([("a", ["nowhere", "a"]), ("b", ["a", "a"]), ("c", ["d"]), ("d", ["c"])])
    assert arrows(graph) == [(0, 1), (3, 2), (2, 3)]
    assert [n.column for n in graph.nodes] == [0, 1, 0, 0]
    assert lay_out([]) == RunGraph(nodes=[], edges=[], width=2 * MARGIN, height=2 * MARGIN)


def test_a_long_name_is_cut_and_its_column_widens_to_its_longest_name() -> None:
    """Boxes of a column share a width, bounded whatever the name; wide characters count twice."""
    long_name = "reconcile_every_ledger_entry_against_the_bank_statement"
    graph = lay_out([("a", []), ("b", ["a"]), (long_name, ["a"])])
    cut = graph.nodes[2].label
    assert cut.endswith("…") and long_name.startswith(cut[:-1]) and cells(cut) == LABEL_CELLS
    assert graph.nodes[1].width == graph.nodes[2].width > MIN_NODE_WIDTH
    assert graph.nodes[0].width == MIN_NODE_WIDTH
    assert lay_out([("x" * 200, [])]).width == lay_out([("x" * 60, [])]).width
    assert cells(label("請求書" * 20)) <= LABEL_CELLS
    assert label("short") == "short"


def test_a_thousand_steps_lay_out_without_recursion() -> None:
    """A definition holds up to 1,000 steps and 10,000 dependencies: a chain that long (no
    recursion limit met), a graph of every step after the ten before it, and layers lay out."""
    chain = lay_out([(f"step-{i}", None) for i in range(1000)])
    dense = lay_out([(f"step-{i}", [f"step-{j}" for j in range(max(0, i - 10), i)]) for i in range(1000)])
    layers = lay_out(
        [(f"step-{i}", [f"step-{j}" for j in range(i // 10 * 10 - 10, i // 10 * 10)]) for i in range(1000)]
    )
    assert [n.column for n in chain.nodes] == list(range(1000))
    assert len(dense.edges) == 9945
    assert places(layers)[:12] == [(0, r) for r in range(10)] + [(1, 0), (1, 1)]
    assert_drawn_cleanly(layers)


def test_a_step_is_marked_by_what_its_runs_definition_says_it_is() -> None:
    kinds: dict[str, dict[str, Any]] = {
        "sleep": {"nap": "1 hour"}, "signal": {"ok": {"signal": "approved"}}, "map": {"each": "list"},
        "child": {"pay": {"workflow": "card"}},
    }  # fmt: skip
    assert [step_kind(s, kinds) for s in ("nap", "ok", "each", "pay", "list")] == [
        "sleep", "signal", "map", "child", None,
    ]  # fmt: skip
    assert step_kind("nap", None) is None and step_kind("nap", {}) is None


# The page, through Flask's test client


def page_of(client: FlaskClient, run_id: int) -> str:
    response = client.get(f"/runs/{run_id}")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def drawing(html: str) -> ET.Element:
    """The page's SVG, parsed as XML: it must be well-formed for that."""
    match = re.search(r"<svg .*?</svg>", html, re.S)
    assert match, "no drawing on the page"
    return ET.fromstring(match.group(0))


def nodes_of(svg: ET.Element) -> list[ET.Element]:
    return svg.findall(".//g")


def test_the_run_page_draws_its_steps_above_the_table(client: FlaskClient, seeded: Seeded) -> None:
    """The seeded order run (reserve completed, charge discarded, ship pending) as three
    boxes in their states' classes, two arrows, and links to the jobs that exist."""
    html = page_of(client, seeded.failed_run)
    assert html.index('<div class="run-graph"') < html.index('<table class="steps">')
    svg = drawing(html)
    nodes = nodes_of(svg)
    assert [n.get("class") for n in nodes] == ["node state-completed", "node state-discarded", "node state-pending"]
    assert [n.findtext("title") for n in nodes] == [
        "reserve: completed, attempt 1 of 1",
        "charge: discarded, attempt 1 of 1",
        "ship: pending",
    ]
    assert [(p.get("data-from"), p.get("data-to")) for p in svg.findall("path")] == [("1", "2"), ("2", "3")]
    assert [a.get("href") for a in svg.findall("a")] == [
        f"/jobs/{seeded.failed_step - 1}",
        f"/jobs/{seeded.failed_step}",
    ]
    assert (svg.get("width"), svg.get("height")) == (str(3 * 140 + 2 * 44 + 28), str(40 + 28))


def test_a_name_with_markup_is_text_in_the_drawing(client: FlaskClient, conn: psycopg.Connection) -> None:
    """A step named with <, & and both quotes: escaped in the title, the box's text and the
    table, and the SVG still parses to the same name."""
    name = """<b>&"quoted" 'step'"""
    run_id = one(conn, "SELECT treadle.start_workflow('markup', steps => ARRAY[%s, 'after'], queue => 'marks')", name)
    html = page_of(client, run_id)
    assert name not in html
    escaped = "&lt;b&gt;&amp;&#34;quoted&#34; &#39;step&#39;"
    assert f"<title>{escaped}: available, attempt 0 of 25</title>" in html
    assert f'<text class="name" x="24" y="31">{escaped}</text>' in html
    assert f"<td>{escaped}</td>" in html
    first = nodes_of(drawing(html))[0]
    assert first.findtext("title") == f"{name}: available, attempt 0 of 25"
    assert first.findtext("text") == name


def test_a_wait_a_sleep_a_map_and_a_child_step_say_what_they_are(client: FlaskClient, conn: psycopg.Connection) -> None:
    """The kinds the run's definition names: a child run, a sleep, a signal wait, and a map
    step (before it starts too: the definition says so, not its jobs)."""
    one(conn, "SELECT treadle.define_workflow('charge', ARRAY['authorize'])")
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('kinds', steps => ARRAY['pay', 'nap', 'approve', 'ship'], queue => 'kinds',"
        ' after => \'{"ship": ["pay", "nap", "approve"]}\', sleeps => \'{"nap": "1 hour"}\','
        ' waits => \'{"approve": {"signal": "approved"}}\', children => \'{"pay": {"workflow": "charge"}}\','
        ' input => \'{"parcels": [1, 2]}\', maps => \'{"ship": {"input": "parcels"}}\')',
    )
    child = one(conn, "SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", run_id)
    svg = drawing(page_of(client, run_id))
    nodes = nodes_of(svg)
    assert [n.get("class") for n in nodes] == [
        "node state-running kind-child",
        "node state-sleeping kind-sleep",
        "node state-waiting kind-signal",
        "node state-pending kind-map",
    ]
    notes = [n.findall("text")[1].text for n in nodes]
    assert notes == ["running · child", "sleeping · sleep", "waiting · signal", "pending · map"]
    titles = [n.findtext("title") or "" for n in nodes]
    assert titles[0] == f"pay: running, child run #{child}"
    assert titles[1].startswith("nap: sleeping, sleeps until ")
    assert titles[2] == "approve: waiting, waits for signal approved"
    assert titles[3] == "ship: pending, a job per element"
    assert [a.get("href") for a in svg.findall("a")] == [f"/runs/{child}"]  # a child step opens its run
    assert len(nodes[0].findall("rect")) == 2  # a child run's box has another behind it

    assert one(conn, "SELECT treadle.signal(%s, 'approved', '{}')", run_id) == "delivered"
    approve = nodes_of(drawing(page_of(client, run_id)))[2]
    assert approve.get("class") == "node state-completed kind-signal"
    assert approve.findtext("title") == "approve: completed, received signal approved"


def test_a_run_of_three_hundred_steps_renders_in_bounded_size(client: FlaskClient, conn: psycopg.Connection) -> None:
    """30 layers of 10 steps, each step after the whole layer before it (2,900 arrows): the
    page renders and stays under 2 MB, the drawing as wide and tall as its layout."""
    steps = [f"step_{i:03}" for i in range(300)]
    after = {s: steps[i // 10 * 10 - 10 : i // 10 * 10] for i, s in enumerate(steps) if i >= 10}
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('wide', steps => %s, after => %s::jsonb, queue => 'wide')",
        steps,
        json.dumps(after),
    )
    html = page_of(client, run_id)
    assert len(html.encode()) < 2_000_000
    svg = drawing(html)
    assert len(nodes_of(svg)) == 300 and len(svg.findall("path")) == 2900
    graph = lay_out([(s, after.get(s, [])) for s in steps])
    assert (svg.get("width"), svg.get("height")) == (str(graph.width), str(graph.height))
    assert graph.width == 30 * 140 + 29 * 44 + 28 and graph.height == 10 * 40 + 9 * 14 + 28
