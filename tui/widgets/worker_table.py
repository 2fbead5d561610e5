"""The workers table: one row per worker, keyed by its id, updated in place and sortable.

The decision this module protects: no cell is ever cut. Each column is as wide as its widest cell
(a cell that grows widens its column), and when the columns are wider than the terminal the
table leaves out whole columns, least important first, and ends in a ``…`` column, instead of
running off the screen's edge mid-cell. The worker, its state and its counts go last.

A second decision: a row never vouches for what the room no longer hears. In an attached room whose
engine is silent (or whose broker is lost), each worker's state reads ``? unknown`` with why and
what it was last seen as, and its live figures (heartbeat, phi, lanes busy, utilisation, memory,
temperature and power) read ``?``; its counts stay, as they were last heard. Before (issue 29) the
rows said ``● online`` with a heartbeat age frozen at 190 ms for as long as the room stayed open.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.widgets import DataTable

from warpdeck.engine.api import EngineSnapshot, WorkerView
from warpdeck.tui.fit import ELLIPSIS, Part, fit_parts
from warpdeck.tui.glyphs import WORKER_GLYPHS

__all__ = ["COLUMNS", "WorkerTable", "worker_cells"]

COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "worker"), ("state", "state"), ("age", "heartbeat"), ("phi", "phi"), ("lanes", "lanes busy"),
    ("progress", "batches"), ("util", "util"), ("mem", "memory"), ("heat", "temp · power"), ("done", "done"),
    ("failed", "failed"), ("host", "host · pid"), ("device", "device"),
)
"""(column key, title); sorting cycles through these."""
_RANK = {"id": 0, "state": 0, "done": 1, "failed": 1, "age": 2, "lanes": 2, "progress": 3, "phi": 3, "util": 4,
         "mem": 4, "heat": 5, "device": 5, "host": 6}
"""Which columns stay when not all fit (0 stays longest)."""
_MORE = "more"  # the key of the ``…`` column that says columns were left out


_LIVE = ("age", "phi", "util", "mem", "heat")
"""The cells a room that no longer hears its engine cannot vouch for: they change while it runs."""


def worker_cells(w: WorkerView, unheard: str | None = None) -> dict[str, str]:
    """One worker's cells as text (a heartbeat age of None: the in-process worker, no heartbeat); a
    worker the engine knows to be waiting says why after its state (``dead · restarting: waiting
    for 1 GPU``). ``unheard``: why the room no longer hears the engine (``no telemetry for 12s``),
    when it does not: the state reads unknown, the live figures ``?`` (see the module's docstring)."""
    cells = _heard_cells(w)
    if unheard is None:
        return cells
    cells["state"] = f"? unknown · {unheard} (last seen {w.state})"
    cells["lanes"] = f"?/{w.lanes}"
    cells.update(dict.fromkeys(_LIVE, "?"))
    return cells


def _heard_cells(w: WorkerView) -> dict[str, str]:
    badge = WORKER_GLYPHS.get(w.state)
    mem = "—"
    if w.mem_used_mb is not None and w.mem_total_mb:
        mem = f"{w.mem_used_mb / 1024:.1f}/{w.mem_total_mb / 1024:.1f} GiB"
    heat = " · ".join(("—" if v is None else f"{v:.0f} {unit}") for v, unit in ((w.temp_c, "°C"), (w.power_w, "W")))
    return {
        "id": w.id, "state": f"{badge.glyph if badge else '?'} {w.state}" + (f" · {w.note}" if w.note else ""),
        "age": "in process" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s * 1000:,.0f} ms",
        "phi": "—" if w.phi is None else f"{w.phi:.1f}", "lanes": f"{w.lanes_busy}/{w.lanes}",
        "progress": f"{w.progress:,}", "util": "—" if w.util_pct is None else f"{w.util_pct:.0f}%", "mem": mem,
        "heat": "—" if w.temp_c is None and w.power_w is None else heat,
        "done": f"{w.tasks_done:,}", "failed": f"{w.tasks_failed:,}", "host": f"{w.host} · {w.pid}",
        "device": w.device,
    }


def _text(cell: str) -> Text:
    """A cell as text: a worker's host, device and note are its own words and may hold brackets,
    which a ``str`` cell would have read as markup (``[/]`` raised, taking the room down)."""
    return Text(cell, no_wrap=True, end="")


def _sort_key(w: WorkerView, column: str) -> tuple[float, str]:
    numeric = {"age": w.heartbeat_age_s or 0.0, "phi": w.phi or 0.0, "lanes": w.lanes_busy,
               "progress": w.progress, "util": w.util_pct or 0.0, "mem": w.mem_used_mb or 0.0, "heat": w.power_w or 0.0,
               "done": w.tasks_done, "failed": w.tasks_failed}
    if column in numeric:
        return (-float(numeric[column]), w.id)
    return (0.0, str(getattr(w, column, w.id)))


