"""Where the run page draws a workflow run's steps and the dependencies between them.

A step's column is its depth: 0 for a step that runs after no other, otherwise one
more than the deepest column of the steps it runs after, so that every arrow points
right. A column's steps are stacked in the run's step order, and a linear list (each
step after the one before it) is one row. Here are the geometry, in whole pixels, and
what kind a step is; the template draws them (_macros.html, run_graph). The drawing's
size follows its layout, boxes keep their size: a run of 1,000 steps makes a large
drawing, which scrolls in its box on the page.
"""

from __future__ import annotations

import math
import unicodedata
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# a step's name and the steps it runs after; None: the step before it (a linear list)
Step = tuple[str, Sequence[str] | None]

NODE_HEIGHT = 40
CHAR_WIDTH = 7.2  # the name's font is 12px monospace: every character is 0.6em wide
PADDING = 10  # between a box's side and its text
MIN_NODE_WIDTH = 140  # room for the second line: a state and a kind, "timed_out · signal"
LABEL_CELLS = 26  # a longer name is cut; the node's title holds all of it
COLUMN_GAP = 44  # the arrows run here
ROW_GAP = 14  # an arrow that passes a column runs along this gap
MARGIN = ROW_GAP  # room for the lane above the first row
NAME_BASELINE = 17  # from a box's top
NOTE_BASELINE = 32


@dataclass(frozen=True)
class Node:
    index: int  # the step's place in the run's list, from 0
    label: str  # its name, cut to fit the box
    column: int
    row: int
    x: int
    y: int
    width: int
    height: int = NODE_HEIGHT

    @property
    def text_x(self) -> int:
        return self.x + PADDING

    @property
    def name_y(self) -> int:
        return self.y + NAME_BASELINE

    @property
    def note_y(self) -> int:
        return self.y + NOTE_BASELINE


@dataclass(frozen=True)
class Edge:
    source: int  # the index of the step that runs first
    target: int  # the index of the step that runs after it
    path: str  # SVG path data, from the right side of source's box to the left side of target's


@dataclass(frozen=True)
class RunGraph:
    nodes: list[Node]  # in step order
    edges: list[Edge]  # by target, then in the order its `after` names them
    width: int
    height: int


def lay_out(steps: Sequence[Step]) -> RunGraph:
    """The boxes and arrows of a run's steps, and the size of the drawing that holds them."""
    needs = dependencies(steps)
    column_of = columns(needs)
    labels = [label(name) for name, _ in steps]

    rows_in: dict[int, int] = {}
    row_of = []
    for column in column_of:
        row_of.append(rows_in.get(column, 0))
        rows_in[column] = row_of[-1] + 1

    # a column is as wide as its widest name, so that its boxes line up
    column_width: dict[int, int] = {}
    for column, text in zip(column_of, labels, strict=True):
        column_width[column] = max(column_width.get(column, 0), box_width(text))
    left = {}
    x = MARGIN
    for column in range(len(column_width)):
        left[column] = x
        x += column_width[column] + COLUMN_GAP

    nodes = [
        Node(
            index=i,
            label=labels[i],
            column=column_of[i],
            row=row_of[i],
            x=left[column_of[i]],
            y=MARGIN + row_of[i] * (NODE_HEIGHT + ROW_GAP),
            width=column_width[column_of[i]],
        )
        for i in range(len(steps))
    ]
    edges = [
        Edge(source, target, edge_path(nodes[source], nodes[target]))
        for target in range(len(steps))
        for source in needs[target]
    ]
    width = x - COLUMN_GAP + MARGIN if nodes else 2 * MARGIN
    height = 2 * MARGIN + max(rows_in.values(), default=0) * (NODE_HEIGHT + ROW_GAP) - (ROW_GAP if nodes else 0)
    return RunGraph(nodes=nodes, edges=edges, width=width, height=height)


def dependencies(steps: Sequence[Step]) -> list[list[int]]:
    """For each step, the indexes of the steps it runs after, in the order it names them.

    A step whose `after` is None runs after the one before it. A name that is not one
    of the steps, or that is named twice, is left out: the database refuses both, and
    the drawing shows what it can rather than fail.
    """
    index = {name: i for i, (name, _) in enumerate(steps)}
    needs = []
    for i, (_, after) in enumerate(steps):
        if after is None:
            needs.append([i - 1] if i > 0 else [])
            continue
        found: list[int] = []
        for name in after:
            j = index.get(name)
            if j is not None and j != i and j not in found:
                found.append(j)
        needs.append(found)
    return needs


def columns(needs: Sequence[Sequence[int]]) -> list[int]:
    """Each step's depth, from the steps it runs after (dependencies' indexes).

    Steps are placed once their dependencies are (Kahn's order), without recursion, so a
    chain of 1,000 steps is no deeper a call than one of two. A step in a cycle (which the
    database refuses) stays in the column its placed dependencies give it.
    """
    dependents: list[list[int]] = [[] for _ in needs]
    unplaced = [len(n) for n in needs]
    for step, own in enumerate(needs):
        for needed in own:
            dependents[needed].append(step)
    column = [0] * len(needs)
    ready = deque(step for step, count in enumerate(unplaced) if count == 0)
    while ready:
        step = ready.popleft()
        for later in dependents[step]:
            column[later] = max(column[later], column[step] + 1)
            unplaced[later] -= 1
            if unplaced[later] == 0:
                ready.append(later)
    return column


def cells(text: str) -> int:
    """How many monospace cells text takes: a wide character (CJK, say) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def label(name: str) -> str:
    """The name as the box shows it: cut to LABEL_CELLS cells, an ellipsis saying so."""
    if cells(name) <= LABEL_CELLS:
        return name
    kept, used = [], 0
    for c in name:
        used += cells(c)
        if used > LABEL_CELLS - 1:
            break
        kept.append(c)
    return "".join(kept) + "…"


def box_width(text: str) -> int:
    return max(MIN_NODE_WIDTH, math.ceil(cells(text) * CHAR_WIDTH) + 2 * PADDING)


def edge_path(source: Node, target: Node) -> str:
    """An arrow's path that crosses no box: between neighbouring columns, a curve within
    the gap between them; past other columns, along the gap between two rows (the one
    on the target's side facing the source), where no box is."""
    x1, y1 = source.x + source.width, source.y + NODE_HEIGHT // 2
    x2, y2 = target.x, target.y + NODE_HEIGHT // 2
    half = COLUMN_GAP // 2
    if target.column == source.column + 1:
        return f"M{x1} {y1}C{x1 + half} {y1} {x2 - half} {y2} {x2} {y2}"
    if source.row > target.row:
        lane = target.y + NODE_HEIGHT + ROW_GAP // 2
    else:
        lane = target.y - ROW_GAP // 2
    out, into = x1 + half, x2 - half
    return f"M{x1} {y1}C{out} {y1} {x1} {lane} {out} {lane}H{into}C{x2} {lane} {into} {y2} {x2} {y2}"


def step_kind(step: str, kinds: Mapping[str, Mapping[str, Any]] | None) -> str | None:
    """What a step of the run is besides a job's handler, as its run's definition says:
    'sleep', 'signal' (a wait), 'map' (a job per element) or 'child' (it starts a run).
    `kinds` maps each of those to the run's column that names its steps (sleeps, waits,
    maps, children); None or a step in none of them: a handler's step."""
    for kind, named in (kinds or {}).items():
        if step in named:
            return kind
    return None
