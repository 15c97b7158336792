"""The vocabulary and geometry of ShapesWorld, shared by the generator, the parser and the language.

The palette colours are far apart in RGB (the closest pair, yellow and orange, is 70 apart) and are
drawn without antialiasing, so the parser can classify every pixel exactly. Positions are the nine cells
of a 3x3 grid and every object sits inside its own cell, so a cell names at most one object and
"to the left of" is a comparison of columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 60),
    "blue": (30, 80, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 50, 170),
    "orange": (245, 130, 25),
}
COLOURS: tuple[str, ...] = tuple(PALETTE)
BACKGROUND: tuple[int, int, int] = (255, 255, 255)

SIZES: tuple[str, ...] = ("small", "large")

GRID = 3
Cell = tuple[int, int]  # (row, col), 0-based, row 0 at the top
CELLS: tuple[Cell, ...] = tuple((r, c) for r in range(GRID) for c in range(GRID))
POSITIONS: dict[Cell, str] = {
    (0, 0): "top left",
    (0, 1): "top middle",
    (0, 2): "top right",
    (1, 0): "middle left",
    (1, 1): "centre",
    (1, 2): "middle right",
    (2, 0): "bottom left",
    (2, 1): "bottom middle",
    (2, 2): "bottom right",
}
CELL_OF: dict[str, Cell] = {name: cell for cell, name in POSITIONS.items()}

# Below this canvas side a small triangle is too few pixels to tell from a small cross.
MIN_CANVAS = 72


def cell_bounds(length: int, i: int) -> tuple[int, int]:
    """Pixel span [start, stop) of grid row/column `i` along a side of `length` pixels."""
    return (i * length) // GRID, ((i + 1) * length) // GRID


def cell_index(coordinate: float, length: int) -> int:
    """The grid row/column holding a pixel coordinate (the inverse of `cell_bounds`)."""
    for i in range(GRID - 1, -1, -1):
        if coordinate >= cell_bounds(length, i)[0]:
            return i
    return 0


def side_lengths(width: int, height: int) -> dict[str, int]:
    """Bounding-box side of small and large objects for a canvas; odd so that shapes are symmetric."""
    cell = min(width, height) // GRID

    def odd(x: float) -> int:
        n = int(x)
        return n if n % 2 else n - 1

    return {"small": odd(cell * 0.38), "large": odd(cell * 0.65)}


@dataclass(frozen=True)
class WorldObject:
    """One object as the world language can state it: every attribute a sentence may name."""

    shape: str
    colour: str
    size: str
    row: int
    col: int

    @property
    def cell(self) -> Cell:
        return (self.row, self.col)

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]

    def describe(self) -> WorldObject:
        """This object reduced to its stated attributes (drops pixel details of subclasses)."""
        return WorldObject(self.shape, self.colour, self.size, self.row, self.col)


@dataclass(frozen=True)
class Ref:
    """A partial description of an object: what a sentence or a question names about it.

    Unset attributes match anything, so `Ref(shape="circle")` is "a circle", `Ref()` is "an object" and
    `Ref(col=0)` is "an object on the left" (any row).
    """

    shape: str | None = None
    colour: str | None = None
    size: str | None = None
    row: int | None = None
    col: int | None = None

    @classmethod
    def of(cls, obj: WorldObject) -> Ref:
        return cls(obj.shape, obj.colour, obj.size, obj.row, obj.col)

    def matches(self, obj: WorldObject) -> bool:
        return (
            (self.shape is None or self.shape == obj.shape)
            and (self.colour is None or self.colour == obj.colour)
            and (self.size is None or self.size == obj.size)
            and (self.row is None or self.row == obj.row)
            and (self.col is None or self.col == obj.col)
        )

    @property
    def located(self) -> bool:
        return self.row is not None or self.col is not None

    def noun_phrase(self, plural: bool = False) -> str:
        """'large red circle in the top left', 'red objects': the phrase without article or number."""
        words = [w for w in (self.size, self.colour) if w]
        if self.shape:
            words.append(PLURALS[self.shape] if plural else self.shape)
        else:
            words.append("objects" if plural else "object")
        if self.located:
            words.append(position_phrase(self.row, self.col))
        return " ".join(words)

    def with_article(self) -> str:
        """'a large red circle', 'an orange square'."""
        phrase = self.noun_phrase()
        return ("an " if phrase[0] in "aeiou" else "a ") + phrase


_ROW_ONLY = {0: "at the top", 1: "in the middle row", 2: "at the bottom"}
_COL_ONLY = {0: "on the left", 1: "in the middle column", 2: "on the right"}


def position_phrase(row: int | None, col: int | None) -> str:
    """'in the top left' for a cell; 'on the left' / 'at the top' when only the column / row is known."""
    if row is not None and col is not None:
        return f"in the {POSITIONS[(row, col)]}"
    if row is not None:
        return _ROW_ONLY[row]
    if col is not None:
        return _COL_ONLY[col]
    raise ValueError("no position to phrase")


def count_matching(ref: Ref, objects: Sequence[WorldObject]) -> int:
    return sum(ref.matches(o) for o in objects)
