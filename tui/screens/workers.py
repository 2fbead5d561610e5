"""Workers: state, heartbeat age, phi, lanes busy, progress and device figures per worker, the
control plane they are heard through (broker, connection, what it dropped or refused, how far
behind the monitor hears), and the latest worker changes (lost, hung, waiting, back) with the run's
time of each, so a notification missed is not lost; the list takes no room until there is one.

An attached room that no longer hears its engine (``tui/attach.py``, ``unheard_words``) does not
say ``● connected`` or ``online``: the broker's connection, the workers' states and the monitor's
lag read unknown, with why and what they were last seen as, until telemetry comes again.

The host pools follow (``host_pools_text``): each lane's fill and sink threads, or, where the fill
runs in worker processes (``[host] fill_pool``), each process with its pid, its share of time busy
and the batches it loaded, so an operator can find a busy or stuck loader with ``top -p``.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static
from textual.widgets.data_table import RowDoesNotExist

from warpdeck.engine.api import ControlView, EngineSnapshot, HostProcess, LaneView
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.attach import unheard_words
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.main import MainScreen
from warpdeck.tui.widgets.alert_banner import AlertBanner
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.status_bar import StatusBar
from warpdeck.tui.widgets.worker_table import WorkerTable

__all__ = ["WorkersScreen", "control_summary", "host_pools_text"]


def control_summary(view: ControlView | None, unheard: str | None = None) -> str:
    """One line on the control plane: where it is, whether it is connected, what it counted.
    ``unheard``: why an attached room no longer hears the engine (``no telemetry for 12s``), when it
    does not; the connection and the monitor then read unknown, the counts as last heard."""
    if view is None:
        return "control plane off (--broker none): no heartbeats, no telemetry, no remote commands"
    connection = "● connected" if view.connected else "○ disconnected"
    if unheard is not None:
        connection = f"? unknown: {unheard} (last seen {connection})"
    parts = [f"broker {view.broker or '(starting)'} {connection}"]
    if view.error and not view.connected:
        parts.append(f"last error: {view.error}")
    if view.reconnects:
        parts.append(f"{view.reconnects} reconnect(s)")
    dropped = sum(view.dropped.values())
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(view.dropped.items(), key=lambda kv: -kv[1])[:3])
    parts.append(f"dropped {dropped:,}" + (f" ({reasons})" if dropped else ""))
    refused = sum(view.commands_refused.values())
    parts.append(f"commands {view.commands_applied:,} applied, {refused:,} refused")
    if not view.workers_signed:
        parts.append("worker messages unsigned (no secret): anyone on the broker can forge them")
    # Below 0.1 s the monitor is on time; the line changes only when that changes (a repaint each).
    lag = "monitor on time" if view.input_lag_s < 0.1 else f"monitor hears {view.input_lag_s:.1f} s behind"
    if unheard is not None:
        lag = "monitor unknown"
    holds = view.lag_holds
    if holds:
        lag += f" (verdicts held {'once' if holds == 1 else f'{holds:,} times'})"
    parts.append(lag)
    return "  ·  ".join(parts)


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _pool(threads: int, procs: tuple[HostProcess, ...]) -> str:
    """A host phase's pool in words: its threads, or each of its worker processes."""
    if not procs:
        return _threads(threads)
    each = ", ".join(f"pid {p.pid} {p.busy_share:.0%} {p.batches:,} batches" for p in procs)
    return f"{len(procs)} process{'' if len(procs) == 1 else 'es'}: {each}"


