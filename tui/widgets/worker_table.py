"""The workers table: one row per worker, keyed by its id, updated in place and sortable."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from warpdeck.engine.api import EngineSnapshot, WorkerView
from warpdeck.tui.glyphs import WORKER_GLYPHS

__all__ = ["COLUMNS", "WorkerTable", "worker_cells"]

#: (column key, title); sorting cycles through these.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "worker"), ("state", "state"), ("age", "heartbeat"), ("phi", "phi"), ("lanes", "lanes busy"),
    ("progress", "batches"), ("util", "util"), ("mem", "memory"), ("done", "done"), ("failed", "failed"),
    ("host", "host · pid"), ("device", "device"),
)


def worker_cells(w: WorkerView) -> dict[str, str]:
    """One worker's cells as text (a heartbeat age of None: the in-process worker, no heartbeat)."""
    badge = WORKER_GLYPHS.get(w.state)
    mem = "—"
    if w.mem_used_mb is not None and w.mem_total_mb:
        mem = f"{w.mem_used_mb / 1024:.1f}/{w.mem_total_mb / 1024:.1f} GiB"
    return {
        "id": w.id, "state": f"{badge.glyph if badge else '?'} {w.state}",
        "age": "in process" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s * 1000:,.0f} ms",
        "phi": "—" if w.phi is None else f"{w.phi:.1f}", "lanes": f"{w.lanes_busy}/{w.lanes}",
        "progress": f"{w.progress:,}", "util": "—" if w.util_pct is None else f"{w.util_pct:.0f}%", "mem": mem,
        "done": f"{w.tasks_done:,}", "failed": f"{w.tasks_failed:,}", "host": f"{w.host} · {w.pid}",
        "device": w.device,
    }


def _sort_key(w: WorkerView, column: str) -> tuple[float, str]:
    numeric = {"age": w.heartbeat_age_s or 0.0, "phi": w.phi or 0.0, "lanes": w.lanes_busy,
               "progress": w.progress, "util": w.util_pct or 0.0, "mem": w.mem_used_mb or 0.0,
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

    def on_mount(self) -> None:
        for key, title in COLUMNS:
            self.add_column(title, key=key)

    def show(self, snap: EngineSnapshot) -> None:
        """Bring the rows in line with the snapshot's workers."""
        seen = {w.id: w for w in snap.workers}
        for gone in set(self._workers) - set(seen):
            self.remove_row(gone)
        for wid, w in seen.items():
            cells = worker_cells(w)
            old = self._workers.get(wid)
            if old is None:
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=wid)
            elif old != w:
                before = worker_cells(old)
                for k, _ in COLUMNS:
                    if cells[k] != before[k]:
                        self.update_cell(wid, k, cells[k])
        self._workers = seen
        self._sort()

    def _sort(self) -> None:
        if len(self._workers) > 1:
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
        """Sort by the next column; returns its title."""
        keys = [k for k, _ in COLUMNS]
        self.sort_column = keys[(keys.index(self.sort_column) + 1) % len(keys)]
        self._sort()
        return dict(COLUMNS)[self.sort_column]