class WorkerTable(DataTable[Text | str]):
    """Workers, keyed by id: a new snapshot updates changed cells and adds or removes rows."""

    def __init__(self) -> None:
        super().__init__(id="workers-table", cursor_type="row", zebra_stripes=True)
        self.sort_column = "id"
        self._workers: dict[str, WorkerView] = {}
        self._unheard: str | None = None
        self._shown: dict[str, dict[str, str]] = {}
        """Each row's cells as last shown."""
        self._columns: tuple[str, ...] = ()
        """The column keys the table has now (``_MORE`` last when some were left out)."""

    def on_mount(self) -> None:
        self._set_columns(self._fitting({}))

    def on_resize(self, _event: events.Resize) -> None:
        self._refit()

    def show(self, snap: EngineSnapshot, unheard: str | None = None) -> None:
        """Bring the rows in line with the snapshot's workers; ``unheard``: why the room no longer
        hears the engine, if it does not (``worker_cells``)."""
        seen = {w.id: w for w in snap.workers}
        self._unheard = unheard
        if self._fitting(seen) != self._columns:
            self._workers = seen
            self._refit()
            return
        for gone in set(self._workers) - set(seen):
            self.remove_row(gone)
            self._shown.pop(gone, None)
        for wid, w in seen.items():
            cells = worker_cells(w, unheard)
            before = self._shown.get(wid)
            if before is None:
                self.add_row(*(_text(cells.get(k, "")) for k in self._columns), key=wid)
            elif cells != before:
                for k in self._columns:
                    if k != _MORE and cells[k] != before[k]:
                        self.update_cell(wid, k, _text(cells[k]), update_width=True)  # a wider cell widens its column
            self._shown[wid] = cells
        self._workers = seen
        self._sort()

    def _fitting(self, workers: dict[str, WorkerView]) -> tuple[str, ...]:
        """The columns that fit the table's width with these workers' cells, in table order."""
        pad = 2 * self.cell_padding
        rows = [worker_cells(w, self._unheard) for w in workers.values()]
        parts = [Part(key, pad + max([cell_len(title), *(cell_len(r[key]) for r in rows)]), _RANK[key])
                 for key, title in COLUMNS]
        width = self.scrollable_content_region.width
        if width <= 0:  # not laid out yet
            return tuple(key for key, _ in COLUMNS)
        kept, note = fit_parts(parts, width, note_gap=pad)
        return tuple(p.item for p in kept) + ((_MORE,) if note else ())

    def _refit(self) -> None:
        columns = self._fitting(self._workers)
        if columns != self._columns:
            self._set_columns(columns)

    def _set_columns(self, columns: tuple[str, ...]) -> None:
        """Rebuild the table with these columns (a resize, or a cell too wide for the old ones: a
        few rows, so rebuilding costs little), keeping the cursor on its worker."""
        current = self.current_id
        self.clear(columns=True)
        self._columns = columns
        titles = dict(COLUMNS)
        for key in columns:
            self.add_column(titles.get(key, ELLIPSIS), key=key)
        self._shown = {}
        for wid, w in self._workers.items():
            cells = self._shown[wid] = worker_cells(w, self._unheard)
            self.add_row(*(_text(cells.get(k, "")) for k in columns), key=wid)
        self._sort()
        if current in self._workers:
            self.move_cursor(row=self.get_row_index(current))

    def _sort(self) -> None:
        if len(self._workers) > 1 and "id" in self._columns:  # (a terminal too narrow for even the id: unsorted)
            order = sorted(self._workers.values(), key=lambda w: _sort_key(w, self.sort_column))
            rank = {w.id: i for i, w in enumerate(order)}
            self.sort("id", key=lambda wid: rank.get(str(wid), 0))

    @property
    def current_id(self) -> str | None:
        """The highlighted worker's id (None with no rows)."""
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - Textual raises CellDoesNotExist for a stale cursor
            return None
        return None if key is None else str(key)

    def cycle_sort(self) -> str:
        """Sort by the next column shown; returns its title."""
        keys = [k for k, _ in COLUMNS if k in self._columns] or [k for k, _ in COLUMNS]
        if self.sort_column not in keys:
            keys.append(self.sort_column)
        self.sort_column = keys[(keys.index(self.sort_column) + 1) % len(keys)]
        self._sort()
        return dict(COLUMNS)[self.sort_column]