def _lane_ids(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"lane {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"lanes {ids[0]}-{ids[-1]}"
    return "lanes " + ",".join(map(str, ids))


def host_pools_text(lanes: tuple[LaneView, ...]) -> str:
    """Each lane's host pools, a line each: ``lane 0 · fill 4 processes: pid 4312 62% 118 batches,
    … · sink 2 threads``. Lanes that fill and write on threads alike share one line (``lanes 0-7 · …``)."""
    lines: list[str] = []
    alike: dict[tuple[int, int], list[int]] = {}
    for lane in lanes:
        if lane.fill_processes or lane.sink_processes:
            lines.append(f"lane {lane.id} · fill {_pool(lane.fill_workers, lane.fill_processes)} · "
                         f"sink {_pool(lane.sink_workers, lane.sink_processes)}")
        else:
            alike.setdefault((lane.fill_workers, lane.sink_workers), []).append(lane.id)
    threaded = [f"{_lane_ids(ids)} · fill {_threads(fill)} · sink {_threads(sink)}"
                for (fill, sink), ids in alike.items()]
    return "\n".join(threaded + lines)


class WorkersScreen(MainScreen):
    """One row per worker, updated in place."""

    BINDINGS: ClassVar[list[BindingType]] = bindings("workers")

    DEFAULT_CSS = """
    WorkersScreen WorkerTable { height: 1fr; }
    WorkersScreen .summary { height: 1; padding: 0 1; color: $text-muted; }
    /* Wraps rather than being cut: on a narrow terminal it takes two or three lines. */
    WorkersScreen #control-summary { height: auto; }
    WorkersScreen #worker-log { height: auto; padding: 0 1; color: $text-muted; }
    WorkersScreen #host-pools { height: auto; }
    """

    LOG_LINES = 5
    """Worker changes listed under the summaries, newest last (all of them are in ``app.worker_log``)."""

    def __init__(self) -> None:
        super().__init__(name="workers")
        self._control = ""
        self._pools = ""
        self._logged = 0

    def compose(self) -> ComposeResult:
        yield StatusBar("workers")
        yield AlertBanner()
        yield Static("", classes="summary", id="workers-summary")
        yield Static("", classes="summary", id="control-summary")
        yield Static("", classes="summary", id="host-pools")
        log = Static("", id="worker-log")
        log.display = False
        yield log
        yield WorkerTable()
        yield FiguresStrip()
        yield KeyFooter()
        yield PromptBar()

    def on_mount(self) -> None:
        self.watch(warpdeck_app(self), "snapshot", self._changed, init=True)
        self.query_one(WorkerTable).focus()

    def on_screen_resume(self) -> None:
        self._changed(warpdeck_app(self).snapshot)

    def _changed(self, snap: EngineSnapshot | None) -> None:
        if snap is None or not self.is_current:
            return
        unheard = unheard_words(snap.link) if snap.link is not None else None
        self.query_one(WorkerTable).show(snap, unheard)
        states: dict[str, int] = {}
        for w in snap.workers:
            states[w.state] = states.get(w.state, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no workers yet"
        if unheard is not None and snap.workers:
            summary = f"? unknown: {unheard} (last seen {summary})"
        self.query_one("#workers-summary", Static).update(
            Text(f"{len(snap.workers)} worker(s): {summary}  ·  s sorts"))
        control = control_summary(snap.control, unheard)
        if control != self._control:  # an update lays out the line: only when it reads differently
            self._control = control
            self.query_one("#control-summary", Static).update(Text(control))  # a broker's error text: no markup
        pools = host_pools_text(snap.lanes)
        if pools != self._pools:
            self._pools = pools
            self.query_one("#host-pools", Static).update(Text(pools))
        log = warpdeck_app(self).worker_log
        if log.said != self._logged:  # only when a change was added: the list is laid out anew
            self._logged = log.said
            shown = self.query_one("#worker-log", Static)
            # As text, not markup: a note is the cluster's words, and may hold brackets.
            shown.update(Text("\n".join(c.text() for c in log.latest(self.LOG_LINES))))
            shown.display = bool(log)

    def action_sort(self) -> None:
        title = self.query_one(WorkerTable).cycle_sort()
        self.notify(f"workers sorted by {title}", timeout=2)

    async def action_quarantine(self) -> None:
        """Quarantine the highlighted worker, or release it if it is quarantined."""
        table = self.query_one(WorkerTable)
        wid = table.current_id
        app = warpdeck_app(self)
        snap = app.snapshot
        if wid is None or snap is None:
            self.notify("no worker highlighted", severity="warning", timeout=2)
            return
        state = next((w.state for w in snap.workers if w.id == wid), "")
        await app.quarantine(wid, release=state == "quarantined")

    def highlight(self, worker_id: str) -> bool:
        """Move the cursor to a worker's row; False if there is no such worker."""
        table = self.query_one(WorkerTable)
        try:
            table.move_cursor(row=table.get_row_index(worker_id))
        except RowDoesNotExist:  # not a KeyError: ``:worker nope`` once took the app down with it
            return False
        return True
